"""Scheduling as one pure function: (pending, hosts' GPU snapshots, running, config, now) ->
which jobs start where, and a human reason for every job that waits.

The worker, `gpuq status` (reasons) and, later, the simulator all call `plan`. No files,
no processes, no NVML, no clock here: everything arrives as data.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .config import Config
from .probe import GpuSnapshot
from .spec import CLASS_RANK, JobSpec
from .units import format_mib


@dataclass(frozen=True)
class PendingJob:
    id: str
    user: str
    spec: JobSpec
    queued_at: float
    # Its place in the queue, computed once: every pass sorts thousands of pending jobs.
    order: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", (CLASS_RANK[self.spec.priority_class], -self.spec.priority,
                                           self.queued_at, self.id))


@dataclass(frozen=True)
class RunningJob:
    id: str
    user: str
    host: str
    gpus: tuple[int, ...]
    gpu_mem_mib: int | None            # declared per GPU; None = whole GPU, exclusively
    observed_mib: dict[int, int] = field(default_factory=dict)  # GPU index -> NVML-observed


@dataclass(frozen=True)
class HostView:
    """One live host as the planner sees it: the GPUs it offers and its CPU-only slots."""
    name: str
    gpus: tuple[GpuSnapshot, ...]
    cpu_slots: int


@dataclass(frozen=True)
class Start:
    job_id: str
    host: str
    gpus: tuple[int, ...]


@dataclass
class Plan:
    starts: list[Start]
    reasons: dict[str, str]            # job id -> why it waits (only when explain=True)
    order: list[str]                   # pending job ids in queue order


def queue_key(job: PendingJob) -> tuple:
    """Priority class, then integer priority (higher first), then age, then id."""
    return job.order


@dataclass
class _Gpu:
    host: str
    index: int
    total: int
    usable: int
    jobs: int
    whole_free: bool    # no gpuq job and nothing else beyond the reserve: an exclusive job fits


def usable_mib(gpu: GpuSnapshot, jobs_on_gpu: Iterable[RunningJob], reserve_mib: int) -> int:
    """DESIGN.md memory accounting: NVML's used memory lags a job that started a second ago,
    so every gpuq job counts as max(declared, observed); the rest of `used` belongs to others
    (the reserve covers the driver's own share)."""
    whole = gpu.mem_total_mib - reserve_mib
    gpuq_observed = 0
    gpuq_charged = 0
    for job in jobs_on_gpu:
        observed = job.observed_mib.get(gpu.index, 0)
        declared = whole if job.gpu_mem_mib is None else job.gpu_mem_mib
        gpuq_observed += observed
        gpuq_charged += max(declared, observed)
    others = max(0, gpu.mem_used_mib - gpuq_observed)
    return gpu.mem_total_mib - max(reserve_mib, others) - gpuq_charged


def _gpu_table(hosts: Sequence[HostView], running: Sequence[RunningJob], config: Config) -> list[_Gpu]:
    by_gpu: dict[tuple[str, int], list[RunningJob]] = {}
    for job in running:
        for index in job.gpus:
            by_gpu.setdefault((job.host, index), []).append(job)
    table = []
    for host in hosts:
        for gpu in host.gpus:
            jobs = by_gpu.get((host.name, gpu.index), [])
            usable = usable_mib(gpu, jobs, config.gpu_mem_reserve_mib)
            whole = gpu.mem_total_mib - config.gpu_mem_reserve_mib
            table.append(_Gpu(host.name, gpu.index, gpu.mem_total_mib, max(0, usable), len(jobs),
                              whole_free=not jobs and usable >= whole))
    return table


def plan(pending: Sequence[PendingJob], hosts: Sequence[HostView], running: Sequence[RunningJob],
         config: Config, now: float, explain: bool = True) -> Plan:
    """Decide which pending jobs start on which GPUs, in queue order, best fit first.

    Jobs placed earlier in the pass take their memory out of the table, so two jobs started
    in one pass never overcommit a GPU. A job that cannot fit does not block smaller jobs
    behind it (reservations for the head of the queue come with the scheduling issue).
    """
    del now  # ageing and time windows arrive with the scheduling issue; the seam is here
    gpus = _gpu_table(hosts, running, config)
    cpu_free = {h.name: h.cpu_slots - sum(1 for j in running if j.host == h.name and not j.gpus)
                for h in hosts}
    ordered = sorted(pending, key=queue_key)
    starts: list[Start] = []
    reasons: dict[str, str] = {}
    # Jobs of the same shape fail for the same reason until something starts; cache it.
    failed_shapes: dict[tuple, str] = {}
    for job in ordered:
        spec = job.spec
        shape = (spec.gpus, spec.gpu_mem_mib, spec.hosts)
        if shape in failed_shapes:
            if explain:
                reasons[job.id] = failed_shapes[shape]
            continue
        allowed = [h.name for h in hosts if not spec.hosts or h.name in spec.hosts]
        if spec.gpus == 0:
            host = next((h for h in allowed if cpu_free[h] > 0), None)
            if host is not None:
                cpu_free[host] -= 1
                starts.append(Start(job.id, host, ()))
                failed_shapes.clear()
                continue
            failed_shapes[shape] = _why_cpu(spec, allowed, hosts)
        else:
            choice = _best_fit(spec, [g for g in gpus if g.host in allowed], config)
            if choice is not None:
                for g in choice:
                    g.usable = 0 if spec.exclusive else g.usable - spec.gpu_mem_mib
                    g.jobs += 1
                    g.whole_free = False
                starts.append(Start(job.id, choice[0].host, tuple(g.index for g in choice)))
                failed_shapes.clear()
                continue
            failed_shapes[shape] = _why_gpu(spec, allowed, gpus, hosts, config) if explain else ""
        if explain:
            reasons[job.id] = failed_shapes[shape]
    return Plan(starts, reasons, [j.id for j in ordered])


def _fits(spec: JobSpec, g: _Gpu, config: Config) -> bool:
    if g.jobs >= config.max_jobs_per_gpu:
        return False
    if spec.exclusive:
        return g.whole_free
    return g.usable >= spec.gpu_mem_mib


def _best_fit(spec: JobSpec, gpus: list[_Gpu], config: Config) -> list[_Gpu] | None:
    """The host and GPUs that leave the least memory unused (keeps big holes for big jobs)."""
    best: tuple[int, str, list[_Gpu]] | None = None
    by_host: dict[str, list[_Gpu]] = {}
    for g in gpus:
        if _fits(spec, g, config):
            by_host.setdefault(g.host, []).append(g)
    for host, candidates in by_host.items():
        if len(candidates) < spec.gpus:
            continue
        chosen = sorted(candidates, key=lambda g: (g.usable, g.index))[: spec.gpus]
        need = 0 if spec.exclusive else spec.gpu_mem_mib
        leftover = sum(g.usable - need for g in chosen)
        if best is None or (leftover, host) < (best[0], best[1]):
            best = (leftover, host, chosen)
    return best[2] if best else None


def _hosts_text(spec: JobSpec) -> str:
    return f" among hosts {', '.join(spec.hosts)}" if spec.hosts else ""


def _why_cpu(spec: JobSpec, allowed: list[str], hosts: Sequence[HostView]) -> str:
    if not allowed:
        return f"no live host{_hosts_text(spec) or ''}" + ("" if hosts else " (no worker is running)")
    return f"all CPU-only slots are busy{_hosts_text(spec)}"


def _why_gpu(spec: JobSpec, allowed: list[str], gpus: list[_Gpu], hosts: Sequence[HostView],
             config: Config) -> str:
    need = "a whole GPU" if spec.exclusive else f"{format_mib(spec.gpu_mem_mib)} on {'one GPU' if spec.gpus == 1 else 'each GPU'}"
    count = "" if spec.gpus == 1 else f"{spec.gpus} GPUs on one host, "
    if not allowed:
        if not hosts:
            return "no worker is running"
        return f"no live host{_hosts_text(spec)}"
    mine = [g for g in gpus if g.host in allowed]
    if not mine:
        return f"no GPUs offered{_hosts_text(spec)}"
    per_host = {h: sum(1 for g in mine if g.host == h) for h in allowed}
    widest = max(per_host.values())
    if widest < spec.gpus:
        return f"needs {spec.gpus} GPUs on one host; the most any host offers is {widest}"
    biggest = max(mine, key=lambda g: (g.total, g.host, -g.index))
    if not spec.exclusive and biggest.total - config.gpu_mem_reserve_mib < spec.gpu_mem_mib:
        return (f"needs {need}; the largest GPU holds {format_mib(biggest.total - config.gpu_mem_reserve_mib)}"
                f" usable ({biggest.host}:{biggest.index})")
    roomy = [g for g in mine if g.jobs < config.max_jobs_per_gpu]
    if not roomy:
        return f"every GPU has max_jobs_per_gpu={config.max_jobs_per_gpu} jobs"
    if spec.exclusive:
        free = sum(1 for g in roomy if g.whole_free)
        return f"needs {count}{need}; {free} GPU{'s are' if free != 1 else ' is'} wholly free"
    largest = max(roomy, key=lambda g: (g.usable, g.host, -g.index))
    fitting = {h: sum(1 for g in roomy if g.host == h and g.usable >= spec.gpu_mem_mib) for h in allowed}
    if spec.gpus > 1 and largest.usable >= spec.gpu_mem_mib:
        host, n = max(fitting.items(), key=lambda kv: (kv[1], kv[0]))
        return f"needs {count}{need}; at most {n} such GPU{'s' if n != 1 else ''} on {host}"
    return f"needs {count}{need}; largest usable is {format_mib(largest.usable)} on {largest.host}:{largest.index}"
