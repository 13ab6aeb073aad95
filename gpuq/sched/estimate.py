"""When pending jobs will start: the queue replayed forward through the same `plan`, every
running job ending when its time limit runs out (one past it, when its stop's grace does),
and nothing new arriving (as Slurm's `squeue --start` computes it). A job's estimate is a
latest start: jobs usually end before their limits, so it tends to start sooner; a
higher-priority job that arrives meanwhile, or a GPU a person takes, may make it later. A job
the replay cannot start, because a job ahead of it, running or pending, has no time limit
(nor past runs of its kind to learn one from), has no estimate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from gpuq.model.config import Config
from gpuq.model.groups import ARRAY_LIMIT_WAIT
from gpuq.model.jobs import HostView, PendingJob, RunningJob, SetAside, Start
from gpuq.model.usage import estimate, typical
from gpuq.sched.boxroom import asks
from gpuq.sched.plan import plan

MAX_STEPS = 200  # moments replayed at most (each one plan): the estimate's cost is bounded
HORIZON_S = 90 * 86400.0  # nothing later is estimated


def learned_runs(
    pending: Sequence[PendingJob],
    running: Sequence[RunningJob],
    config: Config,
    durations: Mapping[str, list[float]],
    now: float,
) -> tuple[dict[str, float], list[RunningJob]]:
    """For jobs with no time limit (neither the spec's nor config's): how long each pending one
    is expected to run, from its kind's past runs (model/usage.py), for `plan`'s `estimates`;
    and the running jobs, each without a limit given its kind's as one, unless it has already
    run longer (then nobody knows when it ends: the jobs behind it have no estimate)."""
    if config.time_limit_s or not durations:
        return {}, list(running)
    guesses = {}
    for job in pending:
        if not job.spec.time_limit_s and (guess := estimate(durations, job.user, job.id)) is not None:
            guesses[job.id] = guess
    adjusted = [
        replace(r, limit_s=guess, limit_learned=True)
        if r.limit_s is None and (guess := estimate(durations, r.user, r.id)) is not None and r.started_at + guess > now
        else r
        for r in running
    ]
    return guesses, adjusted


def typical_runs(
    pending: Sequence[PendingJob], running: Sequence[RunningJob], durations: Mapping[str, list[float]], now: float
) -> dict[str, float]:
    """How long each job, pending or running, usually runs by its kind's past runs (the median;
    model/usage.py `typical`), for `replay_starts`' `run_for`: the replay in which jobs end as
    they usually do gives the likely start, the one by their limits the latest. A running job
    runs as long as the median of its kind's runs that lasted longer than it has so far; one
    that fewer than two did is left out (it ends by its limit, for all we know)."""
    runs = {}
    for job in pending:
        if (usual := typical(durations, job.user, job.id)) is not None:
            runs[job.id] = usual
    for r in running:
        if (usual := typical(durations, r.user, r.id, ran_s=now - r.started_at)) is not None:
            runs[r.id] = usual
    return runs


# Why a pending job has no expected start (`status --json`: `no_estimate`; START BY shows the word).
UNKNOWN = "unknown"  # it waits behind a job without a time limit
NO_ROOM = "no room"  # no GPU has room for it even once every job it waits behind has ended
LATER = "later"  # not within HORIZON_S: more than 90 days ahead
AFTER_DEPENDENCIES = "after deps"  # it may not start before other jobs end (its dependencies)
AFTER_BEGIN = "after begin"  # it may not start before its begin time (sbatch --begin)
ARRAY_LIMIT = "array limit"  # its array runs as many members as its %N allows: it starts as one ends
WHEN_IDLE = "when idle"  # opportunistic: it starts on GPUs ordinary work leaves idle
NOT_ESTIMATED = "-"  # beyond the rows estimated, or more moments ahead than MAX_STEPS


@dataclass
class Estimate:
    """The replay's answer: when each job it started is expected to start, and why the rest
    have no estimate."""

    starts: dict[str, float] = field(default_factory=dict)
    why_none: dict[str, str] = field(default_factory=dict)


def _without_observed(
    hosts: Sequence[HostView], running: Sequence[RunningJob]
) -> tuple[list[HostView], list[RunningJob]]:
    """The GPUs as they would be without gpuq's jobs' observed memory, and the jobs without it:
    a job the replay ends takes its memory with it. (The plan counts a GPU's used memory
    beyond what its jobs are observed to use as someone else's: left in, a job's memory would
    stay after its end as another's, and the job waiting for its GPU read "no room".)"""
    observed: dict[tuple[str, int], int] = {}
    for job in running:
        for index, mib in (job.observed_mib or {}).items():
            observed[(job.host, index)] = observed.get((job.host, index), 0) + mib
    bare = [
        replace(
            host,
            gpus=tuple(
                replace(g, mem_used_mib=max(0, g.mem_used_mib - observed.get((host.name, g.index), 0)))
                for g in host.gpus
            ),
        )
        for host in hosts
    ]
    return bare, [replace(job, observed_mib={}) for job in running]


def _replayed(
    pending: Sequence[PendingJob], blocked: Mapping[str, str], now: float, why_none: dict[str, str]
) -> list[PendingJob]:
    """The jobs the replay places; why each other one has no estimate goes into `why_none`."""
    waiting = []
    for j in pending:
        if j.opportunistic:  # it yields to ordinary work: a replay of it would say little
            why_none[j.id] = WHEN_IDLE
        elif j.id in blocked:
            begins_later = j.spec.begin_at is not None and j.spec.begin_at > now
            throttled = blocked[j.id].startswith(ARRAY_LIMIT_WAIT)  # spool/eligible.py's reason
            why_none[j.id] = AFTER_BEGIN if begins_later else ARRAY_LIMIT if throttled else AFTER_DEPENDENCIES
        else:
            waiting.append(j)
    return waiting


def replay_starts(
    pending: Sequence[PendingJob],
    hosts: Sequence[HostView],
    running: Sequence[RunningJob],
    config: Config,
    now: float,
    usage: Mapping[str, float] | None = None,
    blocked: Mapping[str, str] | None = None,
    set_aside: Sequence[SetAside] = (),
    estimates: Mapping[str, float] | None = None,
    needs: Callable[[Mapping[str, Any]], str | None] | None = None,
    run_for: Mapping[str, float] | None = None,
) -> Estimate:
    """When each pending job is expected to start at the latest (`starts`, for the jobs the
    replay starts), and why each of the others has no estimate (`why_none`). `estimates`: how
    long jobs without a time limit are expected to run (learned_runs); `needs`: as plan's.
    `run_for`: how long jobs (by id) run in this replay, if not until their limits: the plan
    still sees their limits, as the workers' does, but they leave when these run out
    (typical_runs: the likely start instead of the latest)."""
    estimates = estimates or {}
    run_for = run_for or {}
    result = Estimate()
    waiting = _replayed(pending, blocked or {}, now, result.why_none)
    hosts, running = _without_observed(hosts, running)
    # Low jobs are left out where the plan preempts them when it must (as placement.build_slots
    # hides them), but not one already told to yield: it holds its GPU until its grace runs out.
    active = [r for r in running if not (r.preemptible and config.preemption) or r.stopping]
    # When each job leaves the replay: by its limit (past it, its stop's grace, however late:
    # the plan gives up on one a grace late), or sooner where `run_for` says so.
    leaves = {
        r.id: _leaves(r.gone_by(now, config.grace_s, config.poll_interval), r.started_at, run_for.get(r.id))
        for r in active
    }
    starts = result.starts
    t = now
    left = NOT_ESTIMATED  # what the jobs still waiting when the replay stops are told
    for _ in range(MAX_STEPS):
        if not waiting:
            break
        if t > now + HORIZON_S:
            left = LATER
            break
        decided = plan(
            waiting,
            hosts,
            active,
            config,
            t,
            explain=False,
            set_aside=set_aside,
            usage=usage,
            estimates=estimates,
            needs=needs,
        )
        by_id = {j.id: j for j in waiting}
        for s in decided.starts:
            job = _started(
                by_id[s.job_id], s, t, config.time_limit_s or estimates.get(s.job_id), asks(by_id[s.job_id], config)
            )
            starts[job.id] = t
            leaves[job.id] = _leaves(job.gone_by(t, config.grace_s, config.poll_interval), t, run_for.get(job.id))
            active.append(job)
        if decided.starts:
            started = {s.job_id for s in decided.starts}
            waiting = [j for j in waiting if j.id not in started]
            continue  # the same moment again: a start may let the next job plan anew
        # The next moment anything changes: a running job's limit, a set-aside's (booking's) start or end.
        ends = [leaves[r.id] for r in active if leaves[r.id] > t]
        ends += [e for b in set_aside for e in (b.start, b.end) if e > t]
        if not ends or min(ends) == float("inf"):
            # Nothing known ends: behind a job without a limit, the rest cannot be told; with
            # every job gone, what is left fits nowhere as the GPUs are (too big, a person's
            # process, a cap): the plan's reason says which.
            left = UNKNOWN if any(leaves[r.id] == float("inf") for r in active) else NO_ROOM
            break
        t = min(ends)
        active = [r for r in active if leaves[r.id] > t]
    result.why_none.update(_why_left(waiting, left, hosts, config, now, needs))
    return result


def _why_left(
    waiting: Sequence[PendingJob],
    left: str,
    hosts: Sequence[HostView],
    config: Config,
    now: float,
    needs: Callable[[Mapping[str, Any]], str | None] | None,
) -> dict[str, str]:
    """What the jobs still waiting when the replay stopped are told: `left`; but behind a job
    without a limit (unknown), one that fits nowhere has no room at all."""
    nowhere = {j.id for j in _fits_nowhere(waiting, hosts, config, now, needs)} if left == UNKNOWN else set()
    return {j.id: NO_ROOM if j.id in nowhere else left for j in waiting}


def _fits_nowhere(
    waiting: Sequence[PendingJob],
    hosts: Sequence[HostView],
    config: Config,
    now: float,
    needs: Callable[[Mapping[str, Any]], str | None] | None,
) -> list[PendingJob]:
    """The jobs that would not start even on these hosts emptied (a hand-dropped spec larger
    than any GPU read "unknown", as if a job without a limit kept it waiting). One plan per
    shape of job: a queue holds few."""

    def shape(job: PendingJob) -> tuple:
        spec = job.spec
        runtime = needs(spec.extras) if needs is not None and spec.extras else None
        return (spec.gpus, spec.gpu_mem_mib, spec.exclusive, spec.hosts, runtime, asks(job, config))

    firsts: dict[tuple, PendingJob] = {}
    for job in waiting:
        firsts.setdefault(shape(job), job)
    fits = {k for k, job in firsts.items() if plan([job], hosts, [], config, now, explain=False, needs=needs).starts}
    return [j for j in waiting if shape(j) not in fits]


def _started(job: PendingJob, start: Start, t: float, otherwise_s: float | None, holds: tuple[int, int]) -> RunningJob:
    """A job the replay starts at `t`, running until its limit (or `otherwise_s`: config's
    limit, or what its kind is learned to take), holding `holds` (its cores and host memory)."""
    return RunningJob(
        job.id,
        job.user,
        start.host,
        start.gpus,
        job.spec.gpu_mem_mib,
        started_at=t,
        limit_s=job.spec.time_limit_s or otherwise_s,
        compute_pct=job.spec.gpu_compute_pct,
        cpus=holds[0],
        mem_mib=holds[1],
        grace_s=job.spec.grace_s,
    )


def _leaves(by_limit: float, started_at: float, usual: float | None) -> float:
    """When a job leaves a replay: after its usual run where that is known and comes first."""
    return min(by_limit, started_at + usual) if usual is not None else by_limit
