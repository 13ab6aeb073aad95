"""Collecting a process's exited children (the spawner's supervisors). A job's own process
tree is its keeper's: host/keeper.py signals its group and ends what it left behind."""

from __future__ import annotations

import os


def reap_children() -> None:
    """Collect every child that has exited, without waiting for the others."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
