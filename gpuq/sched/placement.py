"""The planner's picture of every GPU during one pass, and where a job fits in it.

A `Slot` is one GPU. Ordinary work sees it as if no opportunistic job ran (`free`, `jobs`);
opportunistic work takes only what ordinary work leaves, on idle GPUs without ordinary
jobs (`opportunistic_room`). An ordinary job placed on a GPU with opportunistic jobs makes
exactly those yield (`victims`) and holds the GPU until they have. Jobs placed, held or
preempted during the pass update the slots, so one pass never overcommits a GPU and never
preempts the same job twice.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(slots=True)  # a pass builds one per GPU and reads them millions of times in a replay
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
    # The containers below default to shared empty immutable ones and are replaced when
    # written: a replay builds a million slots, most never written, and making four empty
    # containers for each was a twentieth of it.
    victims: tuple["RunningJob", ...] = ()  # opportunistic, not yet told to yield
    opp_mib: int = 0  # memory of every opportunistic job on it, yielding ones included
    opp_jobs: int = 0
    held_for: str | None = None
    hard_held: bool = False  # held for a job whose opportunistic jobs are yielding: nothing else may use it
    # Memory reserved for the head of the queue from `reserved_from` (when running jobs' limits
    # free enough for it): a job that ends by then may use it (backfill), nothing else.
    reserved_mib: int = 0
    reserved_from: float = float("inf")
    # Set aside now (model/jobs.py SetAside: a booking): only its owner's jobs, and opportunistic ones.
    booked_for: str | None = None
    booked_until: float = 0.0
    # Bookings to come: (start, owner), soonest first. A job of anyone else that may still
    # run at a booking's start does not start here (a booking is a reservation too).
    booked_later: tuple[tuple[float, str], ...] = ()
    mps_users: frozenset[str] = frozenset()  # users of the ordinary MPS jobs on it (model/sharing.py)
    opp_mps_users: frozenset[str] = frozenset()  # ... and of its opportunistic ones
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
    slots: list[Slot] = []
    # Per host, its slots by GPU index: jobs are put straight onto their GPUs' slots.
    at: dict[str, dict[int, Slot]] = {}
    since_ever = float("-inf")  # free of non-gpuq use since: for a GPU its host says nothing of
    always_idle = now - since_ever >= idle_after_s
    for host in hosts:
        name, idle_map = host.name, host.others_idle_since
        on_host = at.setdefault(name, {})
        for gpu in host.gpus:
            index, total = gpu.index, gpu.mem_total_mib
            # A host that reports no non-gpuq use (most) has every GPU idle since ever.
            idle_since = idle_map.get(index, since_ever) if idle_map else since_ever
            # As usable_mib: NVML's `used` is others' (_count_observed takes off what gpuq's jobs
            # are observed to use), and each ordinary job's charge comes off below.
            others = gpu.mem_used_mib if gpu.mem_used_mib > 0 else 0
            free = total - (others if others > reserve_mib else reserve_mib)
            slot = Slot(
                name,
                index,
                total,
                total - reserve_mib,
                free,
                free,
                0,
                others <= reserve_mib,
                always_idle
                if idle_since == since_ever
                else idle_since is not None and now - idle_since >= idle_after_s,
                idle_since is None,
            )
            slots.append(slot)
            on_host[index] = slot
    # Each job once, straight onto its GPUs' slots (no job list per GPU): a deep replay builds
    # the slots 20,000 times.
    observed: dict[int, int] = {}  # id(slot) -> memory gpuq's jobs are observed to use there
    for job in running:
        job_slots = at.get(job.host)
        if job_slots is None:
            continue  # a host no longer live
        if job.observed_mib:
            for index in job.gpus:
                if (on := job_slots.get(index)) is not None:
                    observed[id(on)] = observed.get(id(on), 0) + job.observed_mib.get(index, 0)
        if job.preemptible and invisible:
            _put_opportunistic(job, job_slots)
            continue
        compute = 100 if job.compute_pct is None else job.compute_pct  # compute_of
        for index in job.gpus:
            on = job_slots.get(index)
            if on is None:
                continue  # a GPU its host no longer reports
            mib = charged_mib(job, index, on.whole)
            on.free -= mib
            on.free_opportunistic -= mib
            on.jobs += 1
            on.compute_room -= compute
            if job.mps:
                on.mps_users |= {job.user}
    if observed:
        _count_observed(slots, hosts, observed, reserve_mib)
    return slots


def _put_opportunistic(job: "RunningJob", on_host: dict[int, Slot]) -> None:
    """An opportunistic job on its GPUs' slots: apart from what ordinary work sees."""
    for index in job.gpus:
        on = on_host.get(index)
        if on is None:
            continue  # a GPU its host no longer reports
        on.opp_mib += charged_mib(job, index, on.whole)
        on.opp_jobs += 1
        if job.mps:
            on.opp_mps_users |= {job.user}
        if not job.stopping:
            on.victims += (job,)


