"""The planner's picture of every GPU during one pass, and where a job fits in it.

A `Slot` is one GPU: how much memory ordinary work may still take (`free`), how much
opportunistic work may take (`free_opportunistic`: a reservation for an aged job holds a GPU
back from ordinary work only), which running opportunistic jobs could yield it (`victims`),
and how much memory is already on its way out (`draining`: jobs told to stop).
Jobs placed, held or preempted during the pass update the slots, so one pass never
overcommits a GPU and never preempts the same job twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

from .probe import GpuSnapshot

if TYPE_CHECKING:
    from .plan import HostView, RunningJob
    from .spec import JobSpec


def charged_mib(job: "RunningJob", index: int, whole: int) -> int:
    """NVML's used memory lags a job that started a second ago: every gpuq job counts as
    max(declared, observed); a job without gpu_mem holds the whole GPU."""
    declared = whole if job.gpu_mem_mib is None else job.gpu_mem_mib
    return max(declared, job.observed_mib.get(index, 0)) if job.observed_mib else declared


def usable_mib(gpu: GpuSnapshot, jobs_on_gpu: Iterable["RunningJob"], reserve_mib: int) -> int:
    """DESIGN.md memory accounting: the rest of NVML's `used`, beyond what gpuq's jobs are
    observed to use, belongs to others (the reserve covers the driver's own share)."""
    whole = gpu.mem_total_mib - reserve_mib
    gpuq_observed = gpuq_charged = 0
    for job in jobs_on_gpu:
        gpuq_observed += job.observed_mib.get(gpu.index, 0)
        gpuq_charged += charged_mib(job, gpu.index, whole)
    others = max(0, gpu.mem_used_mib - gpuq_observed)
    return gpu.mem_total_mib - max(reserve_mib, others) - gpuq_charged


@dataclass
class Slot:
    host: str
    index: int
    total: int
    whole: int                   # total less the reserve: what an exclusive job gets
    free: int                    # for ordinary work, after this pass's starts and holds
    free_opportunistic: int      # for opportunistic work (aged-job reservations not counted)
    jobs: int
    others_clear: bool           # nothing but gpuq jobs beyond the reserve: exclusive may fit
    idle: bool                   # non-gpuq use below the threshold for idle_after_s
    busy_by_others: bool         # a non-gpuq process uses it now
    victims: list["RunningJob"] = field(default_factory=list)  # opportunistic, not yet stopping
    draining: int = 0            # memory of jobs told to stop, free once they exit
    draining_jobs: int = 0
    blockers: int = 0            # memory of running jobs that are not opportunistic
    oldest_blocker: float = float("inf")  # when the longest-running of them started
    held_for: str | None = None
    booked_for: str | None = None  # a booking on now (bookings.py): only its owner's jobs, and opportunistic ones
    booked_until: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.host}:{self.index}"


def build_slots(hosts: Sequence["HostView"], running: Sequence["RunningJob"], reserve_mib: int,
                now: float, idle_after_s: float) -> list[Slot]:
    by_gpu: dict[tuple[str, int], list["RunningJob"]] = {}
    for job in running:
        for index in job.gpus:
            by_gpu.setdefault((job.host, index), []).append(job)
    slots = []
    for host in hosts:
        idle_map = host.others_idle_since
        for gpu in host.gpus:
            index = gpu.index
            whole = gpu.mem_total_mib - reserve_mib
            idle_since = idle_map.get(index, float("-inf")) if idle_map else float("-inf")
            slot = Slot(host.name, index, gpu.mem_total_mib, whole, 0, 0, 0, True,
                        idle=idle_since is not None and now - idle_since >= idle_after_s,
                        busy_by_others=idle_since is None)
            observed = charged = 0
            for job in by_gpu.get((host.name, index), ()):
                mib = charged_mib(job, index, whole)
                observed += job.observed_mib.get(index, 0) if job.observed_mib else 0
                charged += mib
                slot.jobs += 1
                if job.stopping:
                    slot.draining += mib
                    slot.draining_jobs += 1
                elif job.preemptible:
                    slot.victims.append(job)
                else:
                    slot.blockers += mib
                    slot.oldest_blocker = min(slot.oldest_blocker, job.started_at)
            # As usable_mib: beyond what gpuq's jobs are observed to use, `used` is others'.
            others = max(0, gpu.mem_used_mib - observed)
            slot.free = slot.free_opportunistic = gpu.mem_total_mib - max(reserve_mib, others) - charged
            slot.others_clear = others <= reserve_mib
            slots.append(slot)
    return slots


def need_mib(spec: "JobSpec", slot: Slot) -> int:
    return slot.whole if spec.exclusive else spec.gpu_mem_mib  # type: ignore[return-value]


def fits(spec: "JobSpec", slot: Slot, max_jobs: int, opportunistic: bool) -> bool:
    if slot.jobs >= max_jobs:
        return False
    free = slot.free_opportunistic if opportunistic else slot.free
    if spec.exclusive:
        return slot.jobs == 0 and slot.others_clear and free >= slot.whole
    return free >= spec.gpu_mem_mib  # type: ignore[operator]


