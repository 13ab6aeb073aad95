"""Scheduling as one pure function: (pending, hosts' GPU snapshots, running, config, now) ->
which jobs start where, which opportunistic jobs must yield, what is held for whom, and a
human reason for every job that waits.

The worker, `gpuq status` (reasons) and `gpuq simulate` all call `plan`. No files, no
processes, no NVML, no clock here: everything arrives as data. README "Scheduling" says
the rules in users' words; placement.py holds the per-GPU arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from . import placement, reasons
from .config import Config
from .placement import Slot
from .probe import GpuSnapshot
from .spec import CLASS_RANK, JobSpec
from .windows import describe, window_open

if TYPE_CHECKING:
    from .bookings import Booking


@dataclass(frozen=True)
class PendingJob:
    id: str
    user: str
    spec: JobSpec
    queued_at: float
    # The static part of its place in the queue, computed once: every pass sorts thousands.
    order: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", (CLASS_RANK[self.spec.priority_class], -self.spec.priority))

    @property
    def opportunistic(self) -> bool:
        return self.spec.preemptible


@dataclass(frozen=True)
class RunningJob:
    id: str
    user: str
    host: str
    gpus: tuple[int, ...]
    gpu_mem_mib: int | None            # declared per GPU; None = whole GPU, exclusively
    observed_mib: dict[int, int] = field(default_factory=dict)  # GPU index -> NVML-observed
    preemptible: bool = False
    priority_class: str = "normal"
    started_at: float = 0.0
    stopping: bool = False             # told to stop: its memory is on its way out

    @property
    def rank(self) -> int:
        return CLASS_RANK[self.priority_class]

    @classmethod
    def of(cls, record: Any, observed: dict[int, int], stopping: bool, host: str = "") -> "RunningJob":
        """From a running Record (spool.py), as the worker and `gpuq status` both see it."""
        spec = record.spec
        return cls(record.id, record.user, record.host or host, tuple(record.gpus), spec.get("gpu_mem_mib"),
                   observed, preemptible=bool(spec.get("preemptible")),
                   priority_class=spec.get("priority_class", "normal"),
                   started_at=record.claimed_at or 0.0, stopping=stopping)


@dataclass(frozen=True)
class HostView:
    """One live host as the planner sees it: the GPUs it offers, its CPU-only slots, and
    since when each GPU has been free of non-gpuq use (None: in use now; absent: always)."""
    name: str
    gpus: tuple[GpuSnapshot, ...]
    cpu_slots: int
    others_idle_since: Mapping[int, float | None] = field(default_factory=dict)
    runtimes: frozenset[str] | None = None  # container runtimes it has (None: not probed, any)


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
    preempts: dict[str, str] = field(default_factory=dict)   # running job id -> why it yields
    held: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # job -> GPUs held


def gpu_use_by_user(running: Sequence[RunningJob], slots: Sequence[Slot]) -> dict[str, float]:
    """GPUs each user holds now; a shared GPU counts as the share of its memory declared."""
    whole = {(s.host, s.index): s.whole for s in slots}
    use: dict[str, float] = {}
    for job in running:
        for index in job.gpus:
            w = whole.get((job.host, index)) or 1
            use[job.user] = use.get(job.user, 0.0) + (1.0 if job.gpu_mem_mib is None else min(1.0, job.gpu_mem_mib / w))
    return use


def queue_order(pending: Sequence[PendingJob], use: Mapping[str, float], config: Config,
                now: float) -> list[PendingJob]:
    """Priority class, integer priority (higher first), fair share (the user's GPUs in use,
    less one per age_step_s waited, so nothing starves), then age."""
    if not config.fair_share:
        return sorted(pending, key=lambda j: (j.order, j.queued_at, j.id))
    step = config.age_step_s
    return sorted(pending, key=lambda j: (j.order, use.get(j.user, 0.0) - (now - j.queued_at) / step,
                                          j.queued_at, j.id))


def plan(pending: Sequence[PendingJob], hosts: Sequence[HostView], running: Sequence[RunningJob],
         config: Config, now: float, explain: bool = True, blocked: Mapping[str, str] | None = None,
         bookings: Sequence["Booking"] = ()) -> Plan:
    """Decide, in queue order, which pending jobs start on which GPUs (best fit), which GPUs
    are held for jobs that cannot start yet, and which opportunistic jobs must yield.
    `blocked`: jobs that may not start whatever the GPUs (dependencies), with the reason.
    `bookings`: GPUs set aside for a person while they are on (bookings.py)."""
    blocked = blocked or {}
    slots = placement.build_slots(hosts, running, config.gpu_mem_reserve_mib, now, config.idle_after_s)
    booked = _apply_bookings(slots, bookings, now)
    use = gpu_use_by_user(running, slots)
    ordered = queue_order(pending, use, config, now)
    in_window = window_open(config.idle_windows, now)
    result = Plan([], {}, [j.id for j in ordered])
    _yield_to_people_and_windows(running, slots, in_window, config, result, booked)
    cpu_free = {h.name: h.cpu_slots - sum(1 for j in running if j.host == h.name and not j.gpus) for h in hosts}
    held_gpus = {u: 0 for u in use}
    for job in running:
        held_gpus[job.user] = held_gpus.get(job.user, 0) + len(job.gpus)
    # Jobs of one shape fail for the same reason until something starts; remembered per pass.
    failed: dict[tuple, str] = {}
    # Waiting jobs seen so far (the queue is in (class, priority) order): "behind N higher-priority jobs".
    behind = {"order": (), "before": 0, "same": 0}

    def waits(job: PendingJob, reason: str) -> None:
        if job.order != behind["order"]:
            behind.update(order=job.order, before=behind["before"] + behind["same"], same=0)
        n = behind["before"]
        result.reasons[job.id] = reason + (f"; behind {n} higher-priority job{'s' if n != 1 else ''}" if n else "")
        behind["same"] += 1
    reserved = False  # one reservation for an aged job per pass: the head's
    reclaimable = config.preemption and any(s.victims or s.draining for s in slots)

    def no_room() -> bool:  # then nothing further can start or preempt: the rest only needs reasons
        return not reclaimable and not any(n > 0 for n in cpu_free.values()) and not any(
            s.free_opportunistic > 0 and s.jobs < config.max_jobs_per_gpu for s in slots)

    full = no_room()
    for job in ordered:
        if full and not explain:
            break
        if job.id in blocked:
            if explain:
                waits(job, blocked[job.id])
            continue
        spec = job.spec
        runtime = (spec.container.runtime or config.container_runtime) if spec.container else None
        shape = (spec.gpus, spec.gpu_mem_mib, spec.hosts, job.opportunistic, job.order[0],
                 job.user if booked else None, runtime)
        cap = config.max_gpus_per_user
        if cap is not None and spec.gpus and held_gpus.get(job.user, 0) + spec.gpus > cap:
            if explain:
                waits(job, f"at user cap {held_gpus.get(job.user, 0)}/{cap} GPUs")
            continue
        if shape in failed:
            if explain:
                waits(job, failed[shape])
            continue
        allowed = [h.name for h in hosts if (not spec.hosts or h.name in spec.hosts)
                   and (runtime is None or h.runtimes is None or runtime in h.runtimes)]
        if runtime is not None and not allowed and (lacking := [h for h in hosts if not spec.hosts or h.name in spec.hosts]):
            failed[shape] = reasons.why_runtime(runtime, lacking)
        elif spec.gpus == 0:
            host = next((h for h in allowed if cpu_free[h] > 0), None)
            if host is not None:
                cpu_free[host] -= 1
                result.starts.append(Start(job.id, host, ()))
                failed.clear()
                continue
            failed[shape] = reasons.why_cpu(spec, allowed, hosts)
        else:
            mine = [s for s in slots if s.host in allowed]
            if booked and not job.opportunistic:
                mine = [s for s in mine if s.booked_for in (None, job.user)]
            if job.opportunistic:
                mine = [s for s in mine if s.idle]
                if not in_window:
                    failed[shape] = f"outside window {describe(config.idle_windows)}"
                    mine = []
            choice = placement.best_fit(spec, mine, config.max_jobs_per_gpu, job.opportunistic,
                                        config.fragmentation_aware) if mine else None
            if choice is not None:
                placement.take(spec, choice, job.id)
                result.starts.append(Start(job.id, choice[0].host, tuple(s.index for s in choice)))
                held_gpus[job.user] = held_gpus.get(job.user, 0) + spec.gpus
                failed.clear()
                full = no_room()
                continue
            if not job.opportunistic:
                if reclaimable and _preempt_for(job, mine, config, result):
                    continue
                if not reserved and config.reservations and now - job.queued_at >= config.reserve_after_s:
                    reserved = _reserve_for(job, mine, result, explain, now, config.reserve_after_s)
                    if reserved:
                        continue
            if shape not in failed:
                failed[shape] = _why_waiting(job, allowed, mine, slots, hosts, config) if explain else ""
        if explain:
            waits(job, failed[shape])
    return result


def _apply_bookings(slots: Sequence[Slot], bookings: Sequence["Booking"], now: float) -> dict:
    """Mark the GPUs of the bookings on now; {(host, index): booking}."""
    booked = {(b.host, i): b for b in bookings if b.active(now) for i in b.gpus}
    for s in slots:
        if (b := booked.get((s.host, s.index))) is not None:
            s.booked_for, s.booked_until = b.owner, b.end
    return booked


def _yield_to_people_and_windows(running: Sequence[RunningJob], slots: Sequence[Slot], in_window: bool,
                                 config: Config, result: Plan, booked: Mapping) -> None:
    """Opportunistic jobs leave a GPU a person (a non-gpuq process) has started to use, all
    GPUs when their idle window closes, and a GPU whose booking began after they started
    (unless the booking is their owner's)."""
    busy = {(s.host, s.index): s for s in slots if s.busy_by_others}
    for job in running:
        if not job.preemptible or job.stopping:
            continue
        if not in_window:
            result.preempts[job.id] = f"idle window {describe(config.idle_windows)} closed"
            continue
        taken = [busy[(job.host, i)] for i in job.gpus if (job.host, i) in busy]
        if taken:
            result.preempts[job.id] = f"a non-gpuq process uses GPU {taken[0].label}"
            continue
        slot_taken = [b for i in job.gpus if (b := booked.get((job.host, i))) is not None
                      and b.owner != job.user and job.started_at < b.start]
        if slot_taken:
            b = slot_taken[0]
            result.preempts[job.id] = f"GPU {b.host}:{','.join(map(str, b.gpus))} booked for {b.owner} from {_hhmm(b.start)}"
    if result.preempts:  # their memory is on its way out: count it so, and never pick them twice
        for s in slots:
            leaving = [v for v in s.victims if v.id in result.preempts]
            for v in leaving:
                s.victims.remove(v)
                s.draining += placement.charged_mib(v, s.index, s.whole)
                s.draining_jobs += 1


def _preempt_for(job: PendingJob, slots: list[Slot], config: Config, result: Plan) -> bool:
    """Make room for an ordinary job by stopping opportunistic ones; the memory they free is
    held for it (nothing else may slip in) until it starts in a later pass."""
    if not config.preemption:
        return False
    got = placement.preemption_fit(job.spec, slots, job.order[0], config.max_jobs_per_gpu)
    if got is None:
        return False
    chosen, victims = got
    for victim in victims:
        result.preempts[victim.id] = f"job {job.id} needs its GPU memory"
        for s in chosen:
            if victim in s.victims:
                s.victims.remove(victim)
                s.draining += placement.charged_mib(victim, s.index, s.whole)
                s.draining_jobs += 1
    placement.take(job.spec, chosen, job.id, hold="hard")
    result.held[job.id] = (chosen[0].host, tuple(s.index for s in chosen))
    result.reasons[job.id] = (f"GPU {', '.join(s.label for s in chosen)} held for it: "
                              f"{'waiting for ' + ', '.join(sorted({v.id for v in victims})) + ' to yield' if victims else 'draining'}")
    return True


def _reserve_for(job: PendingJob, slots: list[Slot], result: Plan, explain: bool, now: float,
                 reserve_after_s: float) -> bool:
    """The head of the queue has waited reserve_after_s: hold back GPUs for it, so smaller
    jobs cannot keep taking them (opportunistic work still may). Only GPUs whose jobs in the
    way started after it and less than reserve_after_s ago (see placement.reservation)."""
    chosen = placement.reservation(job.spec, slots, since=max(job.queued_at, now - reserve_after_s))
    if chosen is None:
        return False
    placement.take(job.spec, chosen, job.id, hold="soft")
    result.held[job.id] = (chosen[0].host, tuple(s.index for s in chosen))
    if explain:
        result.reasons[job.id] = (f"GPU {', '.join(s.label for s in chosen)} reserved for it; "
                                  f"waiting for running jobs there to end")
    return True


def _hhmm(t: float) -> str:
    import time  # the clock's format only: plan reads no clock

    return time.strftime("%H:%M", time.localtime(t))


def _why_waiting(job: PendingJob, allowed: list[str], mine: list[Slot], slots: list[Slot],
                 hosts: Sequence[HostView], config: Config) -> str:
    spec = job.spec
    others_booked = [s for s in slots if s.host in allowed and s.booked_for not in (None, job.user)]
    if others_booked and placement.best_fit(spec, mine + others_booked, config.max_jobs_per_gpu, False):
        s = others_booked[0]
        return f"GPU {s.label} booked for {s.booked_for} until {_hhmm(s.booked_until)}"
    if job.opportunistic and not any(s.idle for s in slots if s.host in allowed):
        return reasons.why_not_idle([s for s in slots if s.host in allowed], config.idle_after_s)
    held = reasons.why_held(spec, [s for s in mine if s.held_for], job.id)
    if held and placement.best_fit(spec, [_unheld(s) for s in mine], config.max_jobs_per_gpu, job.opportunistic):
        return held
    return reasons.why_gpu(spec, allowed, mine or [s for s in slots if s.host in allowed], hosts, config,
                           job.opportunistic)


def _unheld(slot: Slot) -> Slot:
    """The slot as it would be without holds (to tell "reserved" from "too small")."""
    return replace(slot, free=max(slot.free, slot.free_opportunistic), held_for=None)

