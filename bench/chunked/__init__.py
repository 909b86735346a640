"""Gateway memory under chunked bodies over the limit (bench.chunked)."""
