"""The job's process tree, from its supervisor: signalling its group, and ending what it
left behind (its group and the orphans the supervisor adopted as child subreaper)."""

from __future__ import annotations

import os
import signal


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def children() -> list[int]:
    """Our direct children, from /proc (cheap: no scan of every process)."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        import psutil

        return [p.pid for p in psutil.Process().children()]


def kill_leftovers(pgid: int, grace_s: float) -> None:
    """The job has ended: end what it left behind (its group, and orphans we adopted as
    subreaper), as Slurm does at job end, then reap them."""
    try:
        os.killpg(pgid, signal.SIGTERM)
        group_left = True
    except (ProcessLookupError, PermissionError):
        group_left = False
    if not group_left and not children():
        return  # the usual case: nothing left behind
    import psutil  # only here: the usual supervisor never needs it

    leftovers = psutil.Process().children(recursive=True)
    for p in leftovers:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(leftovers, timeout=min(grace_s, 5.0)) if leftovers else ([], [])
    signal_group(pgid, signal.SIGKILL)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    reap_children()


def reap_children() -> None:
    """Collect every child that has exited, without waiting for the others."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
