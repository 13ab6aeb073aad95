"""The worker loop of one host: observe, settle, obey controls, take in specs, plan and
start, report; then sleep until the poll interval ends or a job's exit wakes it.

Each pass is a short ordered list of named steps (see `STEPS`), run by `run_pass` at the
times the worker's `Clock` gives (tests drive passes in-process: tests/harness.py). Crash
recovery (requeues, settling lost attempts, taking over dead hosts) is in worker/recovery.py.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from gpuq import __version__, hooks
from gpuq.host import rootorders
from gpuq.host.clock import Clock
from gpuq.host.files import atomic_write, write_json
from gpuq.host.hostinfo import boot_id, ensure_private_dir
from gpuq.host.jobmemory import observe_job_memory
from gpuq.host.owners import OwnerPolicy
from gpuq.host.probe import Probe
from gpuq.host.usage import GpuUsage
from gpuq.host.wake import EXIT_WAKE_SCAN_GAP_S, JOBS_WATCH_GAP_S, WAKE_JOB_ENDED, QueueLock, WakeFifo, mtime_ns
from gpuq.model.config import Config, extras_settings
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, Plan, RunningJob, SetAside, Start
from gpuq.model.markers import Phase
from gpuq.model.record import Record
from gpuq.model.stops import Stop
from gpuq.model.strict_yaml import load_yaml
from gpuq.model.windows import window_open
from gpuq.run.joblocal import (
    Runtime,
    finish_local,
    has_ended,
    job_roots,
    read_marker,
    request_stop,
    settle_lock,
    write_lease,
)
from gpuq.run.spawner import Spawner
from gpuq.sched.estimate import learned_runs
from gpuq.sched.idle import IdleTracker
from gpuq.sched.overuse import GpuMemWatch
from gpuq.sched.plan import plan
from gpuq.spool.applying import apply_one
from gpuq.spool.cancel import cancel_pending
from gpuq.spool.deps import DependencyStates, gates
from gpuq.spool.dirwatch import MtimeWatch
from gpuq.spool.drain import drain_file
from gpuq.spool.history import UsageHistory
from gpuq.spool.ids import migrate as migrate_ids
from gpuq.spool.inbox import fair_order, leftovers, sweep_replies, waiting
from gpuq.spool.intake import Intake
from gpuq.spool.layout import Layout
from gpuq.spool.listing import RunningListing
from gpuq.spool.sweeps import finish_interrupted
from gpuq.spool.teamstate import (
    TeamPicture,
    heartbeat_alive,
    live_window_s,
    load_heartbeats,
    picture,
    poke_box,
    poke_path,
    running_elsewhere,
)
from gpuq.worker.arrivals import Arrivals, PendingLimits
from gpuq.worker.box import Box
from gpuq.worker.ended import FinishedCounter
from gpuq.worker.offers import OfferFinder, Offers, start_offers, start_sharing
from gpuq.worker.publishing import BoxState, Publisher, start_extras
from gpuq.worker.recovery import Recovery
from gpuq.worker.starting import Launcher, Starter
from gpuq.worker.stopping import StopOrders
from gpuq.worker.tempsweep import sweep_temp_files

log = logging.getLogger("gpuq.worker")
FULL_SCAN_EVERY_S = 30.0
REQUESTS_PER_PASS_S = 0.5
USAGE_CACHE_EVERY_S = 10.0  # how often `gpuq status` gets the users' usage anew
# Cron starts every box in the same minute: for this long after it starts, a worker puts no
# job onto a GPU that already has one (nor two onto one empty GPU), since the other boxes'
# heartbeats may not be there yet and their empty GPUs would be the better place.
STARTUP_SETTLE_S = 5.0
KEEPERS_WAIT_S = 30.0  # how long a --once worker waits for its jobs' keepers before it leaves
# An attempt's phases before its keeper runs: launched, not yet picked up by a supervisor, or
# picked up and owned, its keeper not yet started (model/markers.py).
AWAITING_KEEPER = frozenset({Phase.UNSTARTED, Phase.STARTED})


class Worker:
    STEPS: tuple[str, ...] = (
        "observe",
        "settle_running",
        "settle_sharing",
        "take_over_dead_hosts",
        "apply_requests",
        "obey_controls",
        "take_in_specs",
        "start_jobs",
        "report",
    )

    def __init__(
        self,
        layout: Layout,
        config: Config,
        host: str,
        fake_gpus: str | None,
        clock: Clock | None = None,
        spawner: Launcher | None = None,
        runtimes: OfferFinder | None = None,
    ) -> None:
        """`clock`, `spawner` and `runtimes` are the host's unless a test hands its own
        (tests/harness.py drives a worker pass by pass that way)."""
        self.layout, self.config, self.host = layout, config, host
        self.clock = clock or Clock()
        self._wire_host(fake_gpus, runtimes)
        self._init_pass_memory()
        self._wire_job_flow(spawner)
        self.wake = WakeFifo(self.rt.local_dir)
        self.queue_lock = QueueLock(layout.queue_lock, config.queue_lock_timeout_s)
        self._init_plan_memory()
        self._wire_watches()

    def _wire_host(self, fake_gpus: str | None, runtimes: OfferFinder | None) -> None:
        """This box: its local directory, its GPUs, whom jobs run as, MPS, what every job's
        supervisor is handed (`rt`), whose specs it takes, and what the extras' probes say it offers
        (the container runtimes)."""
        layout, config, host = self.layout, self.config, self.host
        self.boot_id = boot_id()
        local_dir = ensure_private_dir(layout.local_dir(host, config.local_dir))
        ensure_private_dir(local_dir / "jobs")
        self.probe = Probe(fake_gpus, local_dir)
        # Jobs run as their owners where the root part is root: a team's queue (the worker is
        # the queue's account) or root's own (the worker is root too).
        orders = rootorders.orders()
        as_owners = orders.starter_uid == 0 if orders is not None else os.geteuid() == 0
        root_part = orders if as_owners and os.geteuid() != 0 else None
        self.rt = Runtime(
            layout,
            host,
            self.boot_id,
            local_dir,
            config.grace_s,
            config.lost_after_s,
            self.probe.job_env(),
            config.allow_root_jobs,
            extras_settings(config),
        )
        self.intake = Intake(
            layout,
            OwnerPolicy.for_worker(
                os.stat(layout.jobs).st_mode, config.run_for_users, config.allow_root_jobs, as_owners, config.admins
            ),
            MtimeWatch(self.clock.mono),
        )
        self.box = Box(config, self.rt, self.intake, self.clock)  # what every part of a pass is handed
        self.sharers = start_sharing(local_dir, root_part, config, self.box.report_once)
        team = as_owners and os.geteuid() != 0  # a queue account's worker, jobs run as their owners
        self.needs = hooks.needs_of(config)  # what a job's extras' fields need of a host (the plan's)
        self.plan_config = hooks.sharing_of(config)  # gpu_sharing as the extras here run it
        self.runtimes: OfferFinder = runtimes or Offers(start_offers(config, team))

    def _init_pass_memory(self) -> None:
        """What one pass leaves the next: the GPUs and jobs it saw, what it read and when."""
        self.gpus: list[GpuSnapshot] = []
        self.running: list[Record] = []
        # running/: this box's records, and every other box's for the one plan
        self.listing = RunningListing(self.layout, self.host, self.box.report_once, MtimeWatch(self.clock.mono))
        self.started_last_pass = 0
        self.read_jobs_last_pass = False
        self.version_at_last_pass = -1
        self.observed: dict[str, dict[int, int]] = {}
        self.gpu_usage = GpuUsage()
        self.replies_swept_at = 0.0
        self.inbox_seen: int | None = None
        self.poke_seen: int | None = None
        self.jobs_seen: int | None = None
        self.woken_by = b""  # the reasons of the pokes that ended the last sleep

    def _wire_job_flow(self, spawner: Launcher | None) -> None:
        """The parts a job passes through here: taken in, claimed, started, recovered."""
        layout, config, host = self.layout, self.config, self.host
        self.spawner: Launcher = spawner or Spawner(self.rt, layout.worker_log(host))
        limits = PendingLimits(
            config.max_pending_per_user, config.max_pending_size_per_user_mib, frozenset(config.admins) | {"root"}
        )
        self.arrivals = Arrivals(self.box, limits)
        self.recovery = Recovery(self.box)
        self.starter = Starter(self.box, self.spawner, self.sharers)

    def _init_plan_memory(self) -> None:
        """What planning keeps from pass to pass: the team's heartbeats, the last plan's inputs,
        idle GPUs, jobs yielding or ending, dependencies, usage for fair share."""
        self.beat_cache: dict[str, tuple[tuple, Any]] = {}  # host -> (file's identity, its heartbeat)
        self.unchanged_plan_inputs: tuple | None = None
        self.recheck_at = float("inf")  # the last plan's Plan.recheck_at
        self.idle_tracker = IdleTracker(self.config.idle_util_pct)
        self.others_idle_since: dict[int, float | None] = {}
        # Running jobs told to stop (preempted, cancelled, over their memory), when and why: the
        # plan, here and on the other boxes (the heartbeat), counts them gone a grace later.
        self.stops = StopOrders(self.box, lambda record, stop: self._stop(record, stop))
        self.ending: set[str] = set()  # jobs over whose supervisors are still recording them
        self.put_back_specs = False  # settle_running put a spec back into jobs/ this pass
        self.pass_started_wall = float("inf")  # when the last pass began (wall clock)
        self.dep_states = DependencyStates(self.layout)
        self.history = UsageHistory(self.layout, self.config.fair_share_half_life_s)  # for fair share
        self.usage_written = 0.0
        self.born = self.clock.mono()

    def _wire_watches(self) -> None:
        """What this box watches and tells: GPU memory overuse, the jobs ended here, its
        heartbeat and what the extras publish with it (alerts, metrics, GPU samples)."""
        layout, config, host = self.layout, self.config, self.host
        self.gpu_mem_watch = GpuMemWatch(config)
        self.finished = FinishedCounter(layout.host_events(host))  # jobs ended here (for the extras: alerts, metrics)
        extras = start_extras(layout, config, host)
        self.publisher = Publisher(self.box, self.finished, extras)

    # --- the loop -------------------------------------------------------------------------

    def run(self, once: bool = False, exit_when_idle: bool = False) -> None:
        self.begin()
        try:
            while True:
                pass_started = time.monotonic()  # the sleep below waits in real time
                self.run_pass()
                if once:
                    self.await_keepers()
                    return
                if exit_when_idle and self.idle():
                    return
                self.woken_by = self.wake.sleep(
                    self.config.poll_interval,
                    watch=(self.layout.requests, poke_path(self.layout, self.host), self.layout.jobs),
                    seen=(self.inbox_seen, self.poke_seen, self.jobs_seen),
                    not_before=(0.0, 0.0, pass_started + JOBS_WATCH_GAP_S),
                )
        finally:
            self.end()

    def begin(self) -> None:
        """What a worker does once, before its first pass."""
        log.info(
            "worker %s started (pid %d, gpuq %s, root %s)%s",
            self.host,
            os.getpid(),
            __version__,
            self.layout.root,
            f"; {self.probe.error}" if self.probe.error else "",
        )
        write_lease(self.rt, self.clock.mono())  # a restarted worker renews its supervisors' lease
        self.stops.read_back(self.listing.read())  # orders a worker before this one gave
        try:  # other boxes touch it to wake this one; without it they wait for its poll
            atomic_write(poke_path(self.layout, self.host), b"", mode=0o644, durable=False)
        except OSError as e:
            self.box.report_once(
                "poke-file",
                f"cannot make this box's poke file ({e.strerror or e}): other boxes' starts here wait for its poll",
            )
        self.fill_ids()
        finish_interrupted(
            self.layout,
            load_yaml,
            lambda group, why: self.box.report_once(f"groups/{group}", f"sweep {group} left as it is: {why}"),
        )

    def fill_ids(self) -> None:
        """A queue made before state/ids/: its reservations, made once from where older workers
        kept jobs (spool/ids.py, migrate). Under the queue lock, as a claim is; until it is done
        (here, or at a later start), every reader looks the older way."""
        try:
            with self.queue_lock:
                made = migrate_ids(self.layout)
        except OSError as e:
            self.box.report_once("ids", f"cannot fill state/ids/ ({e.strerror or e}): ids are looked up the older way")
            return
        if made:
            log.info("state/ids/: %d job ids reserved, from the records and specs older workers kept", made)

    def run_pass(self) -> None:
        """One pass: every step in order, at the time its clock says."""
        self.pass_started_wall = self.clock.wall()
        for step in self.STEPS:
            try:
                getattr(self, step)()
            except Exception:  # one bad step must not kill the worker; the next pass retries
                log.exception("step %s failed", step)

    def end(self) -> None:
        self.spawner.close()
        try:  # the jobs still running keep theirs: their supervisors outlive the worker
            self.settle_sharing(final=True)
        except Exception:
            log.exception("stopping the GPU sharing's daemons (MPS) failed")
        self.publisher.last_word(self._box_state(), self.clock.mono(), self.clock.wall())

    def await_keepers(self, timeout_s: float = KEEPERS_WAIT_S) -> None:
        """A --once worker's last step. The root part, which starts each job's keeper, ends
        with the worker: a supervisor still waiting for its keeper would hand its job back
        unstarted, for the next worker to claim again (and a --once one never to run). So it
        leaves once every attempt of this boot on this box is past that point (or never had a
        supervisor: the next worker requeues it), or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.spawner.collect()
            running = self.listing.read()
            mine = [
                r
                for r in running
                if r.host == self.host and r.boot_id == self.boot_id and r.id not in self.spawner.failed
            ]
            if all(read_marker(self.rt, r).phase not in AWAITING_KEEPER for r in mine):
                return
            time.sleep(0.05)

    def idle(self) -> bool:
        """Nothing runs here and nothing this box could start remains: the last pass started
        nothing and found jobs/ as the pass before it (a sweep's members, a requeued spec or a
        released dependency show as a change, and get their pass)."""
        # A pass that skipped reading jobs/ has not seen what the pass before it wrote there
        # (a sweep's members): it cannot tell that nothing is left.
        settled = (
            self.intake.version == self.version_at_last_pass and not self.started_last_pass and self.read_jobs_last_pass
        )
        self.version_at_last_pass = self.intake.version
        return (
            not self.running and not self.ending and not self.spawner.starting and settled and not self._becoming_idle()
        )

    def _becoming_idle(self) -> bool:
        """An opportunistic job waits and one of this box's GPUs is free of other use but not
        yet for `idle_after_s`: it may start once that time has passed (a GPU a person
        uses may stay taken for ever, and does not keep the worker)."""
        # As of the pass's start, before its plan: a pass slower than idle_after_s must not let
        # the worker leave before a plan has seen the GPU idle for that long.
        planned = min(self.clock.wall(), self.pass_started_wall)
        return any(
            since is not None and planned - since < self.config.idle_after_s
            for since in self.others_idle_since.values()
        ) and any(job.opportunistic for job in self.intake.pending())

    # --- steps ----------------------------------------------------------------------------

    def observe(self) -> None:
        """This host's GPUs and running jobs, and which job's processes use which memory."""
        self.runtimes.refresh(self.clock.mono())
        offered = self.config.offered_gpus(self.host)
        self.gpus = [g for g in self.probe.snapshot() if offered is None or g.index in offered]
        self.running = self.listing.read()
        # Jobs over whose supervisors are recording them are sampled no more: their GPUs are
        # someone else's from now on (settle_running).
        self.ending = {r.id for r in self.running if r.boot_id == self.boot_id and has_ended(self.rt, r)}
        live = [r for r in self.running if r.id not in self.ending]
        self.observed, foreign = observe_job_memory(self.gpus, self.running, lambda r: job_roots(self.rt, r))
        self.others_idle_since = self.idle_tracker.update(
            self.gpus, foreign, {i for r in self.running for i in r.gpus}, self.clock.wall()
        )
        for overuse in self.gpu_mem_watch.update(self.running, self.observed, self.clock.mono()):
            self.stops.act_on_overuse(next(r for r in self.running if r.id == overuse.job_id), overuse)
        now = self.clock.mono()
        util = {g.index: g.util_pct for g in self.gpus}
        for r in live:
            if r.gpus:
                self.gpu_usage.sample(
                    r.id,
                    self.observed.get(r.id, {}),
                    [u for i in r.gpus if (u := util.get(i)) is not None],
                    now,
                    self.rt.usage_path(r.id),
                )

    def settle_running(self) -> None:
        """Reattach to live jobs; settle the ones whose supervisor and job are gone."""
        alive: list[Record] = []
        ending: list[Record] = []
        requeued = self.recovery.requeued
        self.spawner.collect()
        for record in self.running:
            if record.boot_id == self.boot_id and record.id in self.spawner.starting:
                alive.append(record)  # sent to the spawner, not answered yet
                continue
            with settle_lock(self.rt, record.id) as gone:
                if record.boot_id == self.boot_id and not gone:
                    # Its supervisor (or the job) holds the lock; a job that has ended holds
                    # nothing while its supervisor records it.
                    (ending if record.id in self.ending else alive).append(record)
                    continue
                self.recovery.settle_gone(record)
                finish_local(self.rt, record)
            self.gpu_usage.forget(record.id)
        self.running, self.ending = alive, {r.id for r in ending}
        self.stops.keep_only(r.id for r in alive)
        self.recovery.requeue_orphan_claims()
        # A spec put back at its place (preempted, retried) is planned in this very pass: else
        # the GPUs it freed go to a job behind it before jobs/ is read again.
        self.put_back_specs = self.recovery.requeued != requeued

    def settle_sharing(self, final: bool = False) -> None:
        """Let the GPU sharers (the mps extra's daemons) stop what no running job here is a
        client of any more (a daemon a crashed worker left is found and kept or stopped alike)."""
        in_use = {i for r in self.running if r.mps_pipe for i in r.gpus}
        for sharer in self.sharers:
            sharer.settle(in_use, self.clock.mono(), final)

    def take_over_dead_hosts(self) -> None:
        self.recovery.take_over_dead_hosts()

    def obey_controls(self) -> None:
        """Cancels of this box's jobs, as the worker that judged the request left them."""
        self.stops.obey_controls(self.running)

    def apply_requests(self) -> None:
        """Requests from the inbox (spool/inbox.py): cancel, hold, release, edit, retry, drain,
        resume, and the extras' kinds (book, unbook). Requests this host took before a crash come first."""
        deadline = time.monotonic() + REQUESTS_PER_PASS_S  # a flood must not stall heartbeats
        self.inbox_seen = mtime_ns(self.layout.requests)  # before reading it: a later one wakes the sleep
        self.poke_seen = mtime_ns(poke_path(self.layout, self.host))  # likewise another box's poke
        for name in leftovers(self.layout, self.host):
            apply_one(self.layout, self.config, self.host, name, taken=True)
        for name in fair_order(self.layout, waiting(self.layout)):
            if time.monotonic() > deadline:
                break  # the rest at the next pass
            apply_one(self.layout, self.config, self.host, name)
        now = self.clock.wall()
        if now - self.replies_swept_at > 60:
            self.replies_swept_at = now
            sweep_replies(self.layout, now)

    def _stop(self, record: Record, stop: Stop) -> bool:
        """TERM, grace, KILL through its supervisor (the slurm extra's bridge: scancel). False:
        not yet. Only `stops` calls it: every stop is kept there as an order."""
        return request_stop(self.rt, record, stop)

    def take_in_specs(self) -> None:
        """Read jobs/; reject specs that stayed invalid and ids already used; expand sweeps."""
        now = self.clock.mono()
        self.read_jobs_last_pass = False
        if (
            self.woken_by
            and not self.woken_by.strip(WAKE_JOB_ENDED)
            and not self.put_back_specs
            and not self.reading_behind()
            and now - self.intake.scanned_at < EXIT_WAKE_SCAN_GAP_S
        ):
            return  # only job ends woke us: they free GPUs, not specs, and jobs/ was just read
        self.read_jobs_last_pass = True
        # Before reading it: a spec dropped into jobs/ later (by hand or a script, which poke
        # nobody) ends the sleep within WATCH_EVERY_S instead of waiting for the poll.
        self.jobs_seen = mtime_ns(self.layout.jobs)
        # Every file is re-examined now and then; in between only a changed directory is
        # read again, and then only new and vanished names are examined (a spec edited in
        # place is also caught when it is claimed: the claimed bytes must be the planned ones).
        full = now - self.intake.full_scan_at >= FULL_SCAN_EVERY_S
        self.intake.scan(now, full=full)
        if full:
            sweep_temp_files(self.layout, self.host, self.clock.wall())
        self.arrivals.take_in(now, self.config.spec_settle_s)
        if self.reading_behind():  # left for the next pass (a member's flood): it comes without the poll's wait
            self.jobs_seen = -1

    def reading_behind(self) -> bool:
        """Whether the last pass left specs to read or refuse to the next (their budgets)."""
        return bool(self.intake.unread) or self.arrivals.behind

    def start_jobs(self) -> None:
        """One plan for the whole team (spool/teamstate.py): this box starts only the starts placed
        on it and stops only its own jobs that must yield; starts placed on another box are
        that box's (it is poked)."""
        self.started_last_pass = 0
        if not self.intake.entries and not any(r.spec.get("preemptible") for r in self.running):
            if self.config.fair_share and self.clock.wall() - self.usage_written >= USAGE_CACHE_EVERY_S:
                # An idle queue's `status --shares` stays current.
                self._usage(self.clock.wall(), load_heartbeats(self.layout, None, self.beat_cache))
            return
        if drain_file(self.layout, self.host).exists():
            return  # `gpuq drain`: running jobs finish, nothing new starts here
        now = self.clock.wall()
        beats, own_jobs, team = self._team_picture(now)
        # The plan only changes when its inputs do: skip it while nothing moved. Time enters
        # through idleness (a GPU idle long enough, or taken by a person), idle windows and
        # stops a grace late.
        inputs: tuple[object, ...] = (
            self.intake.version,
            team.fingerprint(now, self.config.idle_after_s, self.config.grace_s),
            window_open(self.config.idle_windows, now),
        )
        booked = hooks.set_aside(self.layout, now)  # the extras' placement rules (bookings), read now
        waiting, doomed = gates(self.intake.pending(), self.dep_states, now, (j.id for j in team.running))
        for job_id, why in doomed.items():
            self._cancel_doomed(job_id, why)
        settling = self.clock.mono() - self.born < STARTUP_SETTLE_S
        inputs += (frozenset(waiting), frozenset(doomed), frozenset(b for b in booked if b.active(now)), settling)
        if inputs == self.unchanged_plan_inputs and now < self.recheck_at:
            return
        with self.queue_lock:  # orders planning across hosts; the claim rename keeps correctness
            decided = self._plan_under_lock(now, beats, own_jobs, team, {**waiting, **doomed}, booked, settling)
            self._act_on_plan(decided)
        # Other boxes with a part in this plan (starts, holds, jobs to stop) hear of it now.
        elsewhere = (
            {s.host for s in decided.starts}
            | {h for h, _ in decided.held.values()}
            | {j.host for j in team.running if j.id in decided.preempts}
        )
        for host in elsewhere - {self.host}:
            poke_box(self.layout, host)
        mine = any(s.host == self.host for s in decided.starts) or any(
            j in decided.preempts for j in (r.id for r in self.running)
        )
        self.unchanged_plan_inputs = None if mine else inputs
        self.recheck_at = decided.recheck_at

    def _team_picture(self, now: float) -> tuple[list[dict], list[RunningJob], TeamPicture]:
        """The team as the plan sees it: every box's heartbeat (those that cannot be read are
        left out, and said once), this box's own jobs, and the picture made of them."""
        problems: dict[str, str] = {}
        beats = load_heartbeats(self.layout, problems, self.beat_cache)
        for host, why in problems.items():
            self.box.report_once(f"heartbeat/{host}", f"state/workers/{host}.json left out of the plan: {why}")
        own = HostView(
            self.host,
            tuple(self.gpus),
            self.config.cpu_slots,
            self.others_idle_since,
            frozenset(self.runtimes.found),
            self.publisher.cores,
            self.publisher.mem_mib,
        )
        own_jobs = self._running_jobs()
        team = picture(self.layout, self.config, beats, self.listing.others, now, own, own_jobs, alive=self._alive)
        return beats, own_jobs, team

    def _plan_under_lock(
        self,
        now: float,
        beats: list[dict],
        own_jobs: list[RunningJob],
        team: TeamPicture,
        blocked: dict[str, str],
        booked: list[SetAside],
        settling: bool,
    ) -> Plan:
        """The plan, made while this box holds the queue lock: of the specs still in jobs/, with
        the running jobs read again if another box started some meanwhile (`team.running` too)."""
        # Another box may have claimed jobs since this pass looked: with their records read
        # again under the lock, caps and GPUs are counted with them. (One stat tells.)
        if self.listing.changed():
            self.listing.read()
            team.running = own_jobs + running_elsewhere(beats, self.listing.others, self.host)
        usage = self._usage(now, beats)
        pending = self.intake.pending()
        if gone := self.intake.gone_since_scan():
            pending = [job for job in pending if job.id not in gone]
        estimates, running = learned_runs(pending, team.running, self.config, self.history.durations, now)
        decided = plan(
            pending,
            team.hosts,
            running,
            self.plan_config,
            now,
            explain=False,
            blocked=blocked,
            set_aside=booked,
            usage=usage if self.config.fair_share else None,
            estimates=estimates,
            needs=self.needs,
        )
        if settling:
            decided.starts = onto_empty_gpus(decided.starts, team.running)
        return decided

    def _act_on_plan(self, decided: Plan) -> None:
        """This box's part of the plan, still under the queue lock: its jobs that must yield are
        told to, and the starts placed on it are started."""
        self.stops.preempt(self.running, decided.preempts)
        try:
            for start in decided.starts:
                if start.host == self.host:
                    if record := self.starter.start(start.job_id, start.gpus, self.gpus, self.running):
                        self.running.append(record)
                    self.started_last_pass += 1
        finally:  # our own claims (and put-backs of starts that failed) are no news to wake for
            if any(s.host == self.host for s in decided.starts) and not self.reading_behind():
                self.jobs_seen = mtime_ns(self.layout.jobs)

    def _usage(self, now: float, beats: list[dict]) -> dict[str, float]:
        """Each user's decayed usage of ended jobs (spool/history.py), and, now and then, the
        same and the runs' durations for `gpuq status` to plan as the workers do
        (state/workers/<host>.usage)."""
        # Every box with a heartbeat (`beats`: this pass's), gone ones too: their jobs' shares
        # of a GPU are counted by their GPUs' size.
        sizes = {
            hb["host"]: max(mems)
            for hb in beats
            if (
                mems := [
                    g["mem_total_mib"]
                    for g in hb.get("gpus") or []
                    if isinstance(g, dict) and isinstance(g.get("mem_total_mib"), int)
                ]
            )
        }
        usage = self.history.usage(now, sizes)
        if now - self.usage_written >= USAGE_CACHE_EVERY_S:
            self.usage_written = now
            try:
                cache = {"t": now, "users": usage, "durations": self.history.durations}
                write_json(self.layout.usage_cache(self.host), cache, durable=False)
            except OSError as e:
                self.box.report_once("usage-cache", f"cannot write {self.layout.usage_cache(self.host)}: {e}")
        return usage

    def _alive(self, hb: dict) -> bool:
        """Another box is live while its heartbeat keeps changing, on this box's own clock
        (clocks may differ); one not watched long enough yet is judged by its file's mtime."""
        silent = self.recovery.silent_s(hb["host"])
        if hb.get("stopped") or silent is None:
            return heartbeat_alive(hb, self.clock.wall())
        return silent <= live_window_s(hb)

    def _cancel_doomed(self, job_id: str, why: str) -> None:
        entry = self.intake.entries.get(job_id)
        if entry is not None and cancel_pending(self.layout, entry.path, job_id, self.host, why):
            log.info("cancelled %s: %s", job_id, why)
        self.intake.forget(job_id)

    def _running_jobs(self) -> list[RunningJob]:
        return [RunningJob.of(r, self.observed.get(r.id, {}), self.stops.get(r.id), self.host) for r in self.running]

    def report(self) -> None:
        """What this box tells the others (worker/publishing.py), when it is due."""
        now = self.clock.mono()
        if self.publisher.due(now):
            self.publisher.publish(self._box_state(), now, self.clock.wall())

    def _box_state(self) -> BoxState:
        now = self.clock.mono()
        return BoxState(
            self.gpus,
            self.running,
            self.observed,
            self.others_idle_since,
            self.stops.given,
            dict(self.gpu_mem_watch.current),
            {h: now - since for h, (_, since, _) in self.recovery.heartbeats.items() if h != self.host},
            self.probe.error,
            self.runtimes.found,
            self.runtimes.problems,
            next((state for sharer in self.sharers if (state := sharer.state()) is not None), None),
        )


def onto_empty_gpus(starts: list[Start], running: list[RunningJob]) -> list[Start]:
    """The starts that put a job only on GPUs with no job, each GPU to one start."""
    taken = {(r.host, i) for r in running for i in r.gpus}
    kept = []
    for start in starts:
        gpus = {(start.host, i) for i in start.gpus}
        if not gpus & taken:
            taken |= gpus
            kept.append(start)
    return kept
