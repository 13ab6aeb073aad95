"""Findings of the 2026-11-30 security review that are about robustness, not a member's attack:
a full disk must not fence healthy jobs (H7), a freed inode reused at once must not make the
worker act on a stale record (H2), and a requeue that recreates a lost claim gives it back to
its owner (M6)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import wait_until, worker_argv


@pytest.mark.slow
def test_a_full_disk_does_not_fence_healthy_jobs_nor_let_another_host_take_them(queue):
    """H7: with heartbeat writes failing, every job was killed after 0.6 x lost_after_s, against
    docs/reliability.md (running jobs keep running when the shared disk is full). The job runs
    past 0.6 x lost_after_s; lost_after_s is 10 s, not 5: with two copies of the suite on two
    cores, a's restart took over 5 s to renew its heartbeat, and b rightly took a for gone."""
    queue.write_config(lost_after_s=10, grace_s=1)
    queue.start_worker("b", "1x80GiB")  # watches a's heartbeat
    queue.start_worker("a", "1x80GiB")  # a's heartbeat is on disk; then the disk fills up
    queue.stop_worker("a")
    worker = queue.workers["a"] = subprocess.Popen(
        worker_argv(queue.root, "a", "1x80GiB", "--foreground"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**queue.env(), "GPUQ_TEST_IO_FAULT": "write:workers=ENOSPC"},
    )
    queue.drop("long.yaml", "command: sleep 12; echo once\ngpus: 1\nhosts: [a]\n")
    record = wait_until(lambda: queue.finished("long"), timeout=60, what="long to end")
    assert record["state"] == "done" and record["attempt"] == 1, record
    assert queue.log("long").splitlines().count("once") == 1
    assert worker.poll() is None
    assert not [e for e in queue.events() if e.get("to") == "pending"]  # b took nothing over
    log = (queue.root / "logs" / "workers" / "a.log").read_text()
    assert "cannot write this host's heartbeat (No space left on device)" in log


def test_a_record_rewritten_under_the_same_inode_is_read_again(tmp_path):
    """H2: records were cached by (name, inode); ext4 reuses a freed inode at once, so a
    requeued job's next attempt kept attempt N's record, and its cancels were dropped."""
    from gpuq.spool.layout import Layout
    from gpuq.spool.listing import RunningListing

    layout = Layout(tmp_path)
    layout.ensure()
    listing = RunningListing(layout, "a", lambda key, message: None)  # what a worker reads running/ with
    path = layout.running / "j.json"
    record = {"id": "j", "state": "running", "spec": {}, "host": "a", "attempt": 1, "uid": 0}
    path.write_text(json.dumps(record))
    inode = os.stat(path).st_ino
    assert [r.attempt for r in listing.read()] == [1]
    with open(path, "w") as f:  # the same inode, as a delete-then-create on ext4 gives
        f.write(json.dumps({**record, "attempt": 12}))
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)
    assert os.stat(path).st_ino == inode
    assert [r.attempt for r in listing.read()] == [12]


def test_a_record_that_lands_in_the_clock_tick_of_a_listing_is_read_later(tmp_path):
    """running/'s mtime has a clock tick's resolution: a record renamed in during the tick of a
    listing leaves the mtime as it was. A listing taken while the mtime was that recent must not
    stand once it has aged (a later pass skipped the new record, for good); one taken once the
    mtime had stood RACY_MTIME_S on the box's clock stands (one stat, no listing)."""
    from gpuq.spool.dirwatch import RACY_MTIME_S, MtimeWatch
    from gpuq.spool.layout import Layout
    from gpuq.spool.listing import RunningListing

    layout = Layout(tmp_path)
    layout.ensure()
    mono = [1000.0]  # the box's monotonic clock
    listing = RunningListing(layout, "a", lambda key, message: None, MtimeWatch(lambda: mono[0]))
    tick = os.stat(layout.running).st_mtime_ns
    assert listing.read() == []  # listed as the mtime was first seen: within the tick's racy window
    record = {"id": "j", "state": "running", "spec": {}, "host": "a", "attempt": 1, "uid": 0}
    (layout.running / "j.json").write_text(json.dumps(record))
    os.utime(layout.running, ns=(tick, tick))  # the same tick: the directory's mtime did not move
    mono[0] += RACY_MTIME_S + 1
    assert [r.id for r in listing.read()] == ["j"]
    (layout.running / "k.json").write_text(json.dumps({**record, "id": "k"}))
    os.utime(layout.running, ns=(tick, tick))  # as if in the same tick still: a listing that stood is kept
    assert [r.id for r in listing.read()] == ["j"]


