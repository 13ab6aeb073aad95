"""Test-only fault injection: crash points, and a shifted wall clock.

`GPUQ_TEST_CRASH_AT=<point>[,<point>...]` makes the process that reaches one of those points
kill itself with SIGKILL there, as a power cut or the OOM killer would. Every step from seeing
a spec to recording its exit has a point, named by the process that passes it, and so has each
step of a requeue (reached only after another crash: hence the list). `GPUQ_TEST_CLOCK_SHIFT_S`
moves this host's wall clock (`wall_time`) by that many seconds. `GPUQ_TEST_PAUSE_AT=<point>`
makes it stop itself (SIGSTOP) there instead, as a paused VM would, until a SIGCONT. `GPUQ_TEST_IO_FAULT=site=ERRNO,...`
makes every write at a site fail with that error, as a full or failing disk would: sites are
`write:<dir>` for records and heartbeats (the directory written into: running, finished,
workers, ...), `write:log` for job logs, `write:submit` for the spec `gpuq submit` writes,
and `rename:claim`, where the rename succeeds but
reports ENOENT, as a lost NFS reply does. All are read once, at start.

`GPUQ_TEST_FAULT_LOG=<file>` makes every fault that fires append one line to that file first,
"crash <point> <pid>", "pause <point> <pid>" or "io <site> <ERRNO> <pid>": a test proves its
fault happened, where the outcome alone could also be what a run without the fault gives.
"""

from __future__ import annotations

import errno
import os
import signal
import time

CRASH_ENV = "GPUQ_TEST_CRASH_AT"
CLOCK_SHIFT_ENV = "GPUQ_TEST_CLOCK_SHIFT_S"
IO_FAULT_ENV = "GPUQ_TEST_IO_FAULT"
PAUSE_ENV = "GPUQ_TEST_PAUSE_AT"
FAULT_LOG_ENV = "GPUQ_TEST_FAULT_LOG"

CRASH_POINTS = (
    "worker:planned",  # a spec is parsed and chosen to start; not yet claimed
    "worker:claimed",  # renamed into claims/; no record yet
    "worker:owned",  # the claimed file's owner is checked; no record yet
    "worker:recorded",  # running record written; not yet sent to the spawner
    "worker:sent",  # sent to the spawner; no answer read yet
    "spawner:locked",  # the job lock is taken; no supervisor forked yet
    "supervisor:owned",  # the supervisor holds the lock and its record; no marker yet
    "supervisor:marked",  # `started` marker written; the job is not spawned yet
    "supervisor:exited",  # the job has exited; its result is not written yet
    "supervisor:ended",  # marked as ended (its GPUs free for the worker); the result not written yet
    "supervisor:recorded",  # the finished record is written; the running one not removed
    "supervisor:cleaned",  # records done, local files removed; the worker not yet poked
)
# A requeue of an attempt that never started (worker/recovery.py), after a first crash left one
RECOVERY_CRASH_POINTS = (
    "recovery:held",  # the claim is taken over for the next attempt; the record still says running
    "recovery:recorded",
)  # the attempt is in requeued/, the running record gone; the spec not back yet
# A cancel of a pending job (spool/cancel.py), by a worker or by the spool owner's own CLI
CANCEL_CRASH_POINTS = (
    "cancel:aside",  # the spec is moved aside into finished/; no record yet
    "cancel:recorded",  # the cancelled record is written; the file aside not removed yet
)
# Slurm bridge mode (gpuq/extras/slurm/bridge.py and its tests)
BRIDGE_CRASH_POINTS = (
    "bridge:planned",  # a spec is chosen to hand over; not yet claimed
    "bridge:claimed",  # renamed into claims/; no record yet
    "bridge:recorded",  # running record written; sbatch not run yet
    "bridge:submitted",
)  # sbatch took the job; its Slurm id is not recorded yet

_crash_at = set((os.environ.get(CRASH_ENV) or "").split(",")) - {""}
_pause_at = os.environ.get(PAUSE_ENV)
_clock_shift_s = float(os.environ.get(CLOCK_SHIFT_ENV) or 0.0)
_io_faults = dict(item.split("=", 1) for item in (os.environ.get(IO_FAULT_ENV) or "").split(",") if item)
_fault_log = os.environ.get(FAULT_LOG_ENV)


def _fired(what: str) -> None:
    """One line in the test's fault log, written before the fault acts (O_APPEND: whole lines
    from every process)."""
    if _fault_log:
        fd = os.open(_fault_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, f"{what} {os.getpid()}\n".encode())
        finally:
            os.close(fd)


def crash_point(name: str) -> None:
    if name in _crash_at:
        _fired(f"crash {name}")
        os.kill(os.getpid(), signal.SIGKILL)
    if _pause_at == name:
        _fired(f"pause {name}")
        os.kill(os.getpid(), signal.SIGSTOP)


def wall_time() -> float:
    """time.time(), shifted in tests that give this host a wrong clock."""
    return time.time() + _clock_shift_s


def io_fault(site: str) -> None:
    """Raise the injected error for `site`, if there is one."""
    name = _io_faults.get(site)
    if name is not None:
        code = getattr(errno, name)
        _fired(f"io {site} {name}")
        raise OSError(code, os.strerror(code))
