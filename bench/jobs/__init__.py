"""Document jobs: does a job leave interactive latency alone, and what does it hold in memory?
(bench.jobs)"""
