"""The results cache on a job whose pages repeat, cache off vs on (bench.cache)."""
