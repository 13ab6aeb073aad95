"""An in-process worker driven pass by pass: the real Worker with its clock, spawner and
container-runtime probe replaced, so that a test of what one pass decides starts no process
and waits for nothing (the fast set). A `Team` runs several such boxes on one root and one
clock until the queue is idle (as arq's burst worker does), ending their jobs as a tiny model
of each says. What needs processes (supervisors, crashes, signals, users) stays in the
real-process tests."""

from __future__ import annotations

import gc
import io
import json
import logging
import math
import os
import signal
import subprocess
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence
from unittest import mock

from gpuq import cli
from gpuq.cli import common as cli_common
from gpuq.host import privsep
from gpuq.host.clock import Clock
from gpuq.host.files import atomic_write
from gpuq.model.config import load
from gpuq.model.markers import Marker, Phase
from gpuq.model.record import Record
from gpuq.model.stops import Stop, StopCause, ended_as
from gpuq.run.joblocal import LOCAL_MODE, Runtime, finish_local
from gpuq.spool import store
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record, transition
from gpuq.worker import loop
from gpuq.worker.loop import Worker


def runs_here(root: Path) -> bool:
    """Whether root's gpuq on `root` stays who it is (the owner of its state/, else of the
    root, is this process's user), so that `gpuq()` may run it in this process."""
    return privsep.Account.of_root(str(root)).uid == os.geteuid()


_CATCHABLE = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def gpuq(
    root: Path,
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    launcher_dir: str | None = None,
) -> subprocess.CompletedProcess:
    """`gpuq --root ROOT ARGS` run in this process (cli.main, as the launcher runs it): its
    exit status and what it printed, as a `subprocess.run` with captured output returns them.
    Root's gpuq on a root it owns (the suite's) applies a request itself, as the workers do,
    so a verb's effect on the spool is there when it returns. `env`: variables set meanwhile
    (EDITOR). As a process would be, it is fresh (the config's problems are told again), its
    warnings logged go to its stderr (Python's last resort prints them there in a process;
    here pytest's capture would take them), and it fails after `timeout` seconds instead of
    hanging the run (SIGALRM: a `logs -f` that followed for ever). What only a process shows
    (the launcher, a terminal, the root part of a team root's privilege split) stays in the
    real-process tests."""
    if not runs_here(root):
        # Root's gpuq on a root whose state/ another account owns becomes that account
        # (host/privsep.py split, by the same rule): in this process it would take the test
        # run's own privileges with it.
        raise AssertionError(f"{root} is not this process's own: run the real CLI for it (a process)")
    # As a process's: text, and the bytes under it (`logs` copies a log's bytes as they are).
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True), io.StringIO()
    said = logging.StreamHandler(err)
    said.setLevel(logging.WARNING)
    said.setFormatter(logging.Formatter("%(message)s"))
    thresholds = gc.get_threshold()  # main raises the collector's for a short-lived command

    def late(signum: int, frame: object) -> None:
        raise AssertionError(f"gpuq {' '.join(args)} still running after {timeout} s")

    # A verb may set what a signal does for its process's lifetime (serve ignores SIGCHLD, run
    # its terminal's signals): here that would outlive it, and a SIGCHLD ignored made every
    # later child's exit status 0 in this test process. They are put back as they were.
    dispositions = {s: signal.getsignal(s) for s in _CATCHABLE}
    signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    cli_common._SAID.clear()
    logging.getLogger().addHandler(said)
    try:
        with mock.patch.dict(os.environ, env or {}), redirect_stdout(out), redirect_stderr(err):
            try:
                code = cli.main(["--root", str(root), *args], launcher_dir=launcher_dir)
            except SystemExit as e:  # argparse's refusals and --help
                code = e.code if isinstance(e.code, int) else 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for number, disposition in dispositions.items():
            if signal.getsignal(number) != disposition:  # only those it changed: faulthandler's are C's
                signal.signal(number, disposition)
        logging.getLogger().removeHandler(said)
        gc.set_threshold(*thresholds)
    printed = out.buffer.getvalue().decode("utf-8", errors="replace")  # type: ignore[attr-defined]
    done = subprocess.CompletedProcess(["gpuq", *args], code, printed, err.getvalue())
    if check and code != 0:
        raise AssertionError(f"gpuq {' '.join(args)} -> {code}\n{done.stdout}\n{done.stderr}")
    return done


def status(root: Path) -> dict:
    """`gpuq status --json`, in this process."""
    return json.loads(gpuq(root, "status", "--json").stdout)