def _count_observed(slots: list[Slot], hosts: Sequence["HostView"], observed: dict[int, int], reserve_mib: int) -> None:
    """As usable_mib: of NVML's `used`, what gpuq's jobs are observed to use is theirs, not
    others' (build_slots counted it all as others')."""
    gpus = [gpu for host in hosts for gpu in host.gpus]
    for slot, gpu in zip(slots, gpus):
        seen = observed.get(id(slot), 0)
        if not seen:
            continue
        counted = gpu.mem_used_mib if gpu.mem_used_mib > 0 else 0  # as others' in build_slots
        others = gpu.mem_used_mib - seen if gpu.mem_used_mib > seen else 0
        slot.free += max(counted, reserve_mib) - max(others, reserve_mib)
        slot.free_opportunistic = slot.free
        slot.others_clear = others <= reserve_mib


def compute_of(declared: int | None) -> int:
    """The share of a GPU's compute a job may keep busy: its declared gpu_compute, or all of it."""
    return 100 if declared is None else declared


def need_mib(spec: "JobSpec", slot: Slot) -> int:
    return slot.whole if spec.exclusive else spec.gpu_mem_mib  # type: ignore[return-value]


def backfills(slot: Slot, ends_by: float) -> bool:
    """Whether a job that ends by `ends_by` may use the memory reserved on the slot: it is
    gone before the job the reservation is for can start."""
    return slot.reserved_mib > 0 and ends_by <= slot.reserved_from


