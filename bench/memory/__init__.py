"""How much memory does the gateway hold under bursts of big pages, and give back? (bench.memory)"""
