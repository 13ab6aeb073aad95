"""When a worker's pass runs, as the simulator replays it: the worker's wake rules
(gpuq/host/wake.py, worker/loop.py) turned into moments, so that a replay starts a job when a
worker would. The rules are the worker's; this only reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuq.host.wake import EXIT_WAKE_SCAN_GAP_S, JOBS_WATCH_GAP_S, WATCH_EVERY_S


def same_moment_tolerance(t: float) -> float:
    """Times are floats: within this of `t` they are one moment. A microsecond's billionth, or
    a few steps of the float at t where that is coarser (trace clocks in epoch seconds)."""
    return max(1e-9, 16 * math.ulp(t))


@dataclass(frozen=True)
class PassTiming:
    """A worker's pass moments, for a box whose last pass began at `last` (-inf: none yet)."""

    poll_s: float

    def reads_change(self, last: float, changed: float, after_pass: bool = False) -> float:
        """When the box's next pass that reads jobs/ begins, for a change of jobs/ at `changed`
        and nothing else waking it: its watch's first look after the gap, or its next poll,
        whichever comes first. A box with nothing to do passes every poll interval, so its
        last pass before the change is the latest of those. A pass that begins as a spec is
        dropped reads it; `after_pass`: the change came just after a pass that began at the
        same moment (another box's claim). Never earlier than the change."""
        if last == -math.inf:
            return changed  # no pass seen yet: its phase is unknown
        tol = same_moment_tolerance(changed)
        if changed < last - tol or (after_pass and changed <= last + tol):
            return last + min(JOBS_WATCH_GAP_S, self.poll_s)  # its last pass did not read it
        last += math.floor((changed - last + tol) / self.poll_s) * self.poll_s
        since = changed - last
        if since <= tol:
            return changed
        looks = max(JOBS_WATCH_GAP_S, math.ceil((since - tol) / WATCH_EVERY_S) * WATCH_EVERY_S)
        return max(changed, last + min(looks, self.poll_s))

    @staticmethod
    def end_reads_jobs(last_read: float, now: float) -> bool:
        """Whether a pass woken only by a job's end reads jobs/ (see EXIT_WAKE_SCAN_GAP_S)."""
        return now - last_read >= EXIT_WAKE_SCAN_GAP_S - same_moment_tolerance(now)
