"""Page preprocessing throughput: `python -m bench.preprocess` (see __main__)."""
