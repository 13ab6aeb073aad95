"""`gpuq simulate`: replay a job trace on a virtual clock through the real `plan`.

At every arrival and every end (the moments a worker's pass wakes up for), the pending and
running jobs and the simulated GPUs go to `plan` exactly as a worker would pass them, box by
box: each box acts on its own part of the team's plan (the box an end woke first; a box with
starts for another pokes it, and that one plans again after the first one's starts). Its
starts start, its preemptions stop jobs (each runs on for its grace, then frees its memory
and goes back to the queue at its old place, to restart from the beginning). No decision
uses a job's true duration: only the clock moves by it.

Co-located jobs slow each other: each job runs at min(1, 100 / the load on its GPU), a
multi-GPU job at its slowest GPU's rate. Time-sliced (the default), a job's kernels hold the
whole GPU while they run, so the load is the sum of the utilizations of the jobs there; a
job's utilization is the trace's `gpu_util`, or 100 x its share of a GPU when that is empty.
Under MPS (config gpu_sharing: mps, model/sharing.py) an MPS client's kernels run beside the
others' on at most its compute share of the SMs, and are taken to fill that share: its load
is its utilization x its compute share. MPS clients of different users never share a GPU
(the plan sees to it, as for the workers).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Callable

from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, PendingJob, RunningJob, Start
from gpuq.model.sharing import compute_pct, uses_mps
from gpuq.sched.plan import plan
from gpuq.sim.trace import Cluster, TraceJob

Planner = Callable[[list[PendingJob], list[HostView], list[RunningJob], float], tuple[list[Start], dict[str, str]]]


@dataclass
class _Run:
    job: TraceJob
    start: float
    host: str
    gpus: tuple[int, ...]
    remaining: float  # seconds of work left at rate 1
    rate: float = 1.0
    since: float = 0.0  # when `remaining` was last brought up to date
    version: int = 0  # unique per scheduled end: a superseded end is skipped
    stop_at: float | None = None  # preempted: exits then


@dataclass
class Outcome:
    """What happened to every job, and the integrals the figures need."""

    waits: dict[str, float] = field(default_factory=dict)  # job id -> final start - submit
    ends: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    busy_gpu_s: float = 0.0  # GPU-seconds with a job on the GPU, until the last arrival
    last_submit: float = 0.0
    waiting_s: float = 0.0  # seconds with at least one job pending
    free_while_waiting_gpu_s: float = 0.0  # GPU-seconds wholly free while a job waited
    peak_queue: int = 0
    first_submit: float = 0.0
    gpus: int = 0


def plan_policy(config: Config) -> Planner:
    """gpuq's own planner (or a baseline built from it by config: pack-bestfit)."""

    def decide(pending, hosts, running, now):
        decided = plan(pending, hosts, running, config, now, explain=False)
        return decided.starts, decided.preempts

    return decide


def fifo_exclusive(
    pending: list[PendingJob], hosts: list[HostView], running: list[RunningJob], now: float
) -> tuple[list[Start], dict[str, str]]:
    """What task-spooler and simple_gpu_scheduler do: whole GPUs, one job each, strict FIFO
    (the head of the queue blocks everything behind it), first host that has room."""
    taken = {(r.host, i) for r in running for i in r.gpus}
    starts = []
    for job in sorted(pending, key=lambda j: (j.queued_at, j.id)):
        for host in hosts:
            free = [g.index for g in host.gpus if (host.name, g.index) not in taken]
            if len(free) >= job.spec.gpus:
                chosen = tuple(free[: job.spec.gpus])
                taken.update((host.name, i) for i in chosen)
                starts.append(Start(job.id, host.name, chosen))
                break
        else:
            break
    return starts, {}