def _box_ahead_of_the_disk(root: Path):
    """A box on two GPUs whose wall clock runs 10 s ahead of the file server's (which sets the
    directories' mtimes), past its worker's first settling."""
    from harness import FakeClock, PassWorker

    clock = FakeClock()
    clock.wall_s += 10  # ahead of the disk (the real clock, here)
    box = PassWorker(root, "a", "2x80GiB", clock=clock)
    box.run_pass(after_s=6)
    return box


def test_a_box_whose_clock_runs_ahead_of_the_disks_sees_its_own_record_landed_in_a_listings_tick(tmp_path):
    """Every listing of running/ looked old enough to stand: the box's own new running record,
    landed in the tick of the listing before it, was missed, and a job wanting both GPUs whole
    started beside it (an exclusive GPU overcommitted). The record is made here to keep
    running/'s mtime, as a change within one tick does."""
    from harness import status

    box = _box_ahead_of_the_disk(tmp_path / "root")
    box.drop("long.yaml", "command: sleep 600\ngpus: 1\ngpu_mem: 10GiB\n")
    running = box.layout.running
    (running / ".x").touch()  # running/ changes now (another job ended): a new tick
    (running / ".x").unlink()
    before = os.stat(running).st_mtime_ns
    box.run_pass(after_s=1)  # lists running/, then starts long: its record lands in that tick
    assert box.launched() == ["long"]
    os.utime(running, ns=(before, before))
    box.drop("blocked.yaml", "command: echo should-not-run\ngpus: 2\n")  # both GPUs, whole
    for _ in range(4):
        box.run_pass(after_s=0.5)
    assert box.launched() == ["long"], "a two-GPU exclusive job started beside long on a box of two GPUs"
    assert [p["id"] for p in status(box.root)["pending"]] == ["blocked"]


def test_a_box_whose_clock_runs_ahead_of_the_disks_sees_a_spec_dropped_in_a_scans_tick(tmp_path):
    """Every scan of jobs/ looked old enough to stand: a spec dropped in the tick of the last
    scan waited for the next full scan (30 s). The drop is made here to keep jobs/'s mtime."""
    box = _box_ahead_of_the_disk(tmp_path / "root")
    jobs = box.layout.jobs
    (jobs / "notes.txt").write_text("not a spec")  # jobs/ changes now: a new tick
    box.run_pass(after_s=1)  # a scan of jobs/ in that tick
    tick = os.stat(jobs).st_mtime_ns
    box.drop("late.yaml", "command: echo late\ngpus: 1\n")
    os.utime(jobs, ns=(tick, tick))
    box.run_pass(after_s=0.5)
    assert box.launched() == ["late"]  # seen, and started on a free GPU


def test_a_listing_of_running_that_failed_does_not_stand(tmp_path, monkeypatch):
    """A new record landed, and running/'s mtime stood; the listing then failed (EIO, ESTALE on
    NFS). The read after must list again: the mtime was kept before the listing, and the box
    went on without its own running job for as long as running/ did not change."""
    from gpuq.spool import listing as listing_module
    from gpuq.spool.dirwatch import RACY_MTIME_S, MtimeWatch
    from gpuq.spool.layout import Layout
    from gpuq.spool.listing import RunningListing

    layout = Layout(tmp_path)
    layout.ensure()
    mono = [1000.0]
    listing = RunningListing(layout, "a", lambda key, message: None, MtimeWatch(lambda: mono[0]))
    assert listing.read() == []
    record = {"id": "j", "state": "running", "spec": {}, "host": "a", "attempt": 1, "uid": 0}
    (layout.running / "j.json").write_text(json.dumps(record))

    def failing(path: object) -> object:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(listing_module.os, "scandir", failing)
    for _ in range(2):  # first seen, then stood
        with pytest.raises(OSError):
            listing.read()
        mono[0] += RACY_MTIME_S + 1
    monkeypatch.undo()
    assert [r.id for r in listing.read()] == ["j"]


