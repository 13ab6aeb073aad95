"""The planner's picture of every GPU during one pass, and where a job fits in it.

A `Slot` is one GPU. Ordinary work sees it as if no opportunistic job ran (`free`, `jobs`);
opportunistic work takes only what ordinary work leaves, on idle GPUs without ordinary
jobs (`opportunistic_room`). An ordinary job placed on a GPU with opportunistic jobs makes
exactly those yield (`victims`) and holds the GPU until they have. Jobs placed, held or
preempted during the pass update the slots, so one pass never overcommits a GPU and never
preempts the same job twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, RunningJob
from gpuq.model.spec import JobSpec


def charged_mib(job: "RunningJob", index: int, whole: int) -> int:
    """NVML's used memory lags a job that started a second ago: every gpuq job counts as
    max(declared, observed); a job without gpu_mem holds the whole GPU."""
    declared = whole if job.gpu_mem_mib is None else job.gpu_mem_mib
    return max(declared, job.observed_mib.get(index, 0)) if job.observed_mib else declared


def usable_mib(gpu: GpuSnapshot, jobs_on_gpu: Iterable["RunningJob"], reserve_mib: int) -> int:
    """docs/scheduling.md, "Memory accounting": the rest of NVML's `used`, beyond what gpuq's jobs are
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
    """One GPU as ordinary work sees it: opportunistic jobs are invisible to it (their memory
    counts as free), and kept apart in `opp_*` for the opportunistic phase and for the
    yields an ordinary placement implies."""

    host: str
    index: int
    total: int
    whole: int  # total less the reserve: what an exclusive job gets
    free: int  # for ordinary work, after this pass's starts and holds
    free_opportunistic: int  # the same, less only hard holds (a reservation lets opportunistic work in)
    jobs: int  # ordinary jobs on it (started this pass included)
    others_clear: bool  # nothing but gpuq jobs beyond the reserve: exclusive may fit
    idle: bool  # non-gpuq use below the threshold for idle_after_s
    busy_by_others: bool  # a non-gpuq process uses it now
    victims: list["RunningJob"] = field(default_factory=list)  # opportunistic, not yet told to yield
    opp_mib: int = 0  # memory of every opportunistic job on it, yielding ones included
    opp_jobs: int = 0
    blockers: int = 0  # memory of running ordinary jobs
    oldest_blocker: float = float("inf")  # when the longest-running of them started
    held_for: str | None = None
    hard_held: bool = False  # held for a job whose opportunistic jobs are yielding: nothing else may use it
    booked_for: str | None = None  # a booking on now (spool/bookings.py): only its owner's jobs, and opportunistic ones
    booked_until: float = 0.0
    mps_users: set[str] = field(default_factory=set)  # users of the ordinary MPS jobs on it (model/sharing.py)
    opp_mps_users: set[str] = field(default_factory=set)  # ... and of its opportunistic ones
    compute_room: int = 100  # percent of its compute its ordinary jobs leave, by their declared gpu_compute

    @property
    def label(self) -> str:
        return f"{self.host}:{self.index}"

    @property
    def ordinary_empty(self) -> bool:
        """No ordinary job on it and nothing held: whole, as far as ordinary work can tell."""
        return self.jobs == 0 and self.held_for is None

    @property
    def opportunistic_room(self) -> int:
        return self.free_opportunistic - self.opp_mib


