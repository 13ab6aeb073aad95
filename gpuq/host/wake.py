"""Waking a host's worker at once (a job ended, a spec was submitted, a cancel arrived)
through a FIFO in its local directory, instead of waiting for the next poll; and the
queue-wide planning lock that orders the workers' passes.

A worker passes when its poll interval ends, at once when one of its jobs ends or another box
pokes it, and when jobs/ changes: that change is looked for every WATCH_EVERY_S, and no sooner
than JOBS_WATCH_GAP_S after its last pass began. A spec dropped just after a pass thus waits up
to half a second to be read; on a busy team that is most drops. (The simulator replays these
rules: gpuq/extras/sim/timing.py.)"""

from __future__ import annotations

import os
import select
import time
from pathlib import Path
from typing import Sequence

# A change of jobs/ wakes a sleeping worker no sooner than this after its last pass began:
# other boxes' claims change jobs/ too, and must not make every box plan at the watch's pace.
JOBS_WATCH_GAP_S = 0.5
# How often a sleeping worker looks at the mtimes of what it watches (jobs/, the requests
# inbox, its poke file): team members and other boxes cannot reach its wake FIFO.
WATCH_EVERY_S = 0.05
# A burst of short jobs wakes the worker hundreds of times a second; between those wakes
# jobs/ is re-read at most this often (a submit's poke or the poll still reads it at once).
EXIT_WAKE_SCAN_GAP_S = 0.2


def fifo_path(local_dir: Path) -> Path:
    return local_dir / "wake"


# What a poke says: a job ended (GPUs freed), or something in the queue changed (a spec was
# submitted, a cancel arrived). A pass woken only by job ends need not re-read jobs/.
WAKE_JOB_ENDED = b"e"
WAKE_QUEUE_CHANGED = b"q"


def poke(local_dir: Path, reason: bytes = WAKE_QUEUE_CHANGED) -> None:
    """Best effort, never blocks: with no worker listening, its next pass sees the change."""
    try:
        fd = os.open(fifo_path(local_dir), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, reason)
    except OSError:
        pass
    finally:
        os.close(fd)


class WakeFifo:
    """The worker's end: sleep until poked or `timeout` passes."""

    def __init__(self, local_dir: Path) -> None:
        path = fifo_path(local_dir)
        try:
            os.mkfifo(path, 0o600)
        except FileExistsError:
            pass
        # O_RDWR keeps a writer open, so the FIFO never reads as EOF between pokes.
        self.fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)

    def sleep(
        self,
        timeout: float,
        watch: Sequence[Path] = (),
        seen: Sequence[int | None] = (),
        not_before: Sequence[float] = (),
    ) -> bytes:
        """Returns the pokes' reasons, or b"" when the timeout passed without one. A change of
        the mtime of a path in `watch` (the requests inbox, this box's poke file, jobs/) ends
        the sleep too: team members and other boxes cannot reach this FIFO (it lives in the
        worker's private directory), so their news is noticed by mtime, looked at every
        WATCH_EVERY_S. `seen` holds each path's mtime when the pass last read it: news that
        came during the pass ends the sleep at once. `not_before` holds, per path, the
        monotonic time before which its change waits (it ends the sleep then)."""
        deadline = time.monotonic() + timeout
        seen = [mtime_ns(p) if i >= len(seen) or seen[i] is None else seen[i] for i, p in enumerate(watch)]
        after = [not_before[i] if i < len(not_before) else 0.0 for i in range(len(watch))]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return b""
            ready, _, _ = select.select([self.fd], [], [], min(left, WATCH_EVERY_S) if watch else left)
            if ready:
                return self._drain()
            now = time.monotonic()
            if any(now >= a and mtime_ns(p) != m for p, m, a in zip(watch, seen, after)):
                return WAKE_QUEUE_CHANGED

    def _drain(self) -> bytes:
        reasons = b""
        try:
            while chunk := os.read(self.fd, 4096):
                reasons += chunk
        except BlockingIOError:
            pass
        return reasons


def mtime_ns(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


class QueueLock:
    """The queue-wide lock, held while a worker plans and claims. filelock's descriptor lock
    on a file kept open (taking it costs microseconds, every pass). It may not exclude across
    NFS clients and nothing depends on it: after the timeout the pass plans without it."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path, self.timeout_s = path, timeout_s
        self.fd: int | None = None
        self.held = False

    def __enter__(self) -> "QueueLock":
        from filelock import lock_descriptor

        try:
            if self.fd is None:
                # The worker's account's alone: a member who could open it could flock it and
                # slow every pass (the lock is waited for queue_lock_timeout_s).
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                os.fchmod(self.fd, 0o600)
            deadline = time.monotonic() + self.timeout_s
            while not (held := lock_descriptor(self.fd, blocking=False)) and time.monotonic() < deadline:
                time.sleep(0.01)
            self.held = held
        except OSError:
            self.held = False
        return self

    def __exit__(self, *exc: object) -> None:
        from filelock import unlock_descriptor

        if self.held and self.fd is not None:
            unlock_descriptor(self.fd)
            self.held = False