def test_a_record_gone_between_listing_and_reading_is_not_reported(tmp_path, monkeypatch):
    """A job that ends while a pass lists running/ is not a bad file: the worker logged
    "state/running/j.json skipped: No such file or directory" for a healthy job."""
    from gpuq.spool import listing as listing_module
    from gpuq.spool.layout import Layout
    from gpuq.spool.listing import RunningListing

    layout = Layout(tmp_path)
    layout.ensure()
    reported: list[str] = []
    listing = RunningListing(layout, "a", lambda key, message: reported.append(message))
    for job in ("gone", "stays"):
        record = {"id": job, "state": "running", "spec": {}, "host": "a", "attempt": 1, "uid": 0}
        (layout.running / f"{job}.json").write_text(json.dumps(record))
    real_scandir = os.scandir

    class EndsMidListing:  # the directory as listed, then the supervisor records "gone" as ended
        def __enter__(self):
            with real_scandir(layout.running) as it:
                entries = list(it)
            (layout.running / "gone.json").unlink()
            return iter(entries)

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(listing_module.os, "scandir", lambda path: EndsMidListing())
    assert [r.id for r in listing.read()] == ["stays"]
    assert reported == []


def test_a_recreated_claim_is_its_owners_spec(tmp_path):
    """M6: a requeue that found its claim gone recreated it as root, and intake then
    rejected the job ("owned by root") instead of running it again."""
    from gpuq.model.config import Config
    from gpuq.model.record import Record
    from gpuq.model.states import State
    from gpuq.run.joblocal import Runtime
    from gpuq.spool.intake import Intake
    from gpuq.spool.layout import Layout
    from gpuq.spool.store import write_record
    from gpuq.worker.box import Box
    from gpuq.worker.recovery import Recovery

    layout = Layout(tmp_path)
    layout.ensure()
    owner = 4242  # a uid without an account is fine for a file
    claim = "j@a@bootboot@1@abcd@a1.yaml"
    record = Record(
        id="j",
        state=State.RUNNING,
        spec={},
        spec_text="command: echo hi\n",
        user="x",
        uid=owner,
        host="a",
        boot_id="bootboot",
        claim=claim,
        queued_at=1000.0,
    )
    write_record(layout, record)
    rt = Runtime(layout, "a", "bootboot", tmp_path / "local", 1.0, 10.0, {})
    recovery = Recovery(Box(Config(), rt, Intake(layout)))
    recovery.requeue(record, "lost; requeued")
    spec = layout.jobs / "j.yaml"
    assert spec.read_text() == "command: echo hi\n"
    st = os.stat(spec)
    assert st.st_uid == (owner if os.geteuid() == 0 else os.geteuid()) and not st.st_mode & 0o022
    from gpuq.spool.store import kept_place

    assert kept_place(layout, "j", st.st_uid) == 1000.0  # its old place in the queue
    assert not list(Path(layout.claims).iterdir())


def test_an_orphan_claim_of_an_earlier_boot_is_put_back_even_with_this_pid(tmp_path):
    """A claim left by a worker before a reboot was skipped when the new worker happened to
    get the same pid: the job stayed "being started" for good."""
    from gpuq.model.config import Config
    from gpuq.run.joblocal import Runtime
    from gpuq.spool.intake import Intake
    from gpuq.spool.layout import Layout
    from gpuq.worker.box import Box
    from gpuq.worker.recovery import Recovery

    layout = Layout(tmp_path)
    layout.ensure()
    orphan = layout.claims / f"j@a@oldboot0@{os.getpid()}@abcd@a1.yaml"
    orphan.write_text("command: echo hi\n")
    rt = Runtime(layout, "a", "newboot0-after-the-reboot", tmp_path / "local", 1.0, 10.0, {})
    Recovery(Box(Config(), rt, Intake(layout))).requeue_orphan_claims()
    assert (layout.jobs / "j.yaml").read_text() == "command: echo hi\n" and not orphan.exists()
