"""`gpuq simulate`: replay a job trace on a virtual clock through the real `plan`.

Boxes pass at the moments the workers' wake rules give (timing.py, from host/wake.py; README.md here
lists them): a job's end wakes its box at once; a change of jobs/ (a drop, another box's claim,
a job put back) is read by each box at its watch's next look, no sooner than half a second
after its last pass began, or at its poll, whichever comes first; a box whose last plan gave
it a part plans again at its poll. At each pass the pending jobs that box has read, the
running jobs and the simulated GPUs go to `plan` exactly as a worker would pass them: the box
acts on its own part of the team's plan, and a box with starts for another pokes it, and
that one plans again after the first one's starts. Its
starts start, its preemptions stop jobs (each runs on for its grace, then frees its memory
and goes back to the queue at its old place, to restart from the beginning). A job still
running at its time limit is stopped then, as its supervisor stops it. No decision uses a
job's true duration: only the clock moves by it.

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
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Callable

from gpuq.extras.sim.timing import PassTiming, same_moment_tolerance
from gpuq.extras.sim.trace import Cluster, TraceJob
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, PendingJob, Plan, RunningJob, Start
from gpuq.model.sharing import compute_pct, uses_mps
from gpuq.model.usage import UsageLedger
from gpuq.model.windows import window_open
from gpuq.sched.plan import plan

# (pending, hosts, running, now, each user's decayed usage of ended jobs) -> its plan: starts,
# preemptions, and when time alone changes it (Plan.recheck_at)
Planner = Callable[[list[PendingJob], list[HostView], list[RunningJob], float, dict[str, float]], Plan]


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
    limit_at: float = math.inf  # its time limit: its supervisor stops it then (run/limits.py)


@dataclass
class Outcome:
    """What happened to every job, and the integrals the figures need."""

    waits: dict[str, float] = field(default_factory=dict)  # job id -> final start - submit
    ends: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    timeouts: int = 0  # jobs stopped at their time limit (slowed by co-located jobs, or a trace's limit)
    busy_gpu_s: float = 0.0  # GPU-seconds with a job on the GPU, until the last arrival
    last_submit: float = 0.0
    waiting_s: float = 0.0  # seconds with at least one job pending
    free_while_waiting_gpu_s: float = 0.0  # GPU-seconds wholly free while a job waited
    peak_queue: int = 0
    first_submit: float = 0.0
    gpus: int = 0


def plan_policy(config: Config) -> Planner:
    """gpuq's own planner (or a baseline built from it by config: pack-bestfit)."""

    def decide(pending, hosts, running, now, usage):
        return plan(pending, hosts, running, config, now, explain=False, usage=usage)

    return decide


def fifo_exclusive(
    pending: list[PendingJob], hosts: list[HostView], running: list[RunningJob], now: float, usage: dict[str, float]
) -> Plan:
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
    return Plan(starts, {}, [])


def replay(
    jobs: list[TraceJob],
    cluster: Cluster,
    decide: Planner,
    grace_s: float,
    exclusive: bool = False,
    config: Config | None = None,
    timing: PassTiming | None = None,
    colocation_penalty: float = 0.0,
) -> Outcome:
    """Run the trace to its end; `exclusive`: every job holds its GPUs whole (fifo-exclusive);
    `config`: how jobs share a GPU (gpu_sharing), as the planner's config says; `timing`: the
    moments the workers' passes run (timing.py), or None: every box passes at each event;
    `colocation_penalty`: what a job loses besides, while another job shares its GPU (0.15:
    15%, as many of Gavel's measured pairs of models lose beyond time-slicing)."""
    replayed = _Replay(jobs, cluster, decide, grace_s, exclusive, config, timing)
    replayed.colocation_penalty = colocation_penalty
    return replayed.run()