class FakeClock(Clock):
    """Both clocks stand still until the test moves them."""

    def __init__(self) -> None:
        self.wall_s = time.time()  # near the real one: files' mtimes are compared with it
        self.mono_s = 1000.0

    def wall(self) -> float:
        return self.wall_s

    def mono(self) -> float:
        return self.mono_s

    def advance(self, seconds: float) -> None:
        self.wall_s += seconds
        self.mono_s += seconds


class ShiftedClock(Clock):
    """Another box's clock: it moves with `base`, its wall clock `shift_s` apart (as
    GPUQ_TEST_CLOCK_SHIFT_S does to a real worker)."""

    def __init__(self, base: FakeClock, shift_s: float) -> None:
        self.base, self.shift_s = base, shift_s

    def wall(self) -> float:
        return self.base.wall() + self.shift_s

    def mono(self) -> float:
        return self.base.mono()


class RecordingSpawner:
    """Takes the launches a pass makes instead of starting supervisors. A launched job stays
    "starting" (so a pass does not judge it gone) until the test `finish`es it."""

    def __init__(self) -> None:
        self.launched: list[Record] = []
        self.starting: set[str] = set()
        self.failed: set[str] = set()  # none: every launch is taken

    def launch(self, record: Record) -> None:
        self.launched.append(record)
        self.starting.add(record.id)

    def collect(self) -> None:
        pass

    def close(self) -> None:
        pass


class NoContainerRuntimes:
    found: dict[str, str] = {}
    problems: dict[str, str] = {}

    def refresh(self, now: float) -> None:
        pass


_boxes: list["PassWorker"] = []  # made in this test, closed after it (close_all)


def close_all() -> None:
    """After a test: the descriptors its boxes and event logs kept, as their processes' exit
    would close them (conftest.py calls this after each test)."""
    while _boxes:
        _boxes.pop().close()
    store.close_event_logs()


