"""The queue's order: priority class, integer priority, then fair share from usage
(model/usage.py: GPU-seconds decayed with a half-life) and how long a job has waited, as
Slurm's multifactor priority weighs them. The ended jobs' usage is given; the running jobs'
so far, and what each user holds now, are added here.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from gpuq.model.config import Config
from gpuq.model.jobs import PendingJob, RunningJob
from gpuq.sched.placement import Slot

# Slurm's documented example weights (PriorityWeightFairshare, PriorityWeightAge) and its
# PriorityMaxAge: fair share outweighs age ten to one, and age counts for up to a week.
FAIR_SHARE_WEIGHT = 10000.0
AGE_WEIGHT = 1000.0
MAX_AGE_S = 7 * 86400.0
AGE_PER_S = AGE_WEIGHT / MAX_AGE_S


def shares(usage: Mapping[str, float], users: Iterable[str], only: Iterable[str] | None = None) -> dict[str, float]:
    """Each user's fair-share factor 2^(-U/S) (Slurm's classic formula): U their part of all
    usage, S their part of the team (equal shares among `users` and those with usage). 1.0 for
    a user who has used nothing; 0.5 for one who used exactly their share. `only`: the factors
    of these users alone (a pass ranks the users with jobs waiting, of a trace's hundreds)."""
    if only is None:
        only = set(users) | set(usage)
        everyone = len(only)
    else:  # only how many: those with usage and the others (not a set of a trace's hundreds each pass)
        everyone = len(usage) + len({u for u in users if u not in usage})
    total = sum(usage.values())
    share = 1.0 / max(1, everyone)
    return {u: 2.0 ** (-(usage.get(u, 0.0) / total if total > 0 else 0.0) / share) for u in only}


def rank_score(fair_share: float, waited_s: float) -> float:
    """Higher runs first: the fair-share factor, and the age factor (a week's wait at most)."""
    return FAIR_SHARE_WEIGHT * fair_share + min(AGE_WEIGHT, max(0.0, waited_s) * AGE_PER_S)


# The queue's order: what fair share weighs for each user, and each pending job's place.


def _gpu_weights(running: Sequence[RunningJob], slots: Sequence[Slot]) -> list[tuple[RunningJob, float]]:
    """Each running job with the GPUs it holds; a shared GPU counts as the share of its memory declared."""
    whole: dict[tuple[str, int], int] | None = None  # made at the first shared GPU: most passes have none
    weighted = []
    for job in running:
        if job.gpu_mem_mib is None:  # its GPUs whole: 1.0 each (the sum of as many 1.0s, exactly)
            weighted.append((job, float(len(job.gpus))))
            continue
        if whole is None:
            whole = {(s.host, s.index): s.whole for s in slots}
        weight = 0.0
        for index in job.gpus:
            w = whole.get((job.host, index)) or 1
            weight += min(1.0, job.gpu_mem_mib / w)
        weighted.append((job, weight))
    return weighted


def gpu_use_by_user(running: Sequence[RunningJob], slots: Sequence[Slot]) -> dict[str, float]:
    """GPUs each user holds now; a shared GPU counts as the share of its memory declared."""
    use: dict[str, float] = {}
    for job, weight in _gpu_weights(running, slots):
        use[job.user] = use.get(job.user, 0.0) + weight
    return use


def effective_usage(
    usage: Mapping[str, float], running: Sequence[RunningJob], slots: Sequence[Slot], config: Config, now: float
) -> dict[str, float]:
    """What fair share weighs for each user: the decayed GPU-seconds of their ended jobs
    (`usage`), those of their running jobs so far, and each GPU they hold now and keep as
    age_step_s more (so one pass's burst of starts counts at once). A job that may be taken
    back (opportunistic, where preemption is on: it yields to anyone's) or is told to stop
    keeps nothing: counted, its owner's jobs ranked one way while it ran and the other the
    moment it yielded, and a GPU held for one job went to another's."""
    effective = dict(usage)
    # decayed_gpu_s(weight, job.started_at, now, now, half-life), its rate computed once a pass and
    # its end's decay (1.0: the job runs now) left out: a deep replay's passes decay 300,000 jobs.
    rate = math.log(2) / config.fair_share_half_life_s
    for job, weight in _gpu_weights(running, slots):
        ran = weight * (1.0 - math.exp(-rate * (now - job.started_at))) / rate if now > job.started_at else 0.0
        keeps = not (job.preemptible and config.preemption) and not job.stopping
        effective[job.user] = effective.get(job.user, 0.0) + ran + (weight * config.age_step_s if keeps else 0.0)
    return effective


def queue_order(
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    slots: Sequence[Slot],
    config: Config,
    now: float,
    usage: Mapping[str, float] | None = None,
) -> list[PendingJob]:
    """Priority class, integer priority (higher first), fair share (the user's decayed
    usage and what they hold now, and how long the job has waited), then age."""
    return [key[-1] for key in sorted(queue_keys(pending, running, slots, config, now, usage or {}))]


def queue_keys(
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    slots: Sequence[Slot],
    config: Config,
    now: float,
    usage: Mapping[str, float],
) -> list[tuple]:
    """Each job's place in the queue as a tuple that sorts, the job last (ids are unique, so
    two jobs are never compared). Built in one comprehension: a pass sorts thousands."""
    if not config.fair_share:
        return [(j.order, j.queued_at, j.id_order, j) for j in pending]
    waiting = {j.user for j in pending}
    factors = shares(effective_usage(usage, running, slots, config, now), waiting, only=waiting)
    # rank_score inlined, its fair-share part once per user: a pass ranks thousands of jobs
    # (a deep queue's replay spent a tenth of its time in the calls).
    fair = {user: FAIR_SHARE_WEIGHT * f for user, f in factors.items()}
    # The age factor as conditional expressions, not min() and max(): two builtin calls per job
    # per pass were a twentieth of a deep queue's replay.
    return [
        (
            j.order,
            -(
                fair[j.user]
                + (
                    0.0
                    if j.queued_at >= now
                    else AGE_WEIGHT
                    if (age := (now - j.queued_at) * AGE_PER_S) > AGE_WEIGHT
                    else age
                )
            ),
            j.queued_at,
            j.id_order,
            j,
        )
        for j in pending
    ]