def fitting_room(spec: "JobSpec", slot: Slot, max_jobs: int, ends_by: float = float("inf")) -> int | None:
    """Whether an ordinary job fits on the slot (opportunistic jobs not counted), as the memory
    it may take there (its free memory, and the memory reserved there if it backfills); None
    where it does not fit. A job the GPU is held for has its place among max_jobs too (else
    small jobs fill every place while it waits), unless this one ends before that job is due
    to start. Both answers at once: best_fit asks both of every GPU."""
    backfill = slot.reserved_mib > 0 and ends_by <= slot.reserved_from  # backfills(slot, ends_by)
    if slot.jobs + (slot.held_for is not None and not backfill) >= max_jobs:
        return None
    free = slot.free + slot.reserved_mib if backfill else slot.free
    if spec.exclusive:
        return free if slot.jobs == 0 and slot.others_clear and free >= slot.whole else None
    return free if free >= spec.gpu_mem_mib else None  # type: ignore[operator]


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
    ends_by: float = float("inf"),
) -> list[Slot] | None:
    """Packing: the GPUs that leave the least memory unused (big holes stay for big jobs);
    among equals, the host with the fewest wholly free GPUs, so whole hosts stay free for jobs
    that need one; then where the fewest opportunistic jobs must yield.
    `spread`: only GPUs without ordinary work. `ends_by`: when an ordinary job will have
    ended at the latest (it may use memory reserved from then on: `backfills`)."""
    # Each GPU that fits, per host, as the tuple it is ranked by: memory it would leave (the
    # least first), opportunistic jobs that must yet be told to go, then all of them there (the
    # second makes a job keep, pass after pass, the GPU whose jobs already yield for it), its
    # index, its place in `slots`. Made once per GPU, not once per comparison.
    by_host: dict[str, list[tuple[int, int, int, int, int, Slot]]] = {}
    empty_on: dict[str, int] = {}
    if spec.exclusive:  # only a GPU without ordinary jobs can fit it (and one with them is never empty)
        slots = [s for s in slots if not s.jobs]
    for n, s in enumerate(slots):
        empty = s.jobs == 0 and s.held_for is None  # Slot.ordinary_empty
        if empty:
            empty_on[s.host] = empty_on.get(s.host, 0) + 1
        if spread and not empty:
            continue
        if opportunistic:
            if fits_opportunistic(spec, s, max_jobs):
                by_host.setdefault(s.host, []).append((s.opportunistic_room, 0, 0, s.index, n, s))
        elif (left := fitting_room(spec, s, max_jobs, ends_by)) is not None:
            by_host.setdefault(s.host, []).append((left, len(s.victims), s.opp_jobs, s.index, n, s))
    best: tuple | None = None
    for host, candidates in by_host.items():
        if len(candidates) < spec.gpus:
            continue
        chosen = sorted(candidates)[: spec.gpus]
        leftover = sum(left - need_mib(spec, s) for left, *_, s in chosen)
        crowding = empty_on.get(host, 0) if fragmentation_aware else 0
        if opportunistic:
            # The opposite of ordinary work's choice: ordinary work fills the fullest box first,
            # so opportunistic work on the emptiest is the last in its way (a first day's
            # review: ordinary jobs preempted low ones while the GPUs beside them sat free).
            crowding = -crowding
        # Opportunistic jobs that would yield only break ties: ordinary work is placed as if
        # they were not there (or a wide job's whole box would be broken to spare one of them;
        # putting a free GPU first, however loose the fit, made opportunistic work visible:
        # the Alibaba window's normal jobs waited 3.1x as long with low jobs as without).
        yields = (sum(c[1] for c in chosen), sum(c[2] for c in chosen)) if chosen else ()
        # Among boxes alike, ordinary work takes the first by name and opportunistic work the
        # last: else both pick the same box of two that are empty, and the next ordinary job
        # there preempts the low ones while the other box sits idle.
        key = (leftover, crowding, yields)
        if best is None or key < best[0] or (key == best[0] and (host > best[2] if opportunistic else host < best[2])):
            best = (key, chosen, host)
    return [c[-1] for c in best[1]] if best else None


def take(
    spec: "JobSpec",
    chosen: Iterable[Slot],
    job_id: str,
    hold: str | None = None,
    mps_user: str | None = None,
    ends_by: float = float("inf"),
) -> None:
    """Charge a started (hold None) or held ("hard": its opportunistic jobs are yielding and
    nothing else may use the GPU) ordinary job's memory on its slots; `mps_user`: the owner of
    a job that runs under MPS. A started job that ends by `ends_by` takes reserved memory
    before free memory where it may (`backfills`), leaving the free memory to others."""
    for s in chosen:
        if mps_user is not None:
            s.mps_users |= {mps_user}
        need = need_mib(spec, s)
        if hold is None and backfills(s, ends_by):
            borrowed = min(need, s.reserved_mib)
            s.reserved_mib -= borrowed
            s.free -= need - borrowed
        else:
            s.free -= need
        s.compute_room -= compute_of(spec.gpu_compute_pct)
        s.free_opportunistic -= need
        if hold is None:
            s.jobs += 1
        else:
            s.held_for = s.held_for or job_id
            s.hard_held = s.hard_held or hold == "hard"


def reserve(spec: "JobSpec", chosen: Iterable[Slot], job_id: str, start: float) -> None:
    """Set memory aside on the slots for the head of the queue, due to start at `start`:
    ordinary jobs that end by then may still use it (`backfills`), opportunistic ones too."""
    for s in chosen:
        need = min(need_mib(spec, s), max(0, s.free))
        s.free -= need
        s.reserved_mib += need
        s.reserved_from = min(s.reserved_from, start)
        s.held_for = s.held_for or job_id


