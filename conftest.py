"""Shared helpers: a fresh queue root per test, and the real gpuq.py / worker.py in
subprocesses, several workers with different --host standing in for several boxes."""

from __future__ import annotations

import _posixsubprocess
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from gpuq.single_instance import fake_gpus_dir

# team.py's fixtures (users, shared_code, team): tests that act as created users ask for them by name.
pytest_plugins = ["team"]

REPO = Path(__file__).resolve().parent
# The tests' shared helpers (harness, team, test_plan's builders) for every test, an extra's
# own (gpuq/extras/NAME/tests/) too.
sys.path.insert(0, str(REPO / "tests"))
PY = sys.executable

import harness  # noqa: E402  (from tests/, put on the path just above)

# A suite started in the background from a script (`pytest ... &`) or under nohup inherits
# SIGINT or SIGHUP ignored, and every process it starts would too: the tests that press Ctrl-C
# in `gpuq serve` or close `gpuq run`'s terminal then failed for the way the suite was started.
# Each test process (xdist's workers import this too) takes them back to their defaults.
for _sig, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _default)


# Verbs that set up their process for their lifetime (serve, top and run take signals and the
# terminal; report --html loads matplotlib): a process of their own even where they refuse.
KEEP_THEIR_PROCESS = frozenset({"serve", "top", "run", "shell", "srun", "salloc", "report"})


def wait_until(
    predicate: Callable[[], object], timeout: float = 60.0, interval: float = 0.05, what: str = "condition"
) -> object:
    """The predicate's first true value, asked every `interval` seconds, or twice as long as
    it took the last time: a predicate that runs `gpuq status` (a process of a fifth of a
    second) then takes a third of a core while it waits, not all of one, from the workers
    it waits for on a busy two-core machine."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        value = predicate()
        if value:
            return value
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(max(interval, 2 * (now - asked)))


def remove_local_dir(local: Path | str) -> None:
    """A box's local directory at its default place (under /run/gpuq, which outlives the test)
    and what the worker keeps beside it: the fake GPUs' directory and the MPS daemons'."""
    for left in (str(local), fake_gpus_dir(local), f"{local}-mps"):  # -mps: the mps extra's, if there
        if os.path.islink(left):  # a link a test planted there (rmtree refuses one)
            os.unlink(left)
        shutil.rmtree(left, ignore_errors=True)


def worker_argv(root: Path | str, host: str, fake: str, *extra: str, command: list[str] | None = None) -> list[str]:
    """The command line of a stand-in box's worker on fake GPUs (worker.py, as cron runs it)."""
    command = command or [PY, str(REPO / "worker.py")]
    return [*command, "--root", str(root), "--host", host, "--fake-gpus", fake, *extra]