def build_slots(
    hosts: Sequence["HostView"],
    running: Sequence["RunningJob"],
    reserve_mib: int,
    now: float,
    idle_after_s: float,
    invisible: bool = True,
) -> list[Slot]:
    """`invisible`: opportunistic jobs can be made to yield (preemption on), so ordinary work
    plans as if they did not run; otherwise they count like any other job."""
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
            slot = Slot(
                host.name,
                index,
                gpu.mem_total_mib,
                whole,
                0,
                0,
                0,
                True,
                idle=idle_since is not None and now - idle_since >= idle_after_s,
                busy_by_others=idle_since is None,
            )
            observed = charged = 0
            for job in by_gpu.get((host.name, index), ()):
                mib = charged_mib(job, index, whole)
                observed += job.observed_mib.get(index, 0) if job.observed_mib else 0
                if job.preemptible and invisible:
                    slot.opp_mib += mib
                    slot.opp_jobs += 1
                    if job.mps:
                        slot.opp_mps_users.add(job.user)
                    if not job.stopping:
                        slot.victims.append(job)
                    continue
                charged += mib
                slot.jobs += 1
                slot.compute_room -= compute_of(job.compute_pct)
                if job.mps:
                    slot.mps_users.add(job.user)
                slot.blockers += mib
                slot.oldest_blocker = min(slot.oldest_blocker, job.started_at)
            # As usable_mib: beyond what gpuq's jobs are observed to use, `used` is others'.
            others = max(0, gpu.mem_used_mib - observed)
            slot.free = slot.free_opportunistic = gpu.mem_total_mib - max(reserve_mib, others) - charged
            slot.others_clear = others <= reserve_mib
            slots.append(slot)
    return slots


def compute_of(declared: int | None) -> int:
    """The share of a GPU's compute a job may keep busy: its declared gpu_compute, or all of it."""
    return 100 if declared is None else declared


def need_mib(spec: "JobSpec", slot: Slot) -> int:
    return slot.whole if spec.exclusive else spec.gpu_mem_mib  # type: ignore[return-value]


def fits(spec: "JobSpec", slot: Slot, max_jobs: int) -> bool:
    """Room for an ordinary job, opportunistic jobs not counted. A job the GPU is held for
    has its place among max_jobs too (else small jobs fill every place while it waits)."""
    if slot.jobs + (slot.held_for is not None) >= max_jobs:
        return False
    if spec.exclusive:
        return slot.jobs == 0 and slot.others_clear and slot.free >= slot.whole
    return slot.free >= spec.gpu_mem_mib  # type: ignore[operator]


def fits_opportunistic(spec: "JobSpec", slot: Slot, max_jobs: int) -> bool:
    """Room for an opportunistic job: an idle GPU no ordinary job uses or is held for."""
    if not slot.idle or slot.jobs or slot.hard_held or slot.opp_jobs >= max_jobs:
        return False
    if spec.exclusive:
        return slot.opp_jobs == 0 and slot.others_clear and slot.opportunistic_room >= slot.whole
    return slot.opportunistic_room >= spec.gpu_mem_mib  # type: ignore[operator]


def best_fit(
    spec: "JobSpec",
    slots: Sequence[Slot],
    max_jobs: int,
    opportunistic: bool = False,
    fragmentation_aware: bool = True,
    spread: bool = False,
) -> list[Slot] | None:
    """Packing: the GPUs that leave the least memory unused (big holes stay for big jobs);
    among equals, the host with the fewest wholly free GPUs, so whole hosts stay free for jobs
    that need one; then where the fewest opportunistic jobs must yield.
    `spread`: only GPUs without ordinary work."""
    by_host: dict[str, list[Slot]] = {}
    empty_on: dict[str, int] = {}
    fit = fits_opportunistic if opportunistic else fits
    for s in slots:
        if s.ordinary_empty:
            empty_on[s.host] = empty_on.get(s.host, 0) + 1
        if fit(spec, s, max_jobs) and (not spread or s.ordinary_empty):
            by_host.setdefault(s.host, []).append(s)
    room = (lambda s: s.opportunistic_room) if opportunistic else (lambda s: s.free)
    # Opportunistic jobs that must yet be told to go, then all of them there: the second makes
    # a job keep, pass after pass, the GPU whose jobs already yield for it.
    yields = (lambda s: (0, 0)) if opportunistic else (lambda s: (len(s.victims), s.opp_jobs))
    best: tuple | None = None
    for host, candidates in by_host.items():
        if len(candidates) < spec.gpus:
            continue
        chosen = sorted(candidates, key=lambda s: (room(s), yields(s), s.index))[: spec.gpus]
        leftover = sum(room(s) - need_mib(spec, s) for s in chosen)
        crowding = empty_on.get(host, 0) if fragmentation_aware else 0
        # Opportunistic jobs that would yield only break ties: ordinary work is placed as if
        # they were not there (or a wide job's whole box would be broken to spare one of them).
        key = (leftover, crowding, tuple(map(sum, zip(*(yields(s) for s in chosen)))), host)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best else None


