"""Fair share from usage (model/usage.py: GPU-seconds decayed with a half-life), and a job's
place among its priority class from it and from how long it has waited (Slurm's multifactor
priority). `plan` adds the running jobs' usage so far to the ended jobs' it is given.
"""

from __future__ import annotations

from typing import Iterable, Mapping

# Slurm's documented example weights (PriorityWeightFairshare, PriorityWeightAge) and its
# PriorityMaxAge: fair share outweighs age ten to one, and age counts for up to a week.
FAIR_SHARE_WEIGHT = 10000.0
AGE_WEIGHT = 1000.0
MAX_AGE_S = 7 * 86400.0


def shares(usage: Mapping[str, float], users: Iterable[str]) -> dict[str, float]:
    """Each user's fair-share factor 2^(-U/S) (Slurm's classic formula): U their part of all
    usage, S their part of the team (equal shares among `users` and those with usage). 1.0 for
    a user who has used nothing; 0.5 for one who used exactly their share."""
    everyone = set(users) | set(usage)
    total = sum(usage.values())
    share = 1.0 / max(1, len(everyone))
    return {u: 2.0 ** (-(usage.get(u, 0.0) / total if total > 0 else 0.0) / share) for u in everyone}


def rank_score(fair_share: float, waited_s: float) -> float:
    """Higher runs first: the fair-share factor, and the age factor (a week's wait at most)."""
    return FAIR_SHARE_WEIGHT * fair_share + AGE_WEIGHT * min(1.0, max(0.0, waited_s) / MAX_AGE_S)
