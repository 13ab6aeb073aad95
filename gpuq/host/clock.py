"""The clocks a worker pass reads, in one object it is handed: the wall clock (record times,
idleness, heartbeats; shifted in fault tests, faults.wall_time) and the monotonic one (how
long since). A test hands the worker a clock it moves itself, and drives it pass by pass."""

from __future__ import annotations

import time

from gpuq.host.faults import wall_time


class Clock:
    def wall(self) -> float:
        return wall_time()

    def mono(self) -> float:
        return time.monotonic()