class PassWorker:
    """A queue root and one box's worker in this process. Stop orders (preemptions, cancels,
    limits) have no supervisor to signal: they are written where a supervisor reads them (the
    job's stop file) and kept in `stops` for the test (or a `Team`) to end the job by."""

    def __init__(
        self, root: Path, host: str = "a", fake_gpus: str = "2x24GiB", clock: Clock | None = None, **config: object
    ) -> None:
        self.root, self.host, self.fake_gpus = root, host, fake_gpus
        (root / "jobs").mkdir(parents=True, exist_ok=True)
        settings = {
            "poll_interval": 0.2,
            "spec_settle_s": 1,
            "allow_root_jobs": os.geteuid() == 0,
            "local_dir": str(root.parent / "local" / "{host}"),
            **config,
        }
        (root / "config.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
        self.layout = Layout(root)
        self.layout.ensure()
        self.clock = clock or FakeClock()
        self.spawner = RecordingSpawner()
        self.stops: dict[str, tuple[Stop, float]] = {}  # job id -> the order, when given (mono)
        self.worker = self._started_worker()
        _boxes.append(self)

    def _started_worker(self) -> Worker:
        worker = Worker(
            self.layout,
            load(self.layout.config_file),
            self.host,
            self.fake_gpus,
            clock=self.clock,
            spawner=self.spawner,
            runtimes=NoContainerRuntimes(),
        )
        worker.begin()
        return worker

    def restart(self) -> None:
        """The worker process exits and a new one starts; the jobs and their supervisors (the
        spawner's) run on."""
        self.close()
        with self.taking_stops():
            self.worker = self._started_worker()

    def close(self) -> None:
        """What a worker process would give back as it exits: its wake FIFO and the queue
        lock's file (a test process would keep one of each per box for the whole run)."""
        os.close(self.worker.wake.fd)
        if self.worker.queue_lock.fd is not None:
            os.close(self.worker.queue_lock.fd)
            self.worker.queue_lock.fd = None

    def run_pass(self, after_s: float = 0.0) -> None:
        """One whole pass, as the real loop runs it (a step that raises is logged, not raised)."""
        if after_s:
            assert isinstance(self.clock, FakeClock), "a shifted clock moves with its base"
            self.clock.advance(after_s)
        with self.taking_stops():
            self.worker.run_pass()

    def run_steps(self, steps: Sequence[str]) -> None:
        """Some of a pass's steps (Worker.STEPS), in order; one that raises fails the test."""
        with self.taking_stops():
            for step in steps:
                getattr(self.worker, step)()

    @contextmanager
    def taking_stops(self) -> Iterator[None]:
        """While the worker runs: its stop orders go to `_take_stop`, not to a supervisor."""
        with mock.patch.object(loop, "request_stop", self._take_stop):
            yield

    def _take_stop(self, rt: Runtime, record: Record, stop: Stop) -> bool:
        """joblocal.request_stop for a launched job: the order in its stop file, as a supervisor
        reads it, and in `stops`. False (no supervisor found) for a job not running here."""
        if record.id not in self.spawner.starting:
            return False
        atomic_write(rt.stop_path(record.id), stop.encode(), LOCAL_MODE, durable=False)
        os.utime(rt.stop_path(record.id), (self.clock.wall(),) * 2)  # written on this box's clock
        self.stops.setdefault(record.id, (stop, self.clock.mono()))
        return True

    def drop(self, name: str, text: str) -> Path:
        path = self.root / "jobs" / name
        path.write_text(text)
        return path

    def finish(self, job_id: str, exit_code: int = 0) -> Record:
        """The launched job ends as its supervisor would record it (run/supervise.py,
        _record_outcome): the finished record (the one `StateChange`), then its claim and
        local files go; the next pass sees it ended. A job told to stop (`stops`) ends as
        that stop says; a preempted one is not recorded: the PREEMPTED marker in its lock file
        (model/markers.py) has the worker's next pass put the spec back at its old place
        (recovery.settle_gone), as for a real supervisor's."""
        running = self._running(job_id)
        self.spawner.starting.discard(job_id)
        told = self.stops.pop(job_id, None)
        stop = told[0] if told is not None else None
        if stop is not None and stop.cause is StopCause.PREEMPT:
            marker = Marker(Phase.PREEMPTED, running.claim, why=f"{stop.reason}; exit {exit_code}")
            atomic_write(
                self.worker.rt.lock_path(job_id), json.dumps(marker.fields()).encode(), LOCAL_MODE, durable=False
            )
            return running
        now = self.clock.wall()
        final = ended_as(stop, exit_code)
        ended = transition(
            self.layout,
            running,
            final,
            self.host,
            started_at=running.claimed_at or now,  # its supervisor starts it as soon as it is claimed
            ended_at=now,
            exit_code=exit_code,
            reason=stop.reason if stop else None,
            cause=stop.cause if stop else None,
        )
        finish_local(self.worker.rt, ended)
        return ended

    def _running(self, job_id: str) -> Record:
        running = read_record(self.layout.record(self.layout.running, job_id))
        assert running is not None and running.host == self.host, f"{job_id} does not run on {self.host}"
        return running

    def launched(self) -> list[str]:
        return [r.id for r in self.spawner.launched]

    def heartbeat(self) -> dict:
        return json.loads((self.layout.state / "workers" / f"{self.host}.json").read_text())


@dataclass(frozen=True)
class Run:
    """How one attempt of a job behaves in a `Team`: it ends by itself `seconds` after its
    launch with `exit_code`, or `yield_s` after it is told to stop (0: a job that traps TERM
    and exits; its grace: one that ignores TERM until its supervisor KILLs it)."""

    seconds: float = 1.0
    exit_code: int = 0
    yield_s: float = 0.0


FOREVER = Run(seconds=math.inf)  # runs until it is told to stop, and then goes at once


@dataclass
class _Attempt:
    box: PassWorker
    record: Record
    run: Run
    launched_mono: float


class Team:
    """Boxes of one queue root, each a `PassWorker` on one clock, with their jobs run by a tiny
    model: `runs(record)` says how each launched attempt behaves (default: `Run()`). A step
    moves the clock, ends the attempts whose time has come (by themselves, or having been told
    to stop), then runs a pass of every box in the order they were added.

    `overlap` (set it True): the boxes' passes overlap as those of boxes woken together do: every box reads
    jobs/ and the team, then each plans and starts in turn (the queue lock orders that), then
    each finishes its pass. Otherwise each box's pass runs whole before the next box's.

    The shared disk's clock is the team's: a spec dropped through `drop` and a heartbeat a box
    writes get its time as their mtime (places in the queue and liveness are judged by mtimes),
    whatever a box's own clock says (`add(..., clock_shift_s=...)`)."""

    def __init__(self, root: Path, runs: Callable[[Record], Run] | None = None, **config: object) -> None:
        self.root, self.config = root, config
        self.overlap = False
        (root / "jobs").mkdir(parents=True, exist_ok=True)  # specs may wait there before any box starts
        self.runs = runs or (lambda record: Run())
        self.clock = FakeClock()
        self.boxes: dict[str, PassWorker] = {}
        self.dead: set[str] = set()
        self.attempts: dict[tuple[str, str], _Attempt] = {}  # (job id, claim) -> the attempt, while it runs
        self.noted: dict[str, int] = {}  # host -> how many of its box's launches have an attempt
        self.idle: dict[str, bool] = {}  # each box's Worker.idle() after its last pass

    def add(self, host: str, fake_gpus: str, clock_shift_s: float = 0.0) -> PassWorker:
        """A box whose worker starts now (its first pass comes with the next step)."""
        clock = ShiftedClock(self.clock, clock_shift_s) if clock_shift_s else self.clock
        box = PassWorker(self.root, host, fake_gpus, clock=clock, **self.config)
        self.boxes[host] = box
        self.idle[host] = False
        return box

    def kill(self, host: str) -> None:
        """The box's worker dies (SIGKILL): it runs no more passes, its heartbeat stays as last
        written, and its jobs are no longer ended by the model (their supervisors are its)."""
        self.dead.add(host)
        self.idle.pop(host, None)

    def drop(self, name: str, text: str) -> Path:
        """A spec into jobs/, landed now on the team's clock (its place in the queue)."""
        path = self.root / "jobs" / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        os.utime(tmp, (self.clock.wall(),) * 2)
        os.rename(tmp, path)
        return path

    def step(self, step_s: float = 1.0) -> None:
        """`step_s` later: the attempts due end, then every live box makes one pass."""
        self.clock.advance(step_s)
        self._end_due()
        live = [box for host, box in self.boxes.items() if host not in self.dead]
        steps = Worker.STEPS
        if self.overlap:
            split = steps.index("start_jobs")
            phases: list[Sequence[str]] = [steps[:split], steps[split : split + 1], steps[split + 1 :]]
        else:
            phases = [steps]
        for phase in phases:
            for box in live:
                beat = self._heartbeat_key(box)
                box.run_steps(phase)
                self._stamp_heartbeat(box, beat)
                self._note_launches(box)
        for box in live:
            self.idle[box.host] = box.worker.idle()  # once a pass: it compares with the pass before

    def end(self, job_id: str, exit_code: int = 0) -> Record:
        """A running attempt ends now, whatever its `Run` said (a test's "go")."""
        key, attempt = next((k, a) for k, a in self.attempts.items() if k[0] == job_id)
        del self.attempts[key]
        return attempt.box.finish(job_id, exit_code)

    def run_until(self, done: Callable[[], object], max_passes: int = 100, step_s: float = 1.0) -> int:
        """Steps until `done()` holds (checked after each); the number of passes it took."""
        for passes in range(1, max_passes + 1):
            self.step(step_s)
            if done():
                return passes
        raise AssertionError(f"not done after {max_passes} passes of {step_s:g} s")

    def run_until_idle(self, max_passes: int = 100, step_s: float = 1.0) -> int:
        """Steps until every live box is idle (Worker.idle: nothing runs or starts there and
        jobs/ stood still), as a worker started with --exit-when-idle would stop."""
        return self.run_until(lambda: all(self.idle.values()), max_passes, step_s)

    def finished(self, job_id: str) -> Record | None:
        return read_record(self.root / "state" / "finished" / f"{job_id}.json")

    def running(self) -> list[Record]:
        return [r for p in sorted((self.root / "state" / "running").glob("*.json")) if (r := read_record(p))]

    def events(self) -> list[dict]:
        """Every box's events, in time order."""
        paths = (self.root / "state" / "events").glob("*.jsonl")
        return sorted((json.loads(line) for p in paths for line in p.read_text().splitlines()), key=lambda e: e["t"])

    def _end_due(self) -> None:
        """The attempts whose time has come end, as their supervisors would record them."""
        now = self.clock.mono()
        for key, attempt in list(self.attempts.items()):
            if attempt.box.host in self.dead:
                continue
            told = attempt.box.stops.get(attempt.record.id)
            due = attempt.launched_mono + attempt.run.seconds
            if told is not None:
                due = min(due, told[1] + attempt.run.yield_s)
            if now >= due:
                attempt.box.finish(attempt.record.id, attempt.run.exit_code)
                del self.attempts[key]

    def _note_launches(self, box: PassWorker) -> None:
        for record in box.spawner.launched[self.noted.get(box.host, 0) :]:
            self.noted[box.host] = self.noted.get(box.host, 0) + 1
            self.attempts[(record.id, record.claim or "")] = _Attempt(box, record, self.runs(record), self.clock.mono())

    def _heartbeat_key(self, box: PassWorker) -> tuple[int, int] | None:
        try:
            st = os.stat(box.layout.workers / f"{box.host}.json")
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns

    def _stamp_heartbeat(self, box: PassWorker, before: tuple[int, int] | None) -> None:
        """A heartbeat written in this step gets the team's time as its mtime: the shared disk's
        clock, by which boxes not yet watched are judged live (teamstate.heartbeat_alive)."""
        if self._heartbeat_key(box) != before:
            os.utime(box.layout.workers / f"{box.host}.json", (self.clock.wall(),) * 2)
