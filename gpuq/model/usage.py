"""Usage: GPU-seconds, each weighed down by half every half-life since it ran (Slurm's
PriorityDecayHalfLife), per user. Fair share (sched/fairshare.py) ranks jobs by it; the worker
counts it from the event logs (spool/history.py), the simulator from the jobs its replay ended.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Mapping


def decayed_gpu_s(gpus: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """GPU-seconds run from `start` to `end`, each weighed 2^(-(now - t) / half_life_s)."""
    if end <= start:
        return 0.0
    rate = math.log(2) / half_life_s
    since_end = now - end if now > end else 0.0  # not max(): a pass decays every running job
    since_start = now - start if now > start else 0.0
    return gpus * (math.exp(-rate * since_end) - math.exp(-rate * since_start)) / rate


@dataclass
class UsageLedger:
    """Decayed GPU-seconds of ended jobs, per user. Kept as of `at`; `as_of` brings it forward
    (usage only decays), so adding jobs in the order they end costs O(1) each."""

    half_life_s: float
    at: float = -math.inf
    users: dict[str, float] = field(default_factory=dict)

    def add(self, user: str, gpus: float, start: float, end: float) -> None:
        """A job of `user` held `gpus` from `start` to `end` (at or before the ledger's time
        or after it: the ledger moves to `end` if that is later)."""
        if end > self.at:
            self._move_to(end)
        self.users[user] = self.users.get(user, 0.0) + decayed_gpu_s(gpus, start, end, self.at, self.half_life_s)

    def as_of(self, now: float) -> dict[str, float]:
        """Each user's decayed usage at `now` (not before the last job added)."""
        if now <= self.at or self.at == -math.inf:
            return dict(self.users)
        factor = 2.0 ** (-(now - self.at) / self.half_life_s)
        return {user: value * factor for user, value in self.users.items()}

    def _move_to(self, t: float) -> None:
        if self.at != -math.inf:
            factor = 2.0 ** (-(t - self.at) / self.half_life_s)
            for user in self.users:
                self.users[user] *= factor
        self.at = t


# How long a kind of job runs, learned from its past runs (spool/history.py counts them).
_NUMBERED = re.compile(r"[-_]\d+$")
RUNS_KEPT = 5  # the latest runs of a kind of job an estimate is made from
RUNS_NEEDED = 2  # no estimate from one run


def kind_of(user: str, job_id: str) -> str:
    """Jobs of one kind: one owner's, of one name (`--name train` makes train-1, train-2, ...;
    an array's members are <group>_<index>): the id without its last number."""
    return user + "\t" + _NUMBERED.sub("", job_id)


def estimate(durations: Mapping[str, list[float]], user: str, job_id: str) -> float | None:
    """How long a job is expected to run, from the latest runs of its kind that ended well:
    the longest of them (a backfill that trusts it must not delay the head), once there are
    RUNS_NEEDED; None before."""
    runs = durations.get(kind_of(user, job_id), [])
    return max(runs) if len(runs) >= RUNS_NEEDED else None


def typical(durations: Mapping[str, list[float]], user: str, job_id: str, ran_s: float = 0.0) -> float | None:
    """How long a job of this kind usually runs: the median of its latest runs that ended well
    and lasted longer than `ran_s` (how long this one has run so far: runs of a kind differ by
    orders of magnitude), once RUNS_NEEDED did (a likely start is made from it, never a
    reservation); None before."""
    runs = sorted(r for r in durations.get(kind_of(user, job_id), []) if r > ran_s)
    if len(runs) < RUNS_NEEDED:
        return None
    middle = len(runs) // 2
    return runs[middle] if len(runs) % 2 else (runs[middle - 1] + runs[middle]) / 2
