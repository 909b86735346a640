"""Gateway memory under bursts of big pages (`python -m bench.memory`)."""
