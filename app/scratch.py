"""The gateway's scratch files and folders in the temp folder, each named by the process that
made it, and the sweep of those a killed gateway left behind.

`ocrvl-<kind>-<pid>-<random>`: an uploaded document spooled for the page workers (`upload`), a
file on its way into the files store (`file`), a batch's input copy (`lines`), a job's or a
batch's working folder (`job`, `batch`), the preprocessing pool's pixels (`pixels`). Each is
deleted when its work ends; a gateway killed outright (kill -9, the OOM killer) cannot, and the
documents it held would stay on the disk for good: in Kubernetes the gateway's /tmp is an
emptyDir that outlives a restarted container, with a size limit past which the pod is evicted.
So every gateway sweeps the temp folder as its lifespan starts: an entry goes when its process
is gone, or when it bears this process's own pid but is older than this process (a restarted
container's gateway has the same pid again). A live gateway's entries are never touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import time

log = logging.getLogger(__name__)

KINDS = ("upload", "file", "lines", "job", "batch", "pixels")
NAME = re.compile(rf"ocrvl-(?:{'|'.join(KINDS)})-(\d+)-")  # a scratch entry's start: its pid
# Before anything this process makes: its own entries are all younger (time.time() and the
# files' ctime are the same clock).
STARTED = time.time()


def prefix(kind: str) -> str:
    """`ocrvl-KIND-PID-`: the name's start of a scratch file or folder of this process."""
    if kind not in KINDS:  # what the sweep would not know to delete
        raise ValueError(f"no scratch kind {kind!r}: one of {KINDS}")
    return f"ocrvl-{kind}-{os.getpid()}-"


def folder(kind: str) -> str:
    """A new scratch folder of `kind` in the temp folder. Blocking: run it in a thread."""
    return tempfile.mkdtemp(prefix=prefix(kind))


def sweep() -> int:
    """Delete the scratch entries killed gateways left in the temp folder; how many went.
    Blocking: run it in a thread."""
    base, gone = tempfile.gettempdir(), 0
    with os.scandir(base) as entries:
        for entry in entries:
            pid = _pid(entry.name)
            if pid is None or not _left_behind(entry, pid):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):  # gone already; another user's (sticky /tmp)
                    os.unlink(entry.path)
            gone += not os.path.lexists(entry.path)
    if gone:
        log.warning("deleted %d scratch file(s) a gateway killed outright left in %s", gone, base)
    return gone


def _pid(name: str) -> int | None:
    """The pid in a scratch entry's name; None for any other name."""
    found = NAME.match(name)
    return int(found[1]) if found else None


def _left_behind(entry: os.DirEntry[str], pid: int) -> bool:
    """Whether `entry` of process `pid` was left behind: its process gone, or this one's pid
    on an entry older than this process."""
    if pid == os.getpid():
        try:
            return entry.stat(follow_symlinks=False).st_ctime < STARTED
        except FileNotFoundError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # another user's process, alive; no pid at all
        return False
    return False
