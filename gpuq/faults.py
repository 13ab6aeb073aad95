"""Test-only fault injection: crash points, and a shifted wall clock.

`GPUQ_TEST_CRASH_AT=<point>` makes the process that reaches that point kill itself with
SIGKILL there, as a power cut or the OOM killer would. Every step from seeing a spec to
recording its exit has a point, named by the process that passes it. `GPUQ_TEST_CLOCK_SHIFT_S`
moves this host's wall clock (`wall_time`) by that many seconds. Both are read once, at start.
"""
from __future__ import annotations

import os
import signal
import time

CRASH_ENV = "GPUQ_TEST_CRASH_AT"
CLOCK_SHIFT_ENV = "GPUQ_TEST_CLOCK_SHIFT_S"

CRASH_POINTS = (
    "worker:planned",            # a spec is parsed and chosen to start; not yet claimed
    "worker:claimed",            # renamed into claims/; no record yet
    "worker:recorded",           # running record written; not yet sent to the spawner
    "worker:sent",               # sent to the spawner; no answer read yet
    "spawner:locked",            # the job lock is taken; no supervisor forked yet
    "supervisor:owned",          # the supervisor holds the lock and its record; no marker yet
    "supervisor:marked",         # `started` marker written; the job is not spawned yet
    "supervisor:exited",         # the job has exited; its result is not written yet
    "supervisor:recorded",       # the finished record is written; the running one not removed
    "supervisor:cleaned",        # records done, local files removed; the worker not yet poked
)

_crash_at = os.environ.get(CRASH_ENV)
_clock_shift_s = float(os.environ.get(CLOCK_SHIFT_ENV) or 0.0)


def crash_point(name: str) -> None:
    if _crash_at == name:
        os.kill(os.getpid(), signal.SIGKILL)


def wall_time() -> float:
    """time.time(), shifted in tests that give this host a wrong clock."""
    return time.time() + _clock_shift_s
