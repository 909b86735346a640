"""The loop guard's benchmark: pages/s and p99 with 1 block in 20 looping, guard on and off
(bench.loops)."""
