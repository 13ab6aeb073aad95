"""Usage: GPU-seconds, each weighed down by half every half-life since it ran (Slurm's
PriorityDecayHalfLife), per user. Fair share (sched/fairshare.py) ranks jobs by it; the worker
counts it from the event logs (spool/history.py), the simulator from the jobs its replay ended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def decayed_gpu_s(gpus: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """GPU-seconds run from `start` to `end`, each weighed 2^(-(now - t) / half_life_s)."""
    if end <= start:
        return 0.0
    rate = math.log(2) / half_life_s
    return gpus * (math.exp(-rate * max(0.0, now - end)) - math.exp(-rate * max(0.0, now - start))) / rate


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