class _Replay:
    """The virtual cluster and clock of one replay."""

    def __init__(
        self,
        jobs: list[TraceJob],
        cluster: Cluster,
        decide: Planner,
        grace_s: float,
        exclusive: bool,
        config: Config | None,
        timing: PassTiming | None,
    ) -> None:
        self.jobs, self.decide, self.grace_s, self.timing = jobs, decide, grace_s, timing
        self.colocation_penalty = 0.0
        self.hosts = [
            HostView(f"h{h}", tuple(GpuSnapshot(i, f"GPU-h{h}-{i}", "sim", mem_mib, 0) for i in range(gpus)), 0)
            for h, (gpus, mem_mib) in enumerate(cluster.host_shapes())
        ]
        self.names = [h.name for h in self.hosts]
        self.by_id = {j.id: j for j in jobs}
        self.out = Outcome(first_submit=jobs[0].submit_s, last_submit=jobs[-1].submit_s, gpus=cluster.gpus)
        self.pending: dict[str, PendingJob] = {}
        self.runs: dict[str, _Run] = {}
        self.views: dict[str, RunningJob] = {}
        self.on_gpu: dict[tuple[str, int], set[str]] = {(h.name, g.index): set() for h in self.hosts for g in h.gpus}
        self.busy_gpus = 0  # GPUs with a job on them: counted as jobs come and go, not at every event
        self.mps = {j.id for j in jobs if config is not None and not exclusive and uses_mps(j.spec, config)}
        util = {j.id: (100.0 if exclusive else j.util) for j in jobs}
        self.load_of = {
            j.id: util[j.id] * (compute_pct(j.spec, cluster.mem_mib) / 100 if j.id in self.mps else 1.0) for j in jobs
        }
        self.ends: list[tuple[float, int, str, int]] = []  # (time, tiebreak, job id, version)
        # What each user ran, for fair share (sched/fairshare.py): a job counts its GPUs, a
        # shared GPU the share of its memory declared, as the plan counts them.
        # Every user of the trace has an equal share, as every member of a team does (and as
        # slurm-easy gives them): the ledger knows them all from the start.
        self.usage = UsageLedger((config or Config()).fair_share_half_life_s, users={j.user: 0.0 for j in jobs})
        self.gpu_mem = {h.name: h.gpus[0].mem_total_mib for h in self.hosts}
        self.exclusive = exclusive
        self.seq = 0
        self.next_arrival = 0
        self.now = jobs[0].submit_s
        # When each box last passed and last read jobs/ (timing), and when each pending job came
        # into jobs/ (dropped, or put back by a preemption): a box knows the jobs that came
        # before its last read. Without timing every box passes at every event, knowing all.
        self.last_pass = {h: -math.inf for h in self.names}
        self.last_read = dict(self.last_pass)
        self.in_jobs: dict[str, float] = {}
        self.entries: list[tuple[float, str]] = []  # (came into jobs/, job id), in time order
        self.unread_from = {h: 0 for h in self.names}  # per box: entries before this are read or gone
        # Per box, the first claim by another box since it last read jobs/: a claim renames a
        # spec out of jobs/, and that wakes the other boxes' watches too.
        self.claimed_since = {h: math.inf for h in self.names}
        # Boxes whose last plan gave them a part: the worker plans again at its next poll (its
        # own starts change the queue's order), with or without news.
        self.replan: set[str] = set()
        self.windows = config.idle_windows if config is not None else ()
        self.version = 0  # counts changes of the pending and running jobs
        # What a plan that found nothing saw: (version, jobs known, idle window open). A pass
        # that would see the same skips its plan, as the worker's does (worker/loop.py).
        self.nothing_for: tuple[int, int, bool] | None = None
        self.last_plan: tuple = (None, None)  # (what the last plan saw, and when), and what it decided
        # Per box, its last plan's Plan.recheck_at: the box plans again then, as a worker does.
        self.recheck_at: dict[str, float] = {}

    def run(self) -> Outcome:
        while True:
            reads = self._next_reads()
            recheck = min(self.recheck_at.values(), default=math.inf)
            t = min(self._next_arrival(), self._next_end(), min(reads.values(), default=math.inf), recheck)
            if t == math.inf:
                return self.out
            woken = {h for h, at in self.recheck_at.items() if at <= t}
            if woken:
                self.recheck_at = {h: at for h, at in self.recheck_at.items() if h not in woken}
                self.nothing_for = None
            _integrate(self.out, self.busy_gpus, len(self.on_gpu), bool(self.pending), self.now, t)
            self.now = t
            freed = self._end_due()
            self._arrive()
            self.out.peak_queue = max(self.out.peak_queue, len(self.pending))
            if freed:
                self._set_rates(freed)
            moment = t + same_moment_tolerance(t)
            readers = {h for h, at in reads.items() if at <= moment}
            self._passes(self._due({h for h, _ in freed} | woken, readers))

    def _next_arrival(self) -> float:
        return self.jobs[self.next_arrival].submit_s if self.next_arrival < len(self.jobs) else math.inf

    def _next_end(self) -> float:
        ends, runs = self.ends, self.runs
        while ends and (ends[0][2] not in runs or runs[ends[0][2]].version != ends[0][3]):
            heapq.heappop(ends)  # superseded by a rate change or a preemption
        return ends[0][0] if ends else math.inf

    def _next_reads(self) -> dict[str, float]:
        """For each box with a change of jobs/ it has not read, or a plan to make again, when
        its next pass (which reads jobs/) begins."""
        if self.timing is None:
            return {}
        reads = {}
        for h in self.names:
            i = self.unread_from[h]
            while i < len(self.entries) and self.in_jobs.get(self.entries[i][1]) != self.entries[i][0]:
                i += 1  # started since (or put back again later: a later entry)
            self.unread_from[h] = i
            at = [self.timing.reads_change(self.last_pass[h], self.entries[i][0])] if i < len(self.entries) else []
            if self.claimed_since[h] < math.inf:
                at.append(self.timing.reads_change(self.last_pass[h], self.claimed_since[h], after_pass=True))
            if h in self.replan:
                at.append(self.last_pass[h] + self.timing.poll_s)
            if at:
                reads[h] = min(at)
        return reads

    def _into_jobs(self, job: TraceJob) -> None:
        self.pending[job.id] = PendingJob(job.id, job.user, job.spec, job.submit_s)
        self.version += 1
        if self.timing is not None:
            self.in_jobs[job.id] = self.now
            self.entries.append((self.now, job.id))

    def _end_due(self) -> set[tuple[str, int]]:
        """Jobs whose end has come leave their GPUs; a preempted one goes back to its old
        place in the queue, to start over. The GPUs freed."""
        freed: set[tuple[str, int]] = set()
        while self.ends and self.ends[0][0] <= self.now:
            _, _, jid, version = heapq.heappop(self.ends)
            run = self.runs.get(jid)
            if run is None or run.version != version:
                continue
            view = self.views.pop(jid)
            del self.runs[jid]
            mem = view.gpu_mem_mib
            share = 1.0 if self.exclusive or mem is None else min(1.0, mem / self.gpu_mem[run.host])
            self.usage.add(view.user, len(run.gpus) * share, run.start, self.now)
            for i in run.gpus:
                on = self.on_gpu[(run.host, i)]
                if jid in on:
                    on.remove(jid)
                    self.busy_gpus -= not on  # its last job left
                freed.add((run.host, i))
            self.version += 1
            if run.stop_at is not None:
                self._into_jobs(self.by_id[jid])
            else:
                self.out.ends[jid] = self.now
                # Stopped at its limit with work left (a trace job is taken to exit on SIGTERM).
                self.out.timeouts += run.remaining - (self.now - run.since) * run.rate > 1e-6
        return freed

    def _arrive(self) -> None:
        while self.next_arrival < len(self.jobs) and self.jobs[self.next_arrival].submit_s <= self.now:
            self._into_jobs(self.jobs[self.next_arrival])
            self.next_arrival += 1

    def _due(self, woken: set[str], readers: set[str]) -> list[tuple[str, bool]]:
        """The boxes that pass now, in turn, and whether each reads jobs/. A job's end wakes
        its box at once (it reads jobs/ unless it read it just now); a box whose watch or poll
        comes reads what came into jobs/ since it last read it. Without timing every box
        passes, the box an end woke first."""
        first = sorted(woken)
        if self.timing is None:
            return [(h, True) for h in first + [h for h in self.names if h not in woken]]
        due = [(h, h in readers or self.timing.end_reads_jobs(self.last_read[h], self.now)) for h in first]
        return due + [(h, True) for h in self.names if h in readers and h not in woken]

    def _known_count(self, box: str) -> int:
        """How many pending jobs the box has read: a prefix of `pending`, which jobs enter (or
        re-enter, put back) in the order they come into jobs/. Counted from the end, where
        the few it has not read yet are: a pass it then skips costs nothing like the queue."""
        last, unread = self.last_read[box], 0
        for job in reversed(self.pending.values()):
            if self.in_jobs.get(job.id, -math.inf) <= last:
                break
            unread += 1
        return len(self.pending) - unread

    def _passes(self, due: list[tuple[str, bool]]) -> None:
        """Boxes pass in turn; each plans over the whole team with the specs it has read, acts
        on its own part (worker/loop.py), and pokes the boxes its plan gives a part: they pass
        next, after its starts, and read jobs/."""
        if self.timing is not None:  # passes that begin together read jobs/ before any of them claims
            for box, reads in due:
                self._begin_pass(box, reads)
        for _ in range(3 * len(self.hosts)):
            if not due:
                return
            box, _ = due.pop(0)
            count = self._known_count(box)
            seen = (self.version, count, window_open(self.windows, self.now))
            if not count or seen == self.nothing_for:
                self.replan.discard(box)
                continue
            if self.last_plan[0] == (seen, self.now):  # the plan is pure: the same inputs, the same plan
                decided = self.last_plan[1]
            else:
                known = list(itertools.islice(self.pending.values(), count))
                decided = self.decide(
                    known, self.hosts, list(self.views.values()), self.now, self.usage.as_of(self.now)
                )
                self.last_plan = ((seen, self.now), decided)
            starts, preempts = decided.starts, decided.preempts
            self.recheck_at[box] = decided.recheck_at
            parts = {s.host for s in starts} | {self.runs[v].host for v in preempts}
            self.nothing_for = None if parts else seen
            if box in parts:
                self.replan.add(box)
            else:
                self.replan.discard(box)
            if not parts and self.timing is None:
                return  # every box sees what this one saw: nothing for anyone
            for victim in preempts:
                if self.runs[victim].host == box:
                    self._stop(victim)
            changed: set[tuple[str, int]] = set()
            for s in starts:
                if s.host == box:
                    changed |= self._start(s)
            if changed:
                self._set_rates(changed)
                if self.timing is not None:  # its own claims are no news to it (worker/loop.py)
                    for h in self.names:  # a claim comes after the passes begun now read jobs/
                        if h != box:
                            self.claimed_since[h] = min(self.claimed_since[h], self.now)
            others = parts - {box}
            poked = [h for h in self.names if h in others]
            due[:] = [(h, True) for h in poked] + [(h, r) for h, r in due if h not in poked]
            if self.timing is not None:  # a poke wakes a box: it passes, reading jobs/, after these starts
                for h in poked:
                    self._begin_pass(h, True)

    def _begin_pass(self, box: str, reads: bool) -> None:
        self.last_pass[box] = self.now
        if reads:
            self._read_jobs(box)

    def _read_jobs(self, box: str) -> None:
        self.last_read[box] = self.now
        self.unread_from[box] = len(self.entries)
        self.claimed_since[box] = math.inf

    def _start(self, s: Start) -> set[tuple[str, int]]:
        job, now = self.by_id[s.job_id], self.now
        del self.pending[s.job_id]
        self.in_jobs.pop(s.job_id, None)
        self.version += 1
        self.out.waits[s.job_id] = now - job.submit_s
        self.seq += 1
        limit_at = now + job.spec.time_limit_s if job.spec.time_limit_s else math.inf
        self.runs[s.job_id] = _Run(
            job, now, s.host, s.gpus, job.duration_s, since=now, version=self.seq, limit_at=limit_at
        )
        self.views[s.job_id] = RunningJob(
            s.job_id,
            job.user,
            s.host,
            s.gpus,
            job.spec.gpu_mem_mib,
            preemptible=job.spec.preemptible,
            priority_class=job.spec.priority_class,
            started_at=now,
            mps=s.job_id in self.mps,
            compute_pct=job.spec.gpu_compute_pct,
            limit_s=job.spec.time_limit_s,
        )
        heapq.heappush(self.ends, (min(now + job.duration_s, limit_at), self.seq, s.job_id, self.seq))
        for i in s.gpus:
            on = self.on_gpu[(s.host, i)]
            self.busy_gpus += not on  # its first job came
            on.add(s.job_id)
        return {(s.host, i) for i in s.gpus}

    def _stop(self, victim: str) -> None:
        """A preempted job runs on for its grace, then leaves (see _end_due)."""
        run = self.runs[victim]
        if run.stop_at is None:
            self.seq += 1
            run.stop_at, run.version = self.now + self.grace_s, self.seq
            self.views[victim] = replace(self.views[victim], stopping=True)
            self.out.preemptions += 1
            self.version += 1
            heapq.heappush(self.ends, (run.stop_at, self.seq, victim, run.version))

    def _set_rates(self, gpu_keys: set[tuple[str, int]]) -> None:
        """The jobs on these GPUs run at the rate their GPUs' load allows from now on."""
        t = self.now
        for jid in {jid for key in gpu_keys for jid in self.on_gpu[key]}:
            run = self.runs[jid]
            load = max(sum(self.load_of[o] for o in self.on_gpu[(run.host, i)]) for i in run.gpus)
            rate = min(1.0, 100.0 / load) if load > 0 else 1.0
            if self.colocation_penalty and any(len(self.on_gpu[(run.host, i)]) > 1 for i in run.gpus):
                rate *= 1.0 - self.colocation_penalty
            if run.stop_at is None and rate != run.rate:
                run.remaining -= (t - run.since) * run.rate
                self.seq += 1
                run.since, run.rate, run.version = t, rate, self.seq
                heapq.heappush(self.ends, (min(t + run.remaining / rate, run.limit_at), self.seq, jid, run.version))


def _integrate(out: Outcome, busy: int, gpus: int, waiting: bool, t0: float, t1: float) -> None:
    """From t0 to t1, `busy` of the `gpus` GPUs had a job on them."""
    dt = t1 - t0
    if dt <= 0:
        return
    # Occupancy is measured while work arrives: the drain after the last arrival (a few long
    # jobs alone) would make a policy that finishes more work look emptier.
    out.busy_gpu_s += busy * max(0.0, min(t1, out.last_submit) - t0)
    if waiting:
        out.waiting_s += dt
        out.free_while_waiting_gpu_s += (gpus - busy) * dt
