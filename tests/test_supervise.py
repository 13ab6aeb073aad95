"""The supervisor's start (run/supervise.py), called in this process: what it decides before
anything runs. The job itself, and what runs it, are the process tests' (test_worker.py)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.run import supervise as supervise_module
from gpuq.run.joblocal import Runtime
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record, write_record


def _locked(rt: Runtime, job_id: str) -> int:
    """The job's lock file opened as the spawner hands it over (the lock itself is the
    spawner's business: the supervisor only writes its marker into the file)."""
    path = rt.lock_path(job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


def test_a_launch_that_arrives_after_its_attempt_was_replaced_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The worker writes the running record, then hands the launch over. A launch slow to
    arrive may find its attempt settled and the job started again meanwhile (a new attempt,
    under a new claim). The supervisor compares the record's claim with its own first: it runs
    nothing, writes no `started` marker, and leaves the new attempt's record as it is."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    rt = Runtime(layout, "a", "boot0000", tmp_path / "local", 1.0, 10.0, {})
    late = Record(
        id="j",
        state=State.RUNNING,
        spec={},
        spec_text="command: echo hi\n",
        host="a",
        boot_id="boot0000",
        claim="j@a@boot0000@1@aa@a1.yaml",
    )
    current = replace(late, attempt=2, claim="j@a@boot0000@1@bb@a2.yaml")
    write_record(layout, current)
    ran: list[Record] = []  # what would go on to start the job as its owner, and record it
    monkeypatch.setattr(supervise_module, "_run_and_record", lambda rt, record, lock_fd, clock: ran.append(record))

    supervise_module.supervise(rt, late, _locked(rt, "j"))
    assert ran == [], "the replaced attempt was run"
    assert rt.lock_path("j").read_bytes() == b""  # no `started` marker: nobody takes it for running
    assert read_record(layout.record(layout.running, "j")) == current

    # The attempt the record names is run, and marked started under its own claim.
    supervise_module.supervise(rt, current, _locked(rt, "j"))
    assert ran == [current]
    assert json.loads(rt.lock_path("j").read_bytes())["claim"] == current.claim
