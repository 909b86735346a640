"""Documents for `/v1/ocr`: sniff, rasterise, resize and encode pages, then fan them out.

upload      the request: multipart or JSON (base64, data: URL, http(s) URL), and its options
sniff       what the bytes are (magic numbers only; safe on the event loop)
selection   the `pages` option ("1-3,7") and its resolution against a page count
raster      runs in the worker processes: PDF pages (pypdfium2), images (Pillow), bomb checks
resize      PaddleOCR-VL's `smart_resize`, EXIF orientation, RGB, encoding
workers     the process pool the lifespan owns (OCRVL_PREPROCESS_WORKERS)
fanout      pages to the backends through the same relay as chat, bounded per request
otsl        the table model's OTSL tokens as an HTML table
output      the answer: JSON, an NDJSON stream, or markdown
errors      DocumentError, the one error the workers raise (a 400 on `file` or `pages`)
"""
