"""PaddleX's serving API for PaddleOCR-VL (`/layout-parsing`, `/restructure-pages`), translated.

The routes (app/routes/layout_parsing.py) stay thin; PaddleX's names live here and stop here:
the document pipeline (app/documents/) never learns them.

schema      PaddleX's request models (InferRequest, RestructurePagesRequest), field for field;
            the options this server does not run, refused
options     a request's fields as the gateway's own: LayoutOptions, sampling, pixels, the file
pages       in the workers: every page and its size (`dataInfo`), the layout drawn
results     the answer: `prunedResult`, markdown, images, per page; a failure fails the document
restructure a page as PaddleX's result (blocks, JSON); tables merged, titles re-levelled,
            pages concatenated (`restructure_pages`)
tables      BeautifulSoup's reading and writing of a table's HTML, without BeautifulSoup
titles      paragraph titles' levels, scikit-learn's KMeans repeated in plain Python
markdown    a restructured page's markdown through the pipeline's own formatters
returned    the pages a client sends back to `/restructure-pages`, checked
envelope    PaddleX's envelope (`logId`, `errorCode`, `errorMsg`, `result`) on every answer
"""
