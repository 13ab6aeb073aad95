"""Scheduling as one pure function: (pending, hosts' GPU snapshots, running, config, now) ->
which jobs start where, which opportunistic jobs must yield, what is held for whom, and a
human reason for every job that waits.

The worker, `gpuq status` (reasons) and `gpuq simulate` all call `plan`. No files, no
processes, no NVML, no clock here: everything arrives as data. docs/scheduling.md says
the rules in users' words; sched/placement.py holds the per-GPU arithmetic.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence, TypedDict

from gpuq.model.config import Config
from gpuq.model.jobs import HostView, PendingJob, Plan, RunningJob, SetAside, Start
from gpuq.model.sharing import uses_mps
from gpuq.model.spec import JobSpec, stop_grace_s
from gpuq.model.windows import describe, hhmm, moment, window_open
from gpuq.sched import fairshare, placement, reasons, setasides
from gpuq.sched.boxroom import BoxRoom, asks
from gpuq.sched.placement import Slot, compute_of

# The jobs a pass tries to reserve for before it stops looking (Slurm's backfill tests at most
# bf_max_job_test, 500, a pass); jobs of a shape already tried are not tried, nor counted.
RESERVE_DEPTH = 500


def _in_order(keys: list[tuple], presorted: bool) -> Iterator[PendingJob]:
    """The jobs of `keys` in queue order. A worker's pass usually starts one or two jobs and
    then stops walking: a heap orders only as many as it takes, where a sort orders all."""
    if presorted:
        yield from (key[-1] for key in keys)
        return
    heapq.heapify(keys)
    while keys:
        yield heapq.heappop(keys)[-1]


def plan(
    pending: Sequence[PendingJob],
    hosts: Sequence[HostView],
    running: Sequence[RunningJob],
    config: Config,
    now: float,
    explain: bool = True,
    blocked: Mapping[str, str] | None = None,
    set_aside: Sequence[SetAside] = (),
    estimates: Mapping[str, float] | None = None,
    usage: Mapping[str, float] | None = None,
    needs: Callable[[Mapping[str, Any]], str | None] | None = None,
    drained: Collection[str] = (),
) -> Plan:
    """Decide, in queue order, which pending jobs start on which GPUs, which GPUs are held
    for jobs that cannot start yet, and which opportunistic jobs must yield. Ordinary jobs
    first, as if no opportunistic job ran: where one lands on a GPU with opportunistic jobs,
    exactly those yield and the GPU is held for it. Then opportunistic jobs, in what is left.
    `blocked`: jobs that may not start whatever the GPUs (dependencies), with the reason.
    `set_aside`: GPUs set aside for a person over a window (model/jobs.py SetAside: the
    extras' placement rules, such as bookings, read by the caller).
    `estimates`: job id -> how long a job without a time limit is expected to run (from its
    owner's history of like jobs), which lets it backfill ahead of a reservation.
    `usage`: each user's decayed GPU-seconds of ended jobs (model/usage.py), for fair share.
    `needs`: from a spec's extras' fields, the name a host must offer (its container's runtime,
    among the host's `runtimes`): gpuq/hooks.py needs_of; None: no job needs anything.
    `drained`: live hosts left out of `hosts` by `gpuq drain`, for the reasons."""
    blocked = blocked or {}
    slots = placement.build_slots(
        hosts, running, config.gpu_mem_reserve_mib, now, config.idle_after_s, invisible=config.preemption
    )
    booked = setasides.mark(slots, set_aside, now)
    keys = fairshare.queue_keys(pending, running, slots, config, now, usage or {})
    if explain:
        keys.sort()
    in_window = window_open(config.idle_windows, now)
    result = Plan([], {}, [key[-1].id for key in keys] if explain else [])
    _yield_to_people_and_windows(running, slots, in_window, config, result, booked)
    pass_ = _Pass(slots, hosts, running, config, now, explain, result, booked, blocked, estimates or {})
    pass_.needs = needs
    pass_.drained = frozenset(drained)
    pass_.queue = pending
    # Two comprehensions, not a loop of appends: a pass splits thousands (most queues hold
    # no opportunistic job, and then the keys are all ordinary).
    opportunistic_keys = [key for key in keys if key[-1].spec.preemptible]
    ordinary_keys = [key for key in keys if not key[-1].spec.preemptible] if opportunistic_keys else keys
    ordinary = _in_order(ordinary_keys, presorted=explain)
    for job in ordinary:
        pass_.ordinary(job)
        if pass_.gpu_full and not explain:
            break
    # A worker's pass, once no GPU job can start: only CPU-only jobs may, and the heap holds
    # exactly the jobs not yet walked.
    cpu_only_left = 0 if explain or pass_.cpu_full else sum(1 for key in ordinary_keys if not key[-1].spec.gpus)
    for job in ordinary:
        if pass_.cpu_full or not cpu_only_left:
            break
        if not job.spec.gpus:
            cpu_only_left -= 1
            pass_.ordinary(job)
    for job in _in_order(opportunistic_keys, presorted=explain):
        pass_.opportunistic(job, in_window)
    return result


def _ending(
    slots: list[Slot], running: Sequence[RunningJob], config: Config, now: float
) -> tuple[dict[tuple[str, int], list[tuple[float, int]]], bool]:
    """Per GPU, when each ordinary job on it must have ended (its limit, a stop's grace), and
    its memory: what a reservation for the head of the queue is computed from
    (placement.earliest_start). And whether any GPU frees by a known limit: without one, no
    job can be reserved for."""
    ending: dict[tuple[str, int], list[tuple[float, int]]] = {}
    known_end = False
    whole = {(s.host, s.index): s.whole for s in slots}
    for job in running:
        if job.preemptible and config.preemption:
            continue  # invisible to ordinary work (placement.build_slots)
        ends_by = _gone_by(job, now, config)
        for index in job.gpus:
            if (key := (job.host, index)) in whole:
                ending.setdefault(key, []).append((ends_by, placement.charged_mib(job, index, whole[key])))
                known_end = known_end or ends_by != float("inf")
    return ending, known_end


def _gone_by(job: RunningJob, now: float, config: Config) -> float:
    """RunningJob.gone_by, but nothing tells when a stuck one leaves (RunningJob.stuck)."""
    if not job.stopping and (ends_by := job.ends_by) > now:
        # Not told to stop and within its limit: gone a grace after it (gone_by's first case),
        # and not stuck (graces are over 0). Most running jobs, without the calls below.
        return ends_by + job.stop_grace(config.grace_s)
    if job.stuck(now, config.grace_s):
        return float("inf")
    return job.gone_by(now, config.grace_s, config.poll_interval)


def _needs_whole(spec: JobSpec, largest_mib: int) -> bool:
    """A job that only an empty GPU can take: exclusive, or over half the largest GPU."""
    if spec.gpus == 0:
        return False
    return spec.exclusive or 2 * spec.gpu_mem_mib > largest_mib  # type: ignore[operator]


class _Behind(TypedDict):
    """Where the jobs a pass walks stand behind higher-priority ones (_Pass.waits)."""

    order: tuple  # the priority of the jobs walked last
    before: int  # jobs of higher priority
    same: int  # jobs of that priority walked so far


class _Pass:
    """One planning pass's running tallies: what each user holds, which CPU slots are free,
    which job shapes already failed (they fail the same way until something starts)."""

    def __init__(
        self,
        slots: list[Slot],
        hosts: Sequence[HostView],
        running: Sequence[RunningJob],
        config: Config,
        now: float,
        explain: bool,
        result: Plan,
        booked: Mapping,
        blocked: Mapping[str, str],
        estimates: Mapping[str, float],
    ) -> None:
        self.slots, self.hosts, self.config, self.now = slots, hosts, config, now
        self.running = running
        self.estimates = estimates
        self.explain, self.result, self.booked, self.blocked = explain, result, booked, blocked
        self.cpu_free = {h.name: h.cpu_slots for h in hosts}
        # Cores and host memory jobs hold (-c, --mem), where boxes say what they have (not a replay's).
        self.box_room = BoxRoom(hosts, running, config) if BoxRoom.applies(hosts) else None
        self.held_gpus: dict[str, int] = {}  # whole GPUs each user's jobs hold, for max_gpus_per_user
        for job in running:
            self.held_gpus[job.user] = self.held_gpus.get(job.user, 0) + len(job.gpus)
            if not job.gpus and job.host in self.cpu_free:
                self.cpu_free[job.host] -= 1
        self.failed: dict[tuple, str] = {}
        self.drained: frozenset[str] = frozenset()  # for the reasons: hosts `gpuq drain` left out
        self.allowed_for: dict[tuple, list[str]] = {}
        self.needs: Callable[[Mapping[str, Any]], str | None] | None = None
        self.ending, self.known_end = _ending(slots, running, config, now)
        # Per GPU, the opportunistic jobs on it already told to yield: a job held there waits for them.
        self.draining: dict[tuple[str, int], list[str]] = {}
        for job in running if explain else ():
            if job.preemptible and job.stopping:
                for index in job.gpus:
                    self.draining.setdefault((job.host, index), []).append(job.id)
        self.largest = max([s.whole for s in slots], default=0)
        self.behind: _Behind = {"order": (), "before": 0, "same": 0}  # for "behind N higher-priority jobs"
        self.reserved = False  # one reservation a pass: for the head of the queue (or given up)
        self.reserve_tries = 0  # jobs that could not start and were tried for the reservation
        self.backfill_until = float("inf")  # see _update_room
        self.booked_later = any(s.booked_later for s in slots)  # whether any GPU has a booking to come
        self.queue: Sequence[PendingJob] = ()
        self.demand_walked = self.demand_seen = 0  # demand_over's walk: jobs, and GPUs they need
        self.placed_whole = 0  # GPUs that ordinary jobs placed so far needed empty
        self.end_marks: list[float] | None = None  # see _backfill_class
        self._update_room()

    def demand_over(self, limit: int) -> bool:
        """Whether waiting ordinary jobs need more than `limit` GPUs empty (counting only jobs
        some box could take): spreading uses only GPUs beyond them. The queue is walked once a
        pass at most, and only as far as the answer needs (usually a few jobs). Jobs placed
        this pass are taken off; one placed but not walked yet only makes the walk go on."""
        widest = max((len(h.gpus) for h in self.hosts), default=0)
        queue, hosts = self.queue, self.hosts
        while self.demand_seen - self.placed_whole <= limit and self.demand_walked < len(queue):
            j = queue[self.demand_walked]
            self.demand_walked += 1
            if (
                not j.opportunistic
                and j.id not in self.blocked
                and _needs_whole(j.spec, self.largest)
                and j.spec.gpus <= widest
                and (not j.spec.hosts or any(h.name in j.spec.hosts for h in hosts))
            ):
                self.demand_seen += j.spec.gpus
        return self.demand_seen - self.placed_whole > limit

    def _update_room(self) -> None:
        """Whether a GPU job, and a CPU-only job, could still start, hold or reserve anything.
        Once neither can, the rest of the queue only needs reasons: a worker (which needs no
        reasons) then stops walking it, so a pass with thousands waiting costs little."""
        limit = self.config.max_jobs_per_gpu
        free = False
        reserved_until = -float("inf")  # the latest moment reserved memory is due (none: -inf)
        empty = 0
        for s in self.slots:  # one walk: a replay calls this some 50,000 times
            if s.jobs < limit:
                free = free or s.free > 0
                if s.reserved_mib > 0 and s.reserved_from > reserved_until:
                    reserved_until = s.reserved_from
            if s.jobs == 0 and s.held_for is None:  # Slot.ordinary_empty
                empty += 1
        reserved = reserved_until > -float("inf")
        self.gpu_full = not free and not reserved and not (self.config.reservations and not self.reserved)
        # Where only reserved memory is left, only a job that ends by then may start (backfill).
        self.backfill_until = reserved_until if not free and reserved else float("inf")
        self.cpu_full = not any(n > 0 for n in self.cpu_free.values())
        self.room_to_spare = 2 * empty >= len(self.slots)

    def waits(self, job: PendingJob, reason: str) -> None:
        if not self.explain:
            return
        behind = self.behind
        if job.order != behind["order"]:
            behind.update({"order": job.order, "before": behind["before"] + behind["same"], "same": 0})
        n = behind["before"]
        self.result.reasons[job.id] = reason + (f"; behind {n} higher-priority job{'s' if n != 1 else ''}" if n else "")
        behind["same"] += 1

    def ends_by(self, job: PendingJob) -> float:
        """When the job would have left its GPUs at the latest if it started now: its time
        limit (the spec's, else config's), else its owner's history's estimate, and then the
        grace its stop may take (its own, else the config's: a job may ignore SIGTERM until
        the SIGKILL), as RunningJob.gone_by counts a running one; inf: unknown, as Slurm
        treats a job without a limit (it never backfills ahead of a reservation)."""
        limit = job.spec.time_limit_s or self.config.time_limit_s or self.estimates.get(job.id)
        if not limit:
            return float("inf")
        return self.now + limit + stop_grace_s(job.spec.grace_s, job.spec.preemptible, self.config.grace_s)

    def _runs_for(self, job: PendingJob) -> str:
        """What `ends_by` counted, in a reason's words."""
        if job.spec.time_limit_s or self.config.time_limit_s:
            return "its time limit and grace"
        return "its kind's longest recent run, and a grace"

    def _allowed(self, job: PendingJob) -> tuple[list[str], str | None, tuple]:
        """The hosts the job may run on, its container runtime, and its shape (jobs of one
        shape fit or fail alike). Computed once per (hosts, runtime): 10,000 jobs share few."""
        spec = job.spec
        runtime = self.needs(spec.extras) if spec.extras and self.needs is not None else None
        shape = (
            spec.gpus,
            spec.gpu_mem_mib,
            asks(job, self.config) if self.box_room else None,  # the cores and memory it holds on its box
            spec.hosts,
            job.opportunistic,
            job.order[0],
            job.user if self.booked or self.booked_later or uses_mps(spec, self.config) else None,
            runtime,
            spec.grace_s if job.opportunistic else None,  # a long one keeps it off reserved GPUs
            # Whether it may backfill, or run before someone's booking begins, depends on its end:
            # past the reservation, its class (_backfill_class); before it, the end itself where
            # a booking is to come (the reservation's moments are not known yet).
            self._backfill_class(job) if self.reserved else self.ends_by(job) if self.booked_later else None,
            self._may_reserve(job),  # a job too young for the reservation fails for others of its shape
        )
        allowed = self.allowed_for.get((spec.hosts, runtime))
        if allowed is None:
            allowed = self.allowed_for[(spec.hosts, runtime)] = [
                h.name
                for h in self.hosts
                if (not spec.hosts or h.name in spec.hosts)
                and (runtime is None or h.runtimes is None or runtime in h.runtimes)
            ]
        if (
            runtime is not None
            and not allowed
            and (lacking := [h for h in self.hosts if not spec.hosts or h.name in spec.hosts])
        ):
            self.failed.setdefault(shape, reasons.why_runtime(runtime, lacking))
        return allowed, runtime, shape

    def _backfill_class(self, job: PendingJob) -> float | int:
        """Once the reservation is made, what of a job's end decides where it may go: the end
        itself where reasons are asked for (they say it); else only which of the reserved
        moments and bookings to come it falls between (fitting_room: a job that ends by a
        moment reserved may borrow that memory; setasides.booked_before: one that still runs
        at a booking's start may not go there). Jobs alike but for their ends, between the
        same moments, fit or fail alike: a walk past the reservation tries each such class
        once, not each job (the walk of a deep queue tried hundreds a pass)."""
        ends_by = self.ends_by(job)
        if self.explain:
            return ends_by
        if self.end_marks is None:  # fixed from here: no reservation is made after this one
            self.end_marks = sorted(
                {s.reserved_from for s in self.slots if s.reserved_mib > 0}
                | {start for s in self.slots for start, _ in s.booked_later}
            )
        return bisect.bisect_left(self.end_marks, ends_by)

    def _may_place(self, job: PendingJob) -> bool:
        """Whether the job may be placed at all: not blocked, not over its user's cap (else
        its reason is given)."""
        if job.id in self.blocked:
            self.waits(job, self.blocked[job.id])
            return False
        cap = self.config.max_gpus_per_user
        if cap is not None and job.spec.gpus and self.held_gpus.get(job.user, 0) + job.spec.gpus > cap:
            self.waits(job, f"at user cap {self.held_gpus.get(job.user, 0)}/{cap} GPUs")
            return False
        return True

    def _box_room_for(self, room: BoxRoom, job: PendingJob, allowed: list[str], shape: tuple) -> list[str]:
        """The hosts of `allowed` with the cores and host memory the job holds; none: it waits,
        and says why (a job that asks neither keeps them all)."""
        roomy = room.roomy(job, allowed)
        if not roomy and allowed:
            self.failed[shape] = room.why(job, allowed) if self.explain else ""
            self.waits(job, self.failed[shape])
        return roomy

    def _started(self, job: PendingJob, host: str, gpus: tuple[int, ...]) -> None:
        if self.box_room:
            self.box_room.take(job, host)
        self.result.starts.append(Start(job.id, host, gpus))
        self.held_gpus[job.user] = self.held_gpus.get(job.user, 0) + job.spec.gpus
        self.failed.clear()

    def _cpu_only(self, job: PendingJob, allowed: list[str], shape: tuple) -> bool:
        """Start a CPU-only job on the first allowed host with a free CPU slot, or say why not."""
        host = next((h for h in allowed if self.cpu_free[h] > 0), None)
        if host is None:
            self.failed[shape] = reasons.why_cpu(job.spec, allowed, self.hosts, self.drained)
            return False
        self.cpu_free[host] -= 1
        self._started(job, host, ())
        self._update_room()
        return True

    def ordinary(self, job: PendingJob) -> None:
        if not self.explain and (self.gpu_full if job.spec.gpus else self.cpu_full):
            return
        if not self.explain and job.spec.gpus and self.ends_by(job) > self.backfill_until:
            return  # only reserved memory is left, and it would still run when that is due
        if not self._may_place(job):
            return
        spec = job.spec
        allowed, runtime, shape = self._allowed(job)
        if shape in self.failed:
            self.waits(job, self.failed[shape])
            if spec.gpus:
                self._not_reserved(tried=False)
            return
        if allowed and self.box_room and not (allowed := self._box_room_for(self.box_room, job, allowed, shape)):
            return  # no box has the cores or memory it holds (said)
        if spec.gpus == 0:
            if not self._cpu_only(job, allowed, shape):
                self.waits(job, self.failed[shape])
            return
        ends_by = self.ends_by(job)
        mps_user = self._mps_user(job)
        mine = self._gpus_for(job, allowed, ends_by, mps_user)
        own = spec.gpus if _needs_whole(spec, self.largest) else 0  # its own demand, if placed now
        choice = self._choose(job, mine, ends_by, mps_user, own)
        if choice is not None and self._frees_before_they_yield(job, choice, mine):
            choice = None  # it waits (reserved for, where it is the head) for the GPU that frees
        if choice is not None:
            self._place(job, choice, ends_by)
            self.placed_whole += own
            self._update_room()
            return
        tried = not self.reserved and self._may_reserve(job)
        # EASY backfill protects one job: the first in order whose start the running jobs'
        # limits tell. One whose GPUs run a job without a limit cannot be protected (nothing
        # tells when it could start), and the next may be: a head held to a box of such jobs
        # left a wide job behind it to a stream of short ones on the other box.
        # Every GPU it may use but for bookings to come: the reservation judges those itself
        # (never on one booked for someone else later) and its reason names them.
        if tried and self._reserve(job, self._gpus_for(job, allowed, None, mps_user) if self.booked_later else mine):
            self.reserved = True
            self._update_room()
            return
        self._not_reserved(tried)
        if shape not in self.failed:
            self.failed[shape] = self._why_waiting(job, allowed, mine) if self.explain else ""
        self.waits(job, self.failed[shape])

    def _frees_before_they_yield(self, job: PendingJob, choice: list[Slot], mine: list[Slot]) -> bool:
        """Whether, where `choice` would tell opportunistic jobs to yield, a GPU without them
        frees for the job (its ordinary jobs' limits, or their stops, and a grace) no later
        than those jobs would be gone (their graces): then it waits for that GPU, and nobody
        loses work (a member's low job with `grace: 60s` was preempted for a job that started,
        five seconds later, on the GPU a job at its limit left)."""
        victims = [v for s in choice for v in s.victims]
        if not victims:
            return False
        gone_by = self.now + max(v.stop_grace(self.config.grace_s) for v in victims)
        clear = [s for s in mine if not s.victims and s.held_for in (None, job.id)]
        found = placement.earliest_start(job.spec, clear, self.ending, self.config.max_jobs_per_gpu)
        return found is not None and found[0] <= gone_by

    def _may_reserve(self, job: PendingJob) -> bool:
        return self.config.reservations and self.now - job.queued_at >= self.config.reserve_after_s

    def _not_reserved(self, tried: bool) -> None:
        """A job that can neither start nor be reserved for, walked while no job has this
        pass's reservation (`tried`: a reservation was looked for). The pass stops looking
        after RESERVE_DEPTH tries, or at once while no GPU frees by a known limit (then no job
        can be reserved for, and a worker's pass on a full cluster stops walking the queue)."""
        if self.reserved or not self.config.reservations:
            return
        self.reserve_tries += tried
        if self.reserve_tries >= RESERVE_DEPTH or not self.known_end:
            self.reserved = True
            self._update_room()

    def _gpus_for(self, job: PendingJob, allowed: list[str], ends_by: float | None, mps_user: str | None) -> list[Slot]:
        """The GPUs an ordinary job may use: on the hosts it may run on, not booked for someone
        else now or before it would end (`ends_by`; None: whenever it ends), and serving its
        MPS user if it has one."""
        # Every host allowed (most jobs): every slot, without asking each.
        mine = list(self.slots) if len(allowed) == len(self.hosts) else [s for s in self.slots if s.host in allowed]
        if self.booked:
            mine = [s for s in mine if s.booked_for in (None, job.user)]
        if self.booked_later and ends_by is not None:  # it must be gone before someone else's booking begins
            mine = [s for s in mine if setasides.booked_before(s, job.user, ends_by) is None]
        if mps_user:
            mine = [s for s in mine if placement.serves_mps_user(s, mps_user)]
        return mine

    def _choose(
        self, job: PendingJob, mine: list[Slot], ends_by: float, mps_user: str | None, own: int
    ) -> list[Slot] | None:
        """Where among `mine` the job starts now, if anywhere: its owner's booked GPUs first,
        then (spreading) beside jobs that leave it compute or on GPUs to spare, else the best fit."""
        spec = job.spec
        choice = None
        if self.booked:  # the GPUs its owner booked first: on others, it would take what others wait for
            booked = [s for s in mine if s.booked_for == job.user]
            choice = booked and placement.best_fit(
                spec,
                booked,
                self.config.max_jobs_per_gpu,
                fragmentation_aware=self.config.fragmentation_aware,
                ends_by=ends_by,
            )
            if choice:
                return choice  # low jobs there yield to the booking's owner
        # Spreading is for time-sliced GPUs, where jobs that share one slow each other; an MPS
        # job runs on its compute share alone or not (model/sharing.py), so MPS jobs pack.
        if self.config.spread and not choice and not mps_user:
            choice = self._spread(spec, mine, ends_by, own)
        if choice and not any(s.victims for s in choice):
            return choice
        packed = placement.best_fit(
            spec,
            mine,
            self.config.max_jobs_per_gpu,
            fragmentation_aware=self.config.fragmentation_aware,
            ends_by=ends_by,
        )
        # Spreading is worth no preemption: where it would tell opportunistic jobs to yield (they
        # lose their work, and the job waits out their grace) and packing tells none, pack (a
        # member: two low jobs lost their work to a job that could share a GPU now). Packing
        # takes no more of the empty GPUs than spreading.
        if choice and (packed is None or any(s.victims for s in packed)):
            return choice
        return packed

    def _spread(self, spec: JobSpec, mine: list[Slot], ends_by: float, own: int) -> list[Slot] | None:
        """A place that keeps empty GPUs whole for those who need them: beside jobs whose declared
        compute leaves room, or on GPUs to spare; None (or empty) when there is neither."""
        # A job that declares its share of compute (gpu_compute) first joins a GPU whose
        # jobs' declared shares leave room for it: neither slows the other, and it keeps
        # an empty GPU whole for jobs that need one.
        beside = (
            []
            if spec.exclusive
            else [  # a whole-GPU job never fits beside another
                s for s in mine if not s.ordinary_empty and s.compute_room >= compute_of(spec.gpu_compute_pct)
            ]
        )
        choice = beside and placement.best_fit(
            spec,
            beside,
            self.config.max_jobs_per_gpu,
            fragmentation_aware=self.config.fragmentation_aware,
            ends_by=ends_by,
        )
        spare = [] if choice else self._spare_for_spreading(mine)
        # GPUs to spare beyond what waiting jobs need whole: never join a busy one.
        if spare and not self.demand_over(len(spare) - spec.gpus + own):
            choice = placement.best_fit(
                spec,
                spare,
                self.config.max_jobs_per_gpu,
                spread=True,
                fragmentation_aware=self.config.fragmentation_aware,
                ends_by=ends_by,
            )
        return choice

    def _spare_for_spreading(self, slots: list[Slot]) -> list[Slot]:
        """Empty GPUs a job may spread onto: any, while at least half the team's GPUs have no
        ordinary work; none beyond that. Spreading on a busier cluster uses up the empty GPUs
        that whole-GPU and wide jobs need, and a few small jobs that run for weeks, one on each
        box, keep every box from being whole again (measured: bench/simulate_traces.py)."""
        if not self.room_to_spare:
            return []  # over half the GPUs in use: pack
        return [s for s in slots if s.ordinary_empty and not s.busy_by_others]

    def _place(self, job: PendingJob, chosen: list[Slot], ends_by: float) -> None:
        """Start it, or, where opportunistic jobs are on its GPUs, make exactly those yield and
        hold the GPUs for it (nothing else may slip in) until it starts in a later pass."""
        yielding = [s for s in chosen if s.opp_jobs]
        mps_user = self._mps_user(job)
        for s in chosen:  # a reservation computed later this pass sees it end by its limit
            self.ending.setdefault((s.host, s.index), []).append((ends_by, placement.need_mib(job.spec, s)))
        self.known_end = self.known_end or ends_by != float("inf")
        if not yielding:
            placement.take(job.spec, chosen, job.id, mps_user=mps_user, ends_by=ends_by)
            self._started(job, chosen[0].host, tuple(s.index for s in chosen))
            return
        for s in yielding:
            for victim in s.victims:
                if victim.id not in self.result.preempts:
                    self._tell_to_yield(victim, s, f"job {job.id} needs its GPU memory")
        _forget_told(self.slots, self.result.preempts)
        placement.take(job.spec, chosen, job.id, hold="hard", mps_user=mps_user)
        self.held_gpus[job.user] = self.held_gpus.get(job.user, 0) + job.spec.gpus
        self.result.held[job.id] = (chosen[0].host, tuple(s.index for s in chosen))
        if self.explain:
            waiting_for = sorted({j for s in yielding for j in self.draining.get((s.host, s.index), ())})
            self.waits(  # it waits, as the jobs behind it count
                job,
                f"GPU {', '.join(s.label for s in chosen)} held for it: "
                + (f"waiting for {', '.join(waiting_for)} to yield" if waiting_for else "draining"),
            )

    def _reserve(self, job: PendingJob, slots: list[Slot]) -> bool:
        """EASY backfill: the head of the queue, which fits nowhere now, gets the GPUs where
        the running jobs' time limits free room for it soonest; from then on a job may use
        that room only if it ends (by its own limit) before the head is due to start. With
        no limit known on the GPUs it waits for, no reservation: nothing would tell when."""
        # Not on GPUs someone else has booked from some later moment: when the head would
        # start, and so whether it would run into the booking, is what this computes.
        own: list[Slot] = []
        others: list[Slot] = []  # booked for someone else later: left out (its reason says so)
        for s in slots:
            if s.busy_by_others:
                continue
            if not s.booked_later or all(owner == job.user for _, owner in s.booked_later):
                own.append(s)
            else:
                others.append(s)
        found = placement.earliest_start(job.spec, own, self.ending, self.config.max_jobs_per_gpu)
        if found is None:
            return False
        start, chosen = found
        placement.reserve(job.spec, chosen, job.id, start)
        guessed = self._learned_on(chosen)
        if not guessed:  # due by limits: low jobs there are told in time for it
            self._yield_in_time(job, chosen, start)
        gpus = tuple(s.index for s in chosen)
        self.result.reserved[job.id] = (chosen[0].host, gpus, start)
        if self.explain:
            reason = (
                f"GPU {', '.join(s.label for s in sorted(chosen, key=lambda s: s.index))} reserved for it from "
                f"{moment(start, self.now)}, "
                + (
                    "when the jobs there must have ended (their time limits, and a stop's grace)"
                    if not guessed
                    else "when the jobs there should have ended (their time limits, or for "
                    f"{', '.join(guessed)} without one its kind's longest recent run; and a stop's grace)"
                )
            )
            if others:
                soonest = moment(min(t for s in others for t, owner in s.booked_later if owner != job.user), self.now)
                labels = ", ".join(s.label for s in others)
                reason += f"; not on GPU {labels}: booked for others from {soonest}"
            self.waits(job, reason)  # it waits, as the jobs behind it count
        return True

    def _yield_in_time(self, job: PendingJob, chosen: list[Slot], start: float) -> None:
        """Opportunistic jobs on the head's reserved GPUs yield when it comes. The head is due
        when the jobs there must have ended: their limits and a stop's grace; most leave at
        SIGTERM, at their limits. An opportunistic job whose stop (its own grace) would run
        past that is told in time (_told_by), so the head does not wait out its grace once
        its GPUs are free; the plan says when it must be made again for that. Not called where
        a job there has no limit, only its kind's usual run: it may run on, and the reservation
        go (they yield when the head comes)."""
        for s in chosen:
            for victim in s.victims:
                if victim.id in self.result.preempts:
                    continue
                told_by = self._told_by(start, victim.stop_grace(self.config.grace_s))
                if told_by <= self.now:
                    why = f"job {job.id} is due on its GPU {moment(start, self.now)}, sooner than its grace"
                    self._tell_to_yield(victim, s, why)
                else:
                    self.result.recheck_at = min(self.result.recheck_at, told_by)
        _forget_told(self.slots, self.result.preempts)

    def _tell_to_yield(self, victim: RunningJob, slot: Slot, why: str) -> None:
        """An opportunistic job on `slot` told to yield; a job held there later in this pass
        names it among those it waits for (a member's status said "draining")."""
        self.result.preempts[victim.id] = why
        if self.explain:
            self.draining.setdefault((slot.host, slot.index), []).append(victim.id)

    def _learned_on(self, chosen: list[Slot]) -> list[str]:
        """The running jobs on these GPUs whose end is their kind's usual run, not a limit."""
        on = {(s.host, s.index) for s in chosen}
        return sorted(r.id for r in self.running if r.limit_learned and on & {(r.host, i) for i in r.gpus})

    def _told_by(self, due: float, grace: float) -> float:
        """When an opportunistic job with this grace on GPUs reserved from `due` is told to
        yield: its grace, a poll, and the ordinary jobs' stop grace before (see _yield_in_time)."""
        return due - self.config.grace_s - grace - self.config.poll_interval

    def opportunistic(self, job: PendingJob, in_window: bool) -> None:
        if not self._may_place(job):
            return
        spec = job.spec
        allowed, runtime, shape = self._allowed(job)
        if shape not in self.failed:
            if spec.gpus == 0:
                if self._cpu_only(job, allowed, shape):
                    return
            elif not in_window:
                self.failed[shape] = f"outside window {describe(self.config.idle_windows)}"
            else:
                mine = reachable = [s for s in self.slots if s.host in allowed]
                if mps_user := self._mps_user(job):
                    mine = [s for s in mine if placement.serves_mps_user(s, mps_user, opportunistic=True)]
                # Told to yield when the head comes, a job with a longer grace than the config's
                # could keep the head waiting that long (a day, at most): not on its GPUs.
                # Nor on reserved GPUs it would be told to leave at once (_yield_in_time).
                grace = stop_grace_s(spec.grace_s, True, self.config.grace_s)
                lingers = grace > self.config.grace_s
                usable = [
                    s
                    for s in mine
                    if s.reserved_from == float("inf")
                    or (not lingers and self._told_by(s.reserved_from, grace) > self.now + self.config.poll_interval)
                ]
                choice = placement.best_fit(
                    spec,
                    usable,
                    self.config.max_jobs_per_gpu,
                    opportunistic=True,
                    fragmentation_aware=self.config.fragmentation_aware,
                )
                if choice is not None:
                    placement.take_opportunistic(spec, choice, mps_user)
                    self._started(job, choice[0].host, tuple(s.index for s in choice))
                    return
                self.failed[shape] = (
                    (mps_user and reasons.why_mps(spec, mps_user, reachable, self.config.max_jobs_per_gpu, True))
                    or reasons.why_lingers(
                        spec,
                        [s for s in mine if s.reserved_from != float("inf") and not any(s is u for u in usable)],
                        self.config.max_jobs_per_gpu,
                        grace,
                        lingers,
                        self.now,
                    )
                    or reasons.why_opportunistic(spec, allowed, mine, self.hosts, self.config)
                    if self.explain
                    else ""
                )
        self.waits(job, self.failed[shape])

    def _mps_user(self, job: PendingJob) -> str | None:
        """The job's owner, if the job will run under MPS (which serves one user per GPU)."""
        return job.user if uses_mps(job.spec, self.config) else None

    def _why_waiting(self, job: PendingJob, allowed: list[str], mine: list[Slot]) -> str:
        """An ordinary job that fits nowhere now: what keeps it, in the order a user acts on it."""
        spec, config, max_jobs = job.spec, self.config, self.config.max_jobs_per_gpu
        reachable = [s for s in self.slots if s.host in allowed]
        ends_by = self.ends_by(job)
        mps_user = self._mps_user(job)
        return (
            (mps_user and reasons.why_mps(spec, mps_user, reachable, max_jobs))
            or reasons.why_booked(spec, job.user, mine, reachable, config, ends_by, self.now, self._runs_for(job))
            or reasons.why_held(mine, job.id, spec, ends_by - self.now, self.now, self._runs_for(job), max_jobs)
            or reasons.why_gpu(spec, allowed, mine or reachable, self.hosts, config, self.drained)
        )


def _yield_to_people_and_windows(
    running: Sequence[RunningJob], slots: Sequence[Slot], in_window: bool, config: Config, result: Plan, booked: Mapping
) -> None:
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
        slot_taken = [
            b
            for i in job.gpus
            if (b := booked.get((job.host, i))) is not None and b.owner != job.user and job.started_at < b.start
        ]
        if slot_taken:
            b = slot_taken[0]
            result.preempts[job.id] = (
                f"GPU {b.host}:{','.join(map(str, b.gpus))} booked for {b.owner} from {hhmm(b.start)}"
            )
    if result.preempts:  # their memory stays counted until they exit
        _forget_told(slots, result.preempts)


def _forget_told(slots: Sequence[Slot], preempts: Mapping[str, str]) -> None:
    """Jobs told to yield are no GPU's victims any more: a victim on several GPUs yields them
    all, and is never picked (or told) twice."""
    for s in slots:
        if s.victims:
            s.victims = tuple(v for v in s.victims if v.id not in preempts)
