"""Documents for `/v1/ocr`: sniff, rasterise, resize and encode pages, then fan them out.

upload      the request: multipart or JSON (base64, data: URL, http(s) URL), and its options
sniff       what the bytes are (magic numbers only; safe on the event loop)
selection   the `pages` option ("1-3,7") and its resolution against a page count
raster      runs in the worker processes: PDF pages (pypdfium2), images (Pillow), bomb checks
resize      PaddleOCR-VL's `smart_resize`, EXIF orientation, RGB, encoding
workers     the process pool the lifespan owns (OCRVL_PREPROCESS_WORKERS), and the laid-out
            pages' pixels it holds between their worker calls (OCRVL_PREPROCESS_HELD_BYTES)
job         what to read (OcrJob) and each page's answer (PageResult): fanout and parsing share them
fanout      pages to the backends through the same relay as chat, bounded per request
digests     runs in the worker processes: a page's content hash, for the results cache
cache       the results cache as pages consult it: a page's key, its answer kept and read back
streams     each page's and block's answer asked as a stream and watched for loops (retry too)
loops       the loop detector: does an answer's tail repeat one unit, and where to cut it
otsl        the table model's OTSL tokens as an HTML table
output      the answer: JSON, an NDJSON stream, or markdown
page_markdown  one page's markdown, as the server and `ocrvl ocr` both write it
errors      DocumentError, the one error the workers raise (a 400 on `file` or `pages`)

The layout pipeline (a page read block by block, as PaddleX's PaddleOCR-VL pipeline reads it):
raster → layouts → blocks/crops → relay → answers/markdown, driven by `parsing`.

layout_options  `layout` and its overrides, checked (PaddleOCR-VL-1.5's defaults)
layouts     the layout service's client: probed, balanced, its errors a 503 or 502
blocks      PaddleX's rules after the layout model: overlaps, merging, prompts (pure)
masks       a polygon's pixels (OpenCV's fillPoly), in pure Python
polygons    polygon overlaps (shapely's), in pure Python
crops       in the workers: each block's crop, masked, merged, trimmed, guarded, encoded
answers     a block's answer as PaddleX keeps it (loops cut, math, tables as HTML)
markdown    in the workers: the page's block list and markdown, as PaddleX assembles them
parsing     one page through the pipeline; each block one request through the relay
"""
