"""`slurm-easy`: the replay's anchor, what a team running Slurm would get, built from Slurm's
own documentation of sched/backfill and priority/multifactor, independently of gpuq's plan.

- Whole GPUs on one node; a job goes to the best-fitting node (the fewest free GPUs that
  still hold it).
- Priority = 1000 x age factor (age / 7 days, capped at 1) + 10000 x fair-share factor
  2^(-U/S): U is the user's share of all usage, each GPU-second decayed with a 7-day
  half-life (PriorityDecayHalfLife), S the user's share of the cluster (equal shares).
- EASY backfill: jobs start in priority order; the first that cannot start (the head) gets a
  reservation, the earliest moment the running jobs' time limits free enough GPUs on one node;
  a later job starts only if it cannot delay it: it ends (by its limit) before then, or it
  runs on another node, or on the reserved node's GPUs the head will not need.
- At most 500 jobs are tested a pass (bf_max_job_test).

Usage is what ran, as Slurm's accounting records it: each job's GPUs from its start to its
end (the replay knows the end of a job that left between two passes from its duration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuq.extras.sim.trace import TraceJob
from gpuq.model.jobs import HostView, PendingJob, Plan, RunningJob, Start

AGE_WEIGHT = 1000.0
FAIR_SHARE_WEIGHT = 10000.0
MAX_AGE_S = 7 * 86400.0
HALF_LIFE_S = 7 * 86400.0
MAX_JOBS_TESTED = 500


@dataclass
class _Held:
    user: str
    gpus: int
    accounted_to: float  # usage is counted up to here
    ends_at: float  # started_at + its duration: when it leaves, if between two passes


class SlurmEasy:
    """The policy, with the usage it has accounted so far (a replay calls it at increasing times)."""

    def __init__(self, jobs: list[TraceJob], half_life_s: float = HALF_LIFE_S) -> None:
        self.by_id = {j.id: j for j in jobs}
        self.share = 1.0 / max(1, len({j.user for j in jobs}))  # equal shares among the trace's users
        self.decay_rate = math.log(2) / half_life_s
        self.usage: dict[str, float] = {}  # decayed GPU-seconds, as of self.at
        self.at = -math.inf
        self.held: dict[str, _Held] = {}
        self.started: dict[str, float] = {}  # this policy's starts since the last pass, and when

    def __call__(
        self,
        pending: list[PendingJob],
        hosts: list[HostView],
        running: list[RunningJob],
        now: float,
        usage: dict[str, float] | None = None,
    ) -> Plan:
        """`usage`: the replay's own ledger, not used: this policy keeps Slurm's accounting itself."""
        self._account(pending, running, now)
        total = sum(self.usage.values())

        def priority(job: PendingJob) -> tuple[float, float, str]:
            age = min(1.0, max(0.0, now - job.queued_at) / MAX_AGE_S)
            used = self.usage.get(job.user, 0.0) / total if total > 0 else 0.0
            return (-(AGE_WEIGHT * age + FAIR_SHARE_WEIGHT * 2.0 ** (-used / self.share)), job.queued_at, job.id)

        free = {h.name: [g.index for g in h.gpus] for h in hosts}
        ends: dict[str, list[tuple[float, int]]] = {h.name: [] for h in hosts}  # (expected end, GPUs)
        for r in running:
            taken = set(r.gpus)
            free[r.host] = [i for i in free[r.host] if i not in taken]
            ends[r.host].append((max(now, r.started_at + self.by_id[r.id].time_limit_s), len(r.gpus)))
        widest = max((len(h.gpus) for h in hosts), default=0)
        starts: list[Start] = []
        shadow: tuple[float, str, int] | None = None  # the head's reservation: (when, node, GPUs to spare there)
        for tested, job in enumerate(sorted(pending, key=priority)):
            if tested >= MAX_JOBS_TESTED:
                break
            need, limit = job.spec.gpus, self.by_id[job.id].time_limit_s
            if need > widest:
                continue  # no node could ever hold it
            fits = [h for h in free if len(free[h]) >= need]
            if shadow is not None:
                when, node, spare = shadow
                if now + limit > when:  # it would still run when the head is due to start
                    fits = [h for h in fits if h != node or need <= spare]
            if not fits:
                if shadow is None:
                    shadow = _reservation(need, free, ends, now)
                continue
            host = min(fits, key=lambda h: (len(free[h]), h))  # best fit
            if shadow is not None and host == shadow[1] and now + limit > shadow[0]:
                shadow = (shadow[0], shadow[1], shadow[2] - need)
            chosen, free[host] = tuple(free[host][:need]), free[host][need:]
            ends[host].append((now + limit, need))
            starts.append(Start(job.id, host, chosen))
            self.started[job.id] = now
        return Plan(starts, {}, [])

    def _account(self, pending: list[PendingJob], running: list[RunningJob], now: float) -> None:
        """Bring each user's decayed usage up to `now`: what ran since the last pass counts,
        weighed by how long ago it ran."""
        if now <= self.at:
            return
        rate = self.decay_rate
        if self.at > -math.inf:
            factor = math.exp(-rate * (now - self.at))
            for user in self.usage:
                self.usage[user] *= factor
        current = {r.id: r for r in running}
        waiting = {p.id for p in pending}
        for jid, started in self.started.items():  # started by a pass, and gone before this one
            if jid not in current and jid not in waiting and jid not in self.held:
                job = self.by_id[jid]
                self.held[jid] = _Held(job.user, job.spec.gpus, started, started + job.duration_s)
        self.started.clear()
        for jid, r in current.items():
            if jid not in self.held:
                self.held[jid] = _Held(r.user, len(r.gpus), r.started_at, r.started_at + self.by_id[jid].duration_s)
        for jid, held in list(self.held.items()):
            until = now if jid in current else min(now, max(held.accounted_to, held.ends_at))
            if until > held.accounted_to:  # the integral of gpus x e^(-rate (now - s)) over the span
                weight = (math.exp(-rate * (now - until)) - math.exp(-rate * (now - held.accounted_to))) / rate
                self.usage[held.user] = self.usage.get(held.user, 0.0) + held.gpus * weight
            held.accounted_to = until
            if jid not in current:
                del self.held[jid]
        self.at = now


def _reservation(
    need: int, free: dict[str, list[int]], ends: dict[str, list[tuple[float, int]]], now: float
) -> tuple[float, str, int] | None:
    """The earliest moment the running jobs' limits leave `need` GPUs free on one node, that
    node (the best fit among those free then), and the GPUs it will have to spare."""
    best: tuple[float, int, str] | None = None
    for host, gpus in free.items():
        count, when = len(gpus), now
        for end, n in sorted(ends[host]):
            if count >= need:
                break
            count, when = count + n, end
        if count >= need and (best is None or (when, count) < best[:2]):
            best = (when, count, host)
    if best is None:
        return None
    return best[0], best[2], best[1] - need
