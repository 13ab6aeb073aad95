"""An in-process worker driven pass by pass: the real Worker with its clock, spawner and
container-runtime probe replaced, so that a test of what one pass decides starts no process
and waits for nothing (the fast set). What needs processes (supervisors, crashes, signals,
users) stays in the real-process tests."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from gpuq.host.clock import Clock
from gpuq.model.config import load
from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.run.joblocal import finish_local
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record, transition
from gpuq.worker.loop import Worker


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


class RecordingSpawner:
    """Takes the launches a pass makes instead of starting supervisors. A launched job stays
    "starting" (so a pass does not judge it gone) until the test `finish`es it."""

    def __init__(self) -> None:
        self.launched: list[Record] = []
        self.starting: set[str] = set()

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


class PassWorker:
    """A queue root and one box's worker in this process."""

    def __init__(self, root: Path, host: str = "a", fake_gpus: str = "2x24GiB", **config: object) -> None:
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
        self.clock = FakeClock()
        self.spawner = RecordingSpawner()
        config = load(self.layout.config_file)
        self.worker = Worker(
            self.layout, config, host, fake_gpus, clock=self.clock, spawner=self.spawner, runtimes=NoContainerRuntimes()
        )
        self.worker.begin()

    def run_pass(self, after_s: float = 0.0) -> None:
        self.clock.advance(after_s)
        self.worker.run_pass()

    def drop(self, name: str, text: str) -> Path:
        path = self.root / "jobs" / name
        path.write_text(text)
        return path

    def finish(self, job_id: str, exit_code: int = 0) -> Record:
        """The launched job ends as its supervisor would record it: the finished record (the
        one `StateChange`), then its claim and local files go; the next pass sees it ended."""
        running = read_record(self.layout.record(self.layout.running, job_id))
        assert running is not None and running.host == self.host, f"{job_id} does not run on {self.host}"
        now = self.clock.wall()
        state = State.DONE if exit_code == 0 else State.FAILED
        ended = transition(self.layout, running, state, self.host, started_at=now, ended_at=now, exit_code=exit_code)
        finish_local(self.worker.rt, ended)
        self.spawner.starting.discard(job_id)
        return ended

    def launched(self) -> list[str]:
        return [r.id for r in self.spawner.launched]

    def heartbeat(self) -> dict:
        return json.loads((self.layout.state / "workers" / f"{self.host}.json").read_text())