def take(
    spec: "JobSpec", chosen: Iterable[Slot], job_id: str, hold: str | None = None, mps_user: str | None = None
) -> None:
    """Charge a started (hold None), held ("hard": its opportunistic jobs are yielding and
    nothing else may use the GPU) or reserved ("soft": opportunistic work still may) ordinary
    job's memory on its slots; `mps_user`: the owner of a job that runs under MPS."""
    for s in chosen:
        if mps_user is not None:
            s.mps_users.add(mps_user)
        need = need_mib(spec, s)
        s.free -= need
        s.compute_room -= compute_of(spec.gpu_compute_pct)
        if hold != "soft":
            s.free_opportunistic -= need
        if hold is None:
            s.jobs += 1
        else:
            s.held_for = s.held_for or job_id
            s.hard_held = s.hard_held or hold == "hard"


def take_opportunistic(spec: "JobSpec", chosen: Iterable[Slot], mps_user: str | None = None) -> None:
    for s in chosen:
        if mps_user is not None:
            s.opp_mps_users.add(mps_user)
        s.opp_mib += need_mib(spec, s)
        s.opp_jobs += 1


def serves_mps_user(slot: Slot, user: str, opportunistic: bool = False) -> bool:
    """Whether an MPS job of `user` may join the GPU: no other user's MPS job is on it (for
    an ordinary job, opportunistic ones do not count: they yield to it)."""
    others = slot.mps_users | slot.opp_mps_users if opportunistic else slot.mps_users
    return others <= {user}


def reservation(spec: "JobSpec", slots: Sequence[Slot], since: float) -> list[Slot] | None:
    """GPUs to hold back for a job that smaller ones keep overtaking: only GPUs whose jobs in
    the way all started after `since` (they overtook it, and have not run long: job lengths
    are heavy-tailed, so a job that has run long tends to run on, and holding GPUs behind it
    would idle them for as long). Among those, where it will fit soonest as far as anyone can
    tell without knowing how long jobs run: on each host, GPUs already free first, then those
    whose jobs in the way started first; among hosts, the fewest GPUs still to free, then the
    earliest such job, then the least memory to free. The plan keeps no memory of the last
    pass's reservation, so these are what keep it where it is: a GPU it holds that comes free
    stays free (and first), no job joins a GPU it holds, and a job that starts anywhere after
    it was made is younger than the jobs it waits for. It still moves to GPUs whose jobs in
    the way are older (each such move is to an older job, so the moves end), and off a GPU
    once its job has run reserve_after_s. (Preferring the newest, as this did, moved it to
    whichever GPUs a stream of small jobs had just started on, each move handing the GPUs it
    held to the stream: a wide job starved, across two boxes or on one box wider than it.)
    Opportunistic jobs are never in the way."""

    def to_free(s: Slot) -> int:
        return s.blockers if spec.exclusive else max(0, need_mib(spec, s) - s.free)

    best: tuple | None = None
    by_host: dict[str, list[Slot]] = {}
    for s in slots:
        # An exclusive job fits only where nothing but gpuq's jobs holds memory: waiting for
        # them to end never clears other memory (as with busy_by_others).
        could_ever = s.others_clear if spec.exclusive else spec.gpu_mem_mib <= s.whole  # type: ignore[operator]
        if s.held_for is None and not s.busy_by_others and could_ever:
            by_host.setdefault(s.host, []).append(s)
    for host, candidates in by_host.items():
        # A GPU whose job in the way was there before `since` may stay taken for weeks.
        eligible = [s for s in candidates if not to_free(s) or s.oldest_blocker >= since]
        if len(eligible) < spec.gpus:
            continue
        chosen = sorted(eligible, key=lambda s: (to_free(s) > 0, s.oldest_blocker, to_free(s), s.index))[: spec.gpus]
        in_way = [s.oldest_blocker for s in chosen if to_free(s)]
        key = (len(in_way), min(in_way, default=0.0), sum(to_free(s) for s in chosen), host)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best else None