class Queue:
    """A queue root in a temp dir, driven only through gpuq.py and worker.py."""

    def __init__(self, root: Path, local_base: Path) -> None:
        self.root = root
        self.workers: dict[str, subprocess.Popen] = {}
        self.started: list[tuple[subprocess.Popen, Path]] = []  # every worker started, and its stderr file
        (root / "jobs").mkdir(parents=True)
        self.local_base = local_base
        self.write_config()

    def write_config(self, **overrides: object) -> None:
        # The suite runs as root in CI: its specs are root's (tests about users make their own).
        cfg = {
            "poll_interval": 0.2,
            "spec_settle_s": 1,
            "grace_s": 2,
            "allow_root_jobs": os.geteuid() == 0,
            "local_dir": str(self.local_base / "{host}"),
            **overrides,
        }
        (self.root / "config.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in cfg.items()) + "\n")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("GPUQ_ROOT", None)
        env.pop("GPUQ_FAKE_GPUS", None)
        return env

    def gpuq(self, *args: str, check: bool = True, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        """`gpuq --root ROOT ARGS`: the CLI's own code in this process where a process would
        add nothing (the plain launcher on a root this process owns, asked from the main
        thread, with nothing of a process's own: no stdin, environment or directory); else a
        `gpuq` process. A process was a quarter of a second of CPU each, hundreds a run; the
        launcher, terminals and users keep their process tests."""
        if (
            not kw
            and not set(args) & KEEP_THEIR_PROCESS
            and type(self).cli_command is Queue.cli_command
            and threading.current_thread() is threading.main_thread()
            and not {"GPUQ_ROOT", "GPUQ_FAKE_GPUS"} & os.environ.keys()
            and harness.runs_here(self.root)
        ):
            return harness.gpuq(self.root, *args, check=check, timeout=timeout, launcher_dir=str(REPO))
        kw.setdefault("env", self.env())
        proc = subprocess.run(
            [*self.cli_command(), "--root", str(self.root), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            **kw,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"gpuq {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def status(self) -> dict:
        """`gpuq status --json` (in this process where gpuq() runs it here: tests poll it while workers run)."""
        return json.loads(self.gpuq("status", "--json").stdout)

    def start_worker(
        self, host: str, fake: str = "4x80GiB", *extra: str, env: dict[str, str] | None = None, wait: bool = True
    ) -> subprocess.Popen:
        # Its stderr to a file, never a pipe nobody reads: a worker that logged ~400 refusals
        # filled the pipe and hung in write(2). `worker_stderr` reads it. Beside the root, which
        # pytest keeps after a failure (the local directories may be removed with the test).
        self.local_base.mkdir(parents=True, exist_ok=True)
        with open(self.root.parent / f"worker-{host}.{len(self.started)}.stderr", "wb") as err:
            proc = subprocess.Popen(
                worker_argv(self.root, host, fake, "--foreground", *extra, command=self.worker_command()),
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**self.env(), **(env or {})},
            )
        self.started.append((proc, Path(err.name)))
        self.workers[host] = proc
        if wait:  # (cron does not wait: a kill storm restarts as cron would)
            self.wait_started(host)
        return proc

    def wait_started(self, host: str) -> None:
        """Until the worker last started for `host` has written its first heartbeat (workers
        started with wait=False start side by side)."""
        pid = self.workers[host].pid
        # Generous: four workers reading 2,000 specs each beside seven other tests took over 20 s.
        wait_until(lambda: self._beat_of(host, pid), timeout=60, what=f"worker {host} heartbeat")

    def worker_command(self) -> list[str]:
        """The interpreter and launcher a box's worker is started with."""
        return [PY, str(REPO / "worker.py")]

    def cli_command(self) -> list[str]:
        """The interpreter and launcher `gpuq` is run with (by root, in `gpuq()`)."""
        return [PY, str(REPO / "gpuq.py")]

    def refusals(self, job_id: str) -> str:
        """The .error texts of specs refused under `job_id`, joined: its own (<id>.error) and
        those refused because the id is another job's (<id>+<time>.<hex>.error)."""
        pattern = re.compile(re.escape(job_id) + r"(\+\d+\.[0-9a-f]{6})?\.error")
        rejected = self.root / "state" / "rejected"
        return "".join(p.read_text() for p in sorted(rejected.iterdir()) if pattern.fullmatch(p.name))

    def worker_stderr(self, proc: subprocess.Popen) -> str:
        """What a worker this queue started wrote to its stderr."""
        return next(path for p, path in self.started if p is proc).read_text(errors="replace")

    def wait_passes(self, host: str, passes: int = 2, timeout: float = 60) -> None:
        """Until `host`'s worker has written `passes` more heartbeats. A heartbeat is the last
        step of a pass, at most one a pass: with passes >= 2, a whole pass began after this
        call, so whatever the worker was going to do about what a test set up, it has done. A
        negative check ("nothing ran") waits for this instead of sleeping a fixed time."""
        assert passes >= 2, "one more heartbeat may end a pass that began before the call"

        def seq() -> int:
            try:
                return json.loads((self.root / "state" / "workers" / f"{host}.json").read_text())["seq"]
            except (OSError, ValueError, KeyError):
                return -1

        start = seq()
        wait_until(lambda: seq() >= start + passes, timeout=timeout, what=f"{passes} passes of worker {host}")

    def _beat_of(self, host: str, pid: int) -> bool:
        """This worker's own heartbeat (one a stopped worker of the host left is not it): `pid`
        is the process the test started, the box's starter, whose child the worker is."""
        try:
            return json.loads((self.root / "state" / "workers" / f"{host}.json").read_text()).get("starter_pid") == pid
        except (OSError, ValueError):
            return False

    def worker_pid(self, host: str) -> int:
        """The pid of box `host`'s worker (the starter's child), as its heartbeat names it."""
        return json.loads((self.root / "state" / "workers" / f"{host}.json").read_text())["pid"]

    def worker_process(self, host: str):
        """The worker of box `host` (a psutil.Process): the child of the starter the test started."""
        import psutil

        starter = psutil.Process(self.workers[host].pid)
        return wait_until(lambda: next(iter(starter.children()), None), what=f"worker {host} under its starter")

    def stop_worker(self, host: str, sig: int = signal.SIGTERM) -> None:
        proc = self.workers.pop(host)
        proc.send_signal(sig)
        proc.wait(timeout=20)

    def kill_worker(self, host: str, silent_s: float = 0.0) -> None:
        """SIGKILL box `host`'s worker (through its starter: the worker dies with it) and wait
        until it is gone. With `silent_s`, its heartbeat is then made to look that many seconds
        old: status and forget judge a box by the heartbeat file's mtime, which a dead worker
        never moves again, so this is the box as seen once that long has passed, without the
        wait. Only where nothing else judges the box by time (lost_after_s well above it)."""
        import psutil

        worker_pid = self.worker_pid(host)
        self.stop_worker(host, signal.SIGKILL)
        wait_until(
            lambda: not psutil.pid_exists(worker_pid) or psutil.Process(worker_pid).status() == psutil.STATUS_ZOMBIE,
            what=f"worker {host} gone",
        )
        if silent_s:
            beat = self.root / "state" / "workers" / f"{host}.json"
            then = beat.stat().st_mtime - silent_s
            os.utime(beat, (then, then))

    def spawner(self, host: str):
        """The spawner of this root's worker `host` (a psutil.Process), once it has started."""
        worker = self.worker_process(host)
        return wait_until(lambda: next(iter(worker.children()), None), what=f"worker {host}'s spawner")

    def drop(self, name: str, text: str) -> Path:
        """Write a spec the way a user's editor would: temp file, then rename into jobs/."""
        path = self.root / "jobs" / name
        tmp = self.root / "jobs" / f".{name}.tmp"
        tmp.write_text(text)
        os.rename(tmp, path)
        return path

    def record(self, job_id: str) -> dict | None:
        for d in ("finished", "running"):
            p = self.root / "state" / d / f"{job_id}.json"
            if p.exists():
                return json.loads(p.read_text())
        return None

    def finished(self, job_id: str) -> dict | None:
        p = self.root / "state" / "finished" / f"{job_id}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def events(self) -> list[dict]:
        out = []
        for p in (self.root / "state" / "events").glob("*.jsonl"):
            out += [json.loads(line) for line in p.read_text().splitlines()]
        return sorted(out, key=lambda e: e["t"])

    def log(self, job_id: str) -> str:
        p = self.root / "logs" / f"{job_id}.log"
        return p.read_text() if p.exists() else ""

    def close(self) -> None:
        for host in list(self.workers):
            proc = self.workers.pop(host)
            proc.kill()
            proc.wait()
        self.close_jobs()

    def close_jobs(self) -> None:
        """End every spawner, supervisor and job of this root, as a power cut would (they
        are in their own sessions, so nothing else ends them). Until a sweep finds none: a
        start under way forks after the list of processes was taken (a loaded run left two
        jobs' `sleep 600` behind, started after the sweep that killed their supervisors)."""
        import psutil

        for _ in range(10):
            killed = 0
            for p in psutil.process_iter(["cmdline", "environ"]):
                try:
                    if (p.info["environ"] or {}).get("GPUQ_ROOT") == str(self.root) or any(
                        str(self.root) in arg for arg in p.info["cmdline"] or []
                    ):
                        p.kill()
                        killed += 1
                except psutil.Error:
                    pass
            if not killed:
                return


@pytest.fixture
def queue(tmp_path: Path):
    # The boxes' local directories hold sockets (MPS pipes), whose paths may not pass 100
    # characters: under /tmp itself, not under tmp_path (pytest-xdist makes it longer still).
    local = Path(tempfile.mkdtemp(prefix="gq-", dir="/tmp"))
    q = Queue(tmp_path / "root", local)
    try:
        yield q
    finally:
        q.close()
        shutil.rmtree(local, ignore_errors=True)


def fake_job(seconds: float = 0.3, extra: str = "") -> str:
    """A job command that prints its GPUs and holds its declared fake GPU memory."""
    return f"echo CVD=$CUDA_VISIBLE_DEVICES{extra}; exec {PY} {REPO / 'gpuq.py'} fake-use --seconds {seconds}"


# --- tiers: `python -m pytest -m "not slow"` is the fast set (docs/design.md, Testing) -------
# slow: the test starts a process (a worker, the CLI, a supervisor, useradd...), or takes
# seconds of CPU drawing nested random values (two of the spec's fuzz tests). A test not marked slow that
# starts a process fails (the guard below), so the fast set stays in-process.
# root: it creates users (needs root; CI runs as root). installs: it may apt-get install Slurm, cron,
# docker or podman where they are missing.
_ROOT_FIXTURES = frozenset({"users", "team", "shared_code"})
_INSTALL_FIXTURES = frozenset({"slurm", "real", "cron"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _ROOT_FIXTURES:
            item.add_marker(pytest.mark.root)
            item.add_marker(pytest.mark.slow)
        if names & _INSTALL_FIXTURES:
            item.add_marker(pytest.mark.installs)
            item.add_marker(pytest.mark.slow)
    _long_ones_first_on_each_worker(config, items)


def _long_ones_first_on_each_worker(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order pytest-xdist hands tests out in: the process tests, then the in-process ones
    (hundredths of a second each), which fill the workers' time while the last process tests
    end; and each minute-long test (marked `long`) at the head of a different worker's first
    batch. xdist's load scheduling first sends each worker a batch of consecutive tests (a
    quarter of its share, at least two): the long tests side by side ran one after another on
    one worker (447 s of a 498 s run), and one handed out late ran alone at the end."""
    long = [item for item in items if item.get_closest_marker("long")]
    rest = [item for item in items if not item.get_closest_marker("long")]
    rest.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)
    workers = getattr(config, "workerinput", {}).get("workercount", 1)
    batch = max(len(items) // workers // 4, 2)
    for n, item in enumerate(long):
        rest.insert(min(n, workers) * batch + max(0, n - workers), item)
    items[:] = rest


@pytest.fixture(autouse=True)
def _descriptors_closed_after_each_test() -> Iterator[None]:
    """In-process boxes and event logs keep descriptors open as a worker does: closed after
    each test, as the worker's exit would (the run kept hundreds)."""
    yield
    harness.close_all()


@pytest.fixture(autouse=True)
def _fast_tests_start_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("slow") is not None:
        return

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.slow")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse)  # multiprocessing's spawn and forkserver
    for name in ("fork", "forkpty", "system", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "execv", "execve"):
        monkeypatch.setattr(os, name, refuse)
    monkeypatch.setattr(pty, "fork", refuse)