def take_opportunistic(spec: "JobSpec", chosen: Iterable[Slot], mps_user: str | None = None) -> None:
    for s in chosen:
        if mps_user is not None:
            s.opp_mps_users |= {mps_user}
        s.opp_mib += need_mib(spec, s)
        s.opp_jobs += 1


def serves_mps_user(slot: Slot, user: str, opportunistic: bool = False) -> bool:
    """Whether an MPS job of `user` may join the GPU: no other user's MPS job is on it (for
    an ordinary job, opportunistic ones do not count: they yield to it)."""
    others = slot.mps_users | slot.opp_mps_users if opportunistic else slot.mps_users
    return others <= {user}


def earliest_start(
    spec: "JobSpec",
    slots: Sequence[Slot],
    ending: dict[tuple[str, int], list[tuple[float, int]]],
    max_jobs: int,
) -> tuple[float, list[Slot]] | None:
    """When and where a job that fits nowhere now could start at the earliest, if the ordinary
    jobs on the GPUs end by their limits: `ending` lists, per GPU, (ends by, memory charged)
    of each (inf: unknown, never counted as ending). On each host, the moments its jobs end,
    in order, free their memory until the job fits; the earliest host wins, then the best fit.
    None: nowhere within any known limit (a job without one runs on for all the plan knows)."""
    best: tuple[float, list[Slot]] | None = None
    best_yields = 0
    unknown = float("inf")
    by_host: dict[str, list[Slot]] = {}
    for s in slots:
        by_host.setdefault(s.host, []).append(s)
    for candidates in by_host.values():
        if len(candidates) < spec.gpus:
            continue
        events = [
            (end, n, mib)
            for n, s in enumerate(candidates)
            for end, mib in ending.get((s.host, s.index), ())
            if end != unknown
        ]
        events.sort()
        if not events or (best is not None and events[0][0] > best[0]):
            continue  # nothing frees here by the best start found so far
        free = [s.free + s.reserved_mib for s in candidates]
        jobs = [s.jobs for s in candidates]
        ready = [_could_take(spec, s, free[n], jobs[n], max_jobs) for n, s in enumerate(candidates)]
        room = sum(ready)  # GPUs that could take it: kept up to date as jobs end
        k = 0
        while k < len(events) and (best is None or events[k][0] <= best[0]):
            moment = events[k][0]
            while k < len(events) and events[k][0] == moment:
                _, n, mib = events[k]
                free[n] += mib
                jobs[n] -= 1
                k += 1
                if not ready[n] and _could_take(spec, candidates[n], free[n], jobs[n], max_jobs):
                    ready[n] = True
                    room += 1
            if room >= spec.gpus:  # best_fit's choice on one host, with each GPU as it will be then
                order = sorted(
                    (n for n in range(len(candidates)) if ready[n]),
                    key=lambda n: (candidates[n].opp_jobs > 0, free[n], candidates[n].opp_jobs, candidates[n].index),
                )
                chosen = [candidates[n] for n in order[: spec.gpus]]
                yields = sum(1 for s in chosen if s.opp_jobs)
                # Of hosts where it could start as soon, the one where fewer opportunistic jobs
                # must yield (told in time for it: sched/plan.py _yield_in_time).
                if best is None or moment < best[0] or yields < best_yields:
                    best, best_yields = (moment, chosen), yields
                break
    return best


def _could_take(spec: "JobSpec", slot: Slot, free: int, jobs: int, max_jobs: int) -> bool:
    """`fitting_room` not None, for the slot with this much free memory and this many jobs."""
    if jobs >= max_jobs:
        return False
    if spec.exclusive:
        return jobs <= 0 and slot.others_clear and free >= slot.whole
    return free >= spec.gpu_mem_mib  # type: ignore[operator]
