"""Imported by the worker processes' fork server alone, the first of workers.PRELOAD: it ignores
SIGTERM, as it ignores SIGINT by itself (multiprocessing.forkserver.main).

A stop sent to the service's whole process group (`kill -TERM -- -PGID`, as make serve and the
GPU bench stop it) would otherwise end the fork server first. Each worker's end is reported to
the pool through the fork server's socket, so its death reads as a worker's: the pool broke and
was replaced, a new fork server and new workers started while the service stopped, and its
stop took seconds longer. The fork server still ends with the service (multiprocessing closes
its pipe as the service exits). The service never imports this module: it would ignore its own
stop.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGTERM, signal.SIG_IGN)
