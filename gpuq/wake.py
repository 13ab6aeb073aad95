"""Waking a host's worker at once (a job ended, a spec was submitted, a cancel arrived)
through a FIFO in its local directory, instead of waiting for the next poll."""
from __future__ import annotations

import os
import select
from pathlib import Path


def fifo_path(local_dir: Path) -> Path:
    return local_dir / "wake"


def poke(local_dir: Path) -> None:
    """Best effort, never blocks: with no worker listening, its next pass sees the change."""
    try:
        fd = os.open(fifo_path(local_dir), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        os.write(fd, b"x")
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

    def sleep(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                while os.read(self.fd, 4096):
                    pass
            except BlockingIOError:
                pass
