"""Document jobs: a stored request turned into pages and fed to the relay in the background lane.

    pages     one job's pages, a bounded few at a time, through the relay; each kept once
    runner    the Runner: claims jobs from the store, renews their leases, finishes them, and
              sweeps out what has outlived OCRVL_JOB_TTL
    view      a job and its pages as the API shows them
    webhook   the callback: its address rules, Standard Webhooks signing, delivery with retries
    events    the jobs' metrics and their one access line per event
    commands  `ocrvl ocr --job` and `ocrvl jobs …` (argparse only until used)

The route (app/routes/jobs.py) stores a validated request; any gateway sharing the store runs it.
"""