def replay(
    jobs: list[TraceJob],
    cluster: Cluster,
    decide: Planner,
    grace_s: float,
    exclusive: bool = False,
    config: Config | None = None,
) -> Outcome:
    """Run the trace to its end; `exclusive`: every job holds its GPUs whole (fifo-exclusive);
    `config`: how jobs share a GPU (gpu_sharing), as the planner's config says."""
    hosts = [
        HostView(
            f"h{h}",
            tuple(GpuSnapshot(i, f"GPU-h{h}-{i}", "sim", cluster.mem_mib, 0) for i in range(cluster.gpus_per_host)),
            0,
        )
        for h in range(cluster.hosts)
    ]
    by_id = {j.id: j for j in jobs}
    out = Outcome(
        first_submit=jobs[0].submit_s, last_submit=jobs[-1].submit_s, gpus=cluster.hosts * cluster.gpus_per_host
    )
    pending: dict[str, PendingJob] = {}
    runs: dict[str, _Run] = {}
    views: dict[str, RunningJob] = {}
    on_gpu: dict[tuple[str, int], set[str]] = {(h.name, g.index): set() for h in hosts for g in h.gpus}
    mps = {j.id for j in jobs if config is not None and not exclusive and uses_mps(j.spec, config)}
    util = {j.id: (100.0 if exclusive else j.util) for j in jobs}
    load_of = {j.id: util[j.id] * (compute_pct(j.spec, cluster.mem_mib) / 100 if j.id in mps else 1.0) for j in jobs}
    ends: list[tuple[float, int, str, int]] = []  # (time, tiebreak, job id, version)
    seq = 0
    next_arrival = 0
    now = jobs[0].submit_s

    def set_rates(gpu_keys: set[tuple[str, int]], t: float) -> None:
        nonlocal seq
        touched = {jid for key in gpu_keys for jid in on_gpu[key]}
        for jid in touched:
            run = runs[jid]
            load = max(sum(load_of[o] for o in on_gpu[(run.host, i)]) for i in run.gpus)
            rate = min(1.0, 100.0 / load) if load > 0 else 1.0
            if run.stop_at is None and rate != run.rate:
                run.remaining -= (t - run.since) * run.rate
                seq += 1
                run.since, run.rate, run.version = t, rate, seq
                heapq.heappush(ends, (t + run.remaining / rate, seq, jid, run.version))

    while next_arrival < len(jobs) or runs:
        t_arrival = jobs[next_arrival].submit_s if next_arrival < len(jobs) else float("inf")
        while ends and (ends[0][2] not in runs or runs[ends[0][2]].version != ends[0][3]):
            heapq.heappop(ends)  # superseded by a rate change or a preemption
        t_end = ends[0][0] if ends else float("inf")
        t = min(t_arrival, t_end)
        _integrate(out, hosts, on_gpu, pending, now, t)
        now = t
        freed: set[tuple[str, int]] = set()
        while ends and ends[0][0] <= now:
            _, _, jid, version = heapq.heappop(ends)
            run = runs.get(jid)
            if run is None or run.version != version:
                continue
            del runs[jid], views[jid]
            for i in run.gpus:
                on_gpu[(run.host, i)].discard(jid)
                freed.add((run.host, i))
            if run.stop_at is not None:  # preempted: back to its old place, to start over
                job = by_id[jid]
                pending[jid] = PendingJob(jid, job.user, job.spec, job.submit_s)
            else:
                out.ends[jid] = now
        while next_arrival < len(jobs) and jobs[next_arrival].submit_s <= now:
            job = jobs[next_arrival]
            pending[job.id] = PendingJob(job.id, job.user, job.spec, job.submit_s)
            next_arrival += 1
        out.peak_queue = max(out.peak_queue, len(pending))
        if freed:
            set_rates(freed, now)
        if not pending and not freed:
            continue
        # Each box's worker plans over the whole team and acts on its own part (worker/loop.py);
        # the box an end woke goes first, and a box that finds starts for others pokes them,
        # and they plan again after its starts.
        woken = sorted({h for h, _ in freed})
        order = woken + [h.name for h in hosts if h.name not in woken]
        for _ in range(2 * len(hosts)):
            starts, preempts = decide(list(pending.values()), hosts, list(views.values()), now)
            boxes = {s.host for s in starts} | {runs[v].host for v in preempts}
            if not boxes:
                break
            box = next(h for h in order if h in boxes)
            changed: set[tuple[str, int]] = set()
            for victim in preempts:
                run = runs[victim]
                if run.host == box and run.stop_at is None:
                    seq += 1
                    run.stop_at, run.version = now + grace_s, seq
                    views[victim] = replace(views[victim], stopping=True)
                    out.preemptions += 1
                    heapq.heappush(ends, (run.stop_at, seq, victim, run.version))
            for s in starts:
                if s.host != box:
                    continue
                job = by_id[s.job_id]
                del pending[s.job_id]
                out.waits[s.job_id] = now - job.submit_s
                seq += 1
                runs[s.job_id] = _Run(job, now, s.host, s.gpus, job.duration_s, since=now, version=seq)
                views[s.job_id] = RunningJob(
                    s.job_id,
                    job.user,
                    s.host,
                    s.gpus,
                    job.spec.gpu_mem_mib,
                    preemptible=job.spec.preemptible,
                    priority_class=job.spec.priority_class,
                    started_at=now,
                    mps=s.job_id in mps,
                    compute_pct=job.spec.gpu_compute_pct,
                )
                for i in s.gpus:
                    on_gpu[(s.host, i)].add(s.job_id)
                    changed.add((s.host, i))
                heapq.heappush(ends, (now + job.duration_s, seq, s.job_id, seq))
            if changed:
                set_rates(changed, now)
            if boxes == {box}:
                break  # nothing for the other boxes: planning again would find them nothing
    return out


def _integrate(out: Outcome, hosts: list[HostView], on_gpu: dict, pending: dict, t0: float, t1: float) -> None:
    dt = t1 - t0
    if dt <= 0:
        return
    busy = sum(1 for jobs in on_gpu.values() if jobs)
    # Occupancy is measured while work arrives: the drain after the last arrival (a few long
    # jobs alone) would make a policy that finishes more work look emptier.
    out.busy_gpu_s += busy * max(0.0, min(t1, out.last_submit) - t0)
    if pending:
        out.waiting_s += dt
        out.free_while_waiting_gpu_s += (len(on_gpu) - busy) * dt