def best_fit(spec: "JobSpec", slots: Sequence[Slot], max_jobs: int, opportunistic: bool,
             fragmentation_aware: bool = True) -> list[Slot] | None:
    """The GPUs that leave the least memory unused (big holes stay for big jobs); among
    equals, the host with the fewest wholly free GPUs, so whole hosts stay free for jobs that
    need one (fragmentation-aware)."""
    by_host: dict[str, list[Slot]] = {}
    empty_on: dict[str, int] = {}
    for s in slots:
        if s.jobs == 0 and s.held_for is None:
            empty_on[s.host] = empty_on.get(s.host, 0) + 1
        if fits(spec, s, max_jobs, opportunistic):
            by_host.setdefault(s.host, []).append(s)
    best: tuple | None = None
    for host, candidates in by_host.items():
        if len(candidates) < spec.gpus:
            continue
        free = (lambda s: s.free_opportunistic) if opportunistic else (lambda s: s.free)
        chosen = sorted(candidates, key=lambda s: (free(s), s.index))[: spec.gpus]
        leftover = sum(free(s) - need_mib(spec, s) for s in chosen)
        key = (leftover, empty_on.get(host, 0) if fragmentation_aware else 0, host)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best else None


def take(spec: "JobSpec", chosen: Iterable[Slot], job_id: str, hold: str | None = None) -> None:
    """Charge a started (hold None), held ("hard": nothing else may use the memory) or
    reserved ("soft": opportunistic work still may) job's memory on its slots."""
    for s in chosen:
        need = need_mib(spec, s)
        s.free -= need
        if hold != "soft":
            s.free_opportunistic -= need
        if hold is None:
            s.jobs += 1
        else:
            s.held_for = s.held_for or job_id


def _reclaim(spec: "JobSpec", slot: Slot, rank: int, max_jobs: int) -> tuple[int, int, list] | None:
    """What `slot` needs to yield for the job: (new victims, their MiB, the victims), or None.
    Victims are opportunistic jobs of the same or a lower class, youngest first (least work
    lost); memory already draining counts as free."""
    if slot.held_for is not None or slot.busy_by_others:
        return None
    need = need_mib(spec, slot)
    eligible = sorted((v for v in slot.victims if v.rank >= rank), key=lambda v: -v.started_at)
    if spec.exclusive:
        if not slot.others_clear or len(eligible) != len(slot.victims) or slot.blockers:
            return None
        return len(eligible), sum(charged_mib(v, slot.index, slot.whole) for v in eligible), eligible
    have = slot.free + slot.draining
    chosen: list = []
    for victim in eligible:
        if have >= need:
            break
        have += charged_mib(victim, slot.index, slot.whole)
        chosen.append(victim)
    if have < need or slot.jobs - slot.draining_jobs - len(chosen) >= max_jobs:
        return None
    return len(chosen), have - slot.free - slot.draining, chosen


def preemption_fit(spec: "JobSpec", slots: Sequence[Slot], rank: int,
                   max_jobs: int) -> tuple[list[Slot], list] | None:
    """The GPUs a job can have by preempting the fewest opportunistic jobs (then the least
    memory): the slots and the victims. Only tried once a plain fit failed."""
    by_host: dict[str, list[tuple[tuple[int, int], Slot, list]]] = {}
    for s in slots:
        got = _reclaim(spec, s, rank, max_jobs)
        if got is not None:
            by_host.setdefault(s.host, []).append(((got[0], got[1]), s, got[2]))
    best: tuple | None = None
    for host, options in by_host.items():
        if len(options) < spec.gpus:
            continue
        chosen = sorted(options, key=lambda o: (o[0], o[1].index))[: spec.gpus]
        cost = (sum(o[0][0] for o in chosen), sum(o[0][1] for o in chosen), host)
        if best is None or cost < best[0]:
            best = (cost, chosen)
    if best is None:
        return None
    victims = [v for o in best[1] for v in o[2]]
    return [o[1] for o in best[1]], victims


def reservation(spec: "JobSpec", slots: Sequence[Slot], since: float) -> list[Slot] | None:
    """GPUs to hold back for a job that smaller ones keep overtaking: only GPUs whose jobs in
    the way all started after `since` (they overtook it, and have not run long: job lengths
    are heavy-tailed, so a job that has run long tends to run on, and holding GPUs behind it
    would idle them for as long). Among those, where it will fit soonest as far as anyone can
    tell without knowing how long jobs run: the newest longest-running job in the way, then
    the least memory to free."""
    best: tuple | None = None
    by_host: dict[str, list[Slot]] = {}
    for s in slots:
        could_ever = spec.exclusive or spec.gpu_mem_mib <= s.whole  # type: ignore[operator]
        if s.held_for is None and not s.busy_by_others and could_ever:
            by_host.setdefault(s.host, []).append(s)
    for host, candidates in by_host.items():
        if len(candidates) < spec.gpus:
            continue

        def to_free(s: Slot) -> int:
            if spec.exclusive:
                return s.blockers
            soon = s.free + s.draining + sum(charged_mib(v, s.index, s.whole) for v in s.victims)
            return max(0, need_mib(spec, s) - soon)

        def started(s: Slot) -> float:  # the newest wins; a slot with nothing to free, best
            return s.oldest_blocker if to_free(s) else float("inf")

        chosen = sorted(candidates, key=lambda s: (-started(s), to_free(s), s.index))[: spec.gpus]
        if any(to_free(s) and s.oldest_blocker < since for s in chosen):
            continue  # a job in the way was there before: it may run for weeks
        key = (-min(started(s) for s in chosen), sum(to_free(s) for s in chosen), host)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best else None
