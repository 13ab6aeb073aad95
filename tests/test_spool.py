"""The spool on tmp dirs: atomic writes, exactly-once claims, the transition table."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import pwd
from dataclasses import replace
from pathlib import Path

import pytest

from gpuq.host.files import atomic_write
from gpuq.host.owners import Actor
from gpuq.model.record import Record, claim_name, parse_claim_name
from gpuq.model.states import ALLOWED, State, TransitionError, check_transition
from gpuq.spool.decommission import forget
from gpuq.spool.drain import DrainError
from gpuq.spool.layout import Layout, job_id_for_spec_name
from gpuq.spool.store import claim, read_record, running_records, transition, write_record


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    lay = Layout(tmp_path)
    lay.ensure()
    return lay


def test_spec_names():
    assert job_id_for_spec_name("train-a.yaml") == "train-a"
    assert job_id_for_spec_name("train-a.yml") == "train-a"
    for ignored in (".train.yaml", "train.yaml.tmp", "train.yaml~", ".train.yaml.swp", "README.md"):
        assert job_id_for_spec_name(ignored) is None


def test_atomic_write_leaves_no_temp_and_replaces(tmp_path):
    target = tmp_path / "f.json"
    atomic_write(target, b"one")
    atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["f.json"]


def test_transition_table_is_enforced(layout):
    record = Record(id="j", state=State.RUNNING, spec={"gpu_mem_mib": 1}, host="a")
    write_record(layout, record)
    done = transition(layout, record, State.DONE, "a", exit_code=0)
    assert not (layout.running / "j.json").exists()
    assert read_record(layout.finished / "j.json") == done
    with pytest.raises(TransitionError):
        transition(layout, done, State.RUNNING, "a")
    for old, allowed in ALLOWED.items():
        for new in State:
            if new not in allowed:
                with pytest.raises(TransitionError):
                    check_transition("j", old, new)
    events = (layout.events / "a.jsonl").read_text().splitlines()
    assert len(events) == 1 and '"to":"done"' in events[0]


def test_a_job_caught_between_running_and_finished_is_finished_and_does_not_keep_its_host(layout):
    """A change of state writes the new record before it removes the old one (StateChange): a
    reader in between, or after a crash there, finds the job in running/ and finished/. The
    later state wins: the job is not listed running, and `gpuq forget` of its host, which
    refuses while a job is recorded running there, is not refused for it."""
    me = Actor(os.geteuid(), pwd.getpwuid(os.geteuid()).pw_name, True)
    halfway = Record(id="halfway", state=State.RUNNING, spec={}, host="gone")
    write_record(layout, halfway)
    write_record(layout, replace(halfway, state=State.DONE, exit_code=0))
    still = Record(id="still", state=State.RUNNING, spec={}, host="gone")
    write_record(layout, still)
    write_record(layout, Record(id="elsewhere", state=State.RUNNING, spec={}, host="alive"))
    layout.heartbeat("gone").write_text(json.dumps({"host": "gone", "t": 0.0, "stopped": True}))
    with pytest.raises(DrainError, match=r"gone still has 1 job\(s\) recorded running \(still\);"):
        forget(layout, "gone", me, lost_after_s=180.0)
    assert [r.id for r in running_records(layout)] == ["elsewhere", "still"]
    transition(layout, still, State.DONE, "gone", exit_code=0)
    assert forget(layout, "gone", me, lost_after_s=180.0).startswith("gone: forgotten")
    assert not layout.heartbeat("gone").exists()


def test_claim_names_are_unique_and_parse():
    a, b = claim_name("job.x", "host-1", "bootid12345", 1), claim_name("job.x", "host-1", "bootid12345", 1)
    assert a != b
    assert parse_claim_name(a) == ("job.x", "host-1")


def _race(args: tuple[str, str, int]) -> str | None:
    root, job_id, n = args
    lay = Layout(Path(root))
    got = claim(lay, lay.jobs / f"{job_id}.yaml", claim_name(job_id, f"h{n}", "boot0000", 1))
    return got.name if got else None


@pytest.mark.slow
def test_exactly_one_of_many_claimers_wins(layout):
    for i in range(50):
        (layout.jobs / f"j{i}.yaml").write_text("command: x\n")
    with multiprocessing.get_context("fork").Pool(8) as pool:
        for i in range(50):
            winners = [w for w in pool.map(_race, [(str(layout.root), f"j{i}", n) for n in range(8)]) if w]
            assert len(winners) == 1
    assert len(os.listdir(layout.claims)) == 50 and not list(layout.jobs.glob("*.yaml"))


def test_a_lost_reply_after_a_successful_rename_is_settled_by_the_destination(layout, monkeypatch):
    (layout.jobs / "j.yaml").write_text("command: x\n")
    real_rename = os.rename

    def rename_then_lose_reply(src, dst):
        real_rename(src, dst)
        raise OSError(errno.ENOENT, "lost reply")

    monkeypatch.setattr(os, "rename", rename_then_lose_reply)
    got = claim(layout, layout.jobs / "j.yaml", claim_name("j", "a", "boot0000", 1))
    assert got is not None and got.exists()
    assert claim(layout, layout.jobs / "j.yaml", claim_name("j", "b", "boot0000", 1)) is None
