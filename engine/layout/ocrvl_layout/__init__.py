"""PP-DocLayoutV3 layout detection as an HTTP service with dynamic batching (docs/layout.md).

settings     the flags and OCRVL_LAYOUT_* variables
options      a request's body: images and PaddleX's post-processing overrides
pages        a page's host work, torch-free: its data: URL decoded, resized as PaddleX does,
             its candidates post-processed into boxes
workers      the worker processes that do it off the event loop's process
images       the model's input size and pixel scaling (on the device)
model        transformers' PPDocLayoutV3ForObjectDetection on its device
detections   raw outputs to candidate boxes (transformers' post_process_object_detection)
boxes        a page's candidates and their outlines from the masks (torch-free)
postprocess  candidates to final boxes (PaddleX's layout post-processing)
shapes       a box's outline by layout_shape_mode
batcher      the page queue and the worker that forms batches
metrics      Prometheus metrics
errors       the exception tree, OpenAI-shaped bodies
api          the routes and the lifespan
"""

__version__ = "0.1.0"
