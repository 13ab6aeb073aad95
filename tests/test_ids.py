"""One reservation per accepted job id (spool/ids.py): made exclusively and never replaced, read
as a file others may have written, made wherever a worker first accepts a job, and filled once
from where older workers kept jobs on a queue made before state/ids/."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from harness import PassWorker

from gpuq.host.files import write_json
from gpuq.host.owners import Actor
from gpuq.model.groups import GroupError
from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.spool.cancel import cancel_one, cancel_pending
from gpuq.spool.holds import HoldError, hold, release, retry, submit_held
from gpuq.spool.ids import COMPLETE, NOBODY, RESERVATION_CAP, held_for, id_taken, migrate, reserve, reserve_new
from gpuq.spool.layout import Layout
from gpuq.spool.store import keep_place
from gpuq.spool.sweeps import expand_dropped_sweep

ALICE, BOB = 4242, 4343
ME = Actor(os.geteuid(), "me", True)
SPEC = "command: echo hi\ngpus: 0\n"


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    """A queue made since state/ids/: its (empty) reservations are complete."""
    lay = Layout(tmp_path / "root")
    lay.ensure()
    migrate(lay)
    return lay


def _spec(layout: Layout, job_id: str, uid: int, text: str = SPEC) -> Path:
    path = layout.jobs / f"{job_id}.yaml"
    path.write_text(text)
    os.chown(path, uid, -1)
    return path


def test_a_reservation_is_made_once_and_never_replaced(layout):
    assert not id_taken(layout, "x") and held_for(layout, "x") is None
    assert reserve(layout, "x", ALICE) == ALICE
    assert reserve(layout, "x", BOB) == ALICE  # whose it is, not bob's
    assert not reserve_new(layout, "x", BOB) and reserve(layout, "x", ALICE) == ALICE
    assert held_for(layout, "x") == ALICE and id_taken(layout, "x")
    st = os.lstat(layout.ids / "x")
    assert stat.S_IMODE(st.st_mode) == 0o640 and json.loads((layout.ids / "x").read_text()) == {"uid": ALICE}
    assert reserve_new(layout, "y", BOB) and held_for(layout, "y") == BOB
    assert sorted(os.listdir(layout.ids)) == [COMPLETE, "x", "y"]  # no temp file left


def _plant(layout: Layout, kind: str) -> None:
    """What a worker never writes, as state/ids/x."""
    path = layout.ids / "x"
    if kind == "link":  # to a reservation of alice's: still not read through
        reserve(layout, "a", ALICE)
        os.symlink("a", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "hard link":
        reserve(layout, "a", ALICE)
        os.link(layout.ids / "a", path)
    elif kind == "directory":
        path.mkdir()
    else:
        text = {
            "garbage": b"\x00not json",
            "huge": b'{"uid": 4242, "pad": "' + b"x" * RESERVATION_CAP + b'"}',
            "negative uid": b'{"uid": -1}',
            "no uid": b'{"uid": null}',
            "bool uid": b'{"uid": true}',
            "uid too big": b'{"uid": 4294967296}',
            "a list": b"[4242]",
            "another owner": b'{"uid": 4242}',
        }[kind]
        path.write_bytes(text)
        if kind == "another owner":  # only the queue's account (state/'s owner) or root writes ids/
            os.chown(layout.ids, 1234, -1)
            os.chown(path, BOB, -1)


@pytest.mark.parametrize(
    "kind",
    [
        "link",
        "fifo",
        "hard link",
        "directory",
        "garbage",
        "huge",
        "negative uid",
        "no uid",
        "bool uid",
        "uid too big",
        "a list",
        "another owner",
    ],
)
def test_anything_else_in_ids_takes_the_id_for_nobody(layout, kind):
    """A link, a FIFO (never blocked on), garbage, a file too big or naming no uid: the id is
    taken, by nobody we can name (as a damaged record was); it is never replaced or written
    through, and a file under it is refused as an earlier job's only by the other checks."""
    _plant(layout, kind)
    assert id_taken(layout, "x") and held_for(layout, "x") == NOBODY
    assert reserve(layout, "x", BOB) == NOBODY and not reserve_new(layout, "x", BOB)
    if kind in ("link", "hard link"):  # the target is as it was (a second link makes it suspect too)
        assert json.loads((layout.ids / "a").read_text()) == {"uid": ALICE}


def test_a_refused_or_pending_spec_takes_its_id_but_holds_it_for_nobody(layout):
    (layout.rejected / "r.yaml").write_text(SPEC)
    (layout.rejected / "r2.1700000000.a1b2c3.yml").write_text(SPEC)  # kept apart, as before 0.2.1
    (layout.rejected / "r3+1700000000.a1b2c3.yaml").write_text(SPEC)  # kept apart
    _spec(layout, "p", ALICE)
    for job_id in ("r", "r2", "r3", "p"):
        assert id_taken(layout, job_id) and held_for(layout, job_id) is None
    assert not id_taken(layout, "r2.v2")  # ids hold dots: not r2's


def test_each_way_a_worker_first_accepts_a_job_reserves_its_id(layout):
    _spec(layout, "h", ALICE)
    hold(layout, "h", "a", ME)
    _spec(layout, "c", BOB)
    assert cancel_one(layout, "c", "a", ME)[0]
    submit_held(layout, "s", "a", Actor(ALICE, "alice", False), SPEC.encode())
    text = "command: echo {i}\ngpus: 0\narray: 0-1\n"
    expand_dropped_sweep(layout, _spec(layout, "arr", BOB, text), "arr", {"command": "echo", "array": "0-1"})
    assert {i: held_for(layout, i) for i in ("h", "c", "s", "arr", "arr_0", "arr_1")} == {
        "h": ALICE,
        "c": BOB,
        "s": ALICE,
        "arr": BOB,
        "arr_0": BOB,
        "arr_1": BOB,
    }


def test_an_id_stays_taken_while_its_spec_leaves_jobs(layout, monkeypatch):
    """The id is reserved before the spec leaves jobs/ (hold, cancel, an array's expansion):
    `submit --after ID` in that moment found "no such job" (a CI failure: an array's id, looked
    up while its worker moved the array's spec aside)."""
    import gpuq.spool.holds as holds

    seen: dict[str, bool] = {}

    def watching(move):
        def moved(source, dest, *rest, **kw):
            done = move(source, dest, *rest, **kw)
            if Path(source).parent == layout.jobs:
                seen[Path(source).stem] = id_taken(layout, Path(source).stem)
            return done

        return moved

    monkeypatch.setattr(holds, "move_new", watching(holds.move_new))
    monkeypatch.setattr(os, "rename", watching(os.rename))
    _spec(layout, "h", ALICE)
    hold(layout, "h", "a", ME)
    _spec(layout, "c", BOB)
    assert cancel_one(layout, "c", "a", ME)[0]
    text = "command: echo {i}\ngpus: 0\narray: 0-1\n"
    expand_dropped_sweep(layout, _spec(layout, "arr", BOB, text), "arr", {"command": "echo", "array": "0-1"})
    assert seen == {"h": True, "c": True, "arr": True}


def test_a_held_submission_under_a_reserved_id_is_refused(layout):
    reserve(layout, "s", BOB)
    with pytest.raises(HoldError, match="used by another job"):
        submit_held(layout, "s", "a", Actor(ALICE, "alice", False), SPEC.encode())
    assert not (layout.held / "s.yaml").exists() and held_for(layout, "s") == BOB


def test_a_file_under_anothers_id_is_never_cancelled_held_or_expanded(layout):
    """However a file of bob's under the id of alice's job reaches a worker's move (here: the
    move itself, as a race past the looks before it would), it goes back, and nothing is
    recorded under her id."""
    reserve(layout, "x", ALICE)
    path = _spec(layout, "x", BOB)
    done, why = cancel_pending(layout, path, "x", "a", "cancelled", ME)
    assert not done and "belongs to" in why and path.exists() and not (layout.finished / "x.json").exists()
    with pytest.raises(HoldError, match="belongs to"):
        hold(layout, "x", "a", ME)
    assert path.exists() and not (layout.held / "x.json").exists()
    path.write_text("command: echo\narray: 0-1\n")
    with pytest.raises(GroupError, match="belongs to 4242's job"):
        expand_dropped_sweep(layout, path, "x", {"command": "echo", "array": "0-1"})
    assert path.exists() and not (layout.groups / "x.json").exists() and held_for(layout, "x_0") is None


def test_a_worker_refuses_a_file_under_the_id_of_anothers_job_and_reserves_what_it_starts(tmp_path):
    """In a worker's pass: root's spec under an id reserved for alice's job is refused as hers;
    a spec it starts has its id reserved for its owner; and one whose id became another's
    between the pass's look and its claim is refused at the claim, never started."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    layout = box.layout
    assert (layout.ids / COMPLETE).exists()  # a new queue: complete from the worker's start
    reserve(layout, "hers", ALICE)
    box.drop("hers.yaml", SPEC)
    box.drop("mine.yaml", SPEC)
    box.run_pass()
    assert box.launched() == ["mine"] and held_for(layout, "mine") == os.geteuid()
    assert "job id 'hers' belongs to 4242's job" in (layout.rejected / f"{_refused(layout, 'hers')}").read_text()
    box.drop("late.yaml", SPEC)
    box.run_steps(["take_in_specs"])
    reserve(layout, "late", ALICE)
    box.run_steps(["start_jobs"])
    assert "late" not in box.launched() and not (layout.running / "late.json").exists()
    assert "job id 'late' belongs to 4242's job" in (layout.rejected / _refused(layout, "late")).read_text()
    # A damaged reservation (garbage, or an older id whose owner the migration could not
    # name) is nobody's to use: a spec dropped under it is refused, never run as a new job.
    (layout.ids / "dz").write_text("garbage")
    box.drop("dz.yaml", SPEC)
    box.run_pass(after_s=2)
    assert "dz" not in box.launched() and not (layout.running / "dz.json").exists()
    assert "job id 'dz' belongs to an unknown member's job" in (layout.rejected / _refused(layout, "dz")).read_text()


def _refused(layout: Layout, job_id: str) -> str:
    return next(p.name for p in layout.rejected.glob(f"{job_id}[+.]*error"))


def _old_queue(layout: Layout) -> None:
    """A queue as workers before state/ids/ left it (its records, claims, held specs, places and
    groups written directly), with a damaged record and a refused and a pending spec."""

    def record(directory: Path, job_id: str, state: State, uid: int) -> None:
        write_json(layout.record(directory, job_id), Record(id=job_id, state=state, spec={}, uid=uid).to_json())

    record(layout.running, "run", State.RUNNING, ALICE)
    record(layout.finished, "done", State.DONE, BOB)
    record(layout.held, "held", State.HELD, ALICE)
    (layout.held / "held.yaml").write_text(SPEC)
    (layout.held / "bare.yaml").write_text(SPEC)  # a held spec whose record went (its owner: the file's)
    os.chown(layout.held / "bare.yaml", BOB, -1)
    claim = layout.claims / "cl@box@12345678@77@a1b2c3d4@a1.yaml"
    claim.write_text(SPEC)
    os.chown(claim, ALICE, -1)
    write_json(layout.record(layout.places, "back"), {"uid": BOB, "queued_at": 1.0})
    record(layout.requeued, "again", State.RUNNING, ALICE)
    write_json(layout.record(layout.groups, "grp"), {"id": "grp", "members": [], "uid": BOB})
    (layout.groups / "expanding.yaml").write_text(SPEC)
    os.chown(layout.groups / "expanding.yaml", ALICE, -1)
    (layout.finished / "torn.json").write_text('{"id": "to')
    (layout.rejected / "refused.yaml").write_text(SPEC)
    (layout.jobs / "waiting.yaml").write_text(SPEC)


OLD = {
    "run": ALICE,
    "done": BOB,
    "held": ALICE,
    "bare": BOB,
    "cl": ALICE,
    "back": BOB,
    "again": ALICE,
    "grp": BOB,
    "expanding": ALICE,
    "torn": None,  # a damaged record: the older scan names nobody
}
MIGRATED = {**OLD, "torn": NOBODY}  # ... and its reservation makes the id nobody's to use


def test_a_queue_made_before_ids_is_read_the_old_way_until_a_worker_fills_them_once(tmp_path):
    layout = Layout(tmp_path / "root")
    layout.ensure()
    _old_queue(layout)
    assert {i: held_for(layout, i) for i in OLD} == OLD  # the older places, until it is filled
    assert all(id_taken(layout, i) for i in (*OLD, "refused", "waiting")) and not id_taken(layout, "free")
    assert migrate(layout) == len(OLD)
    assert sorted(os.listdir(layout.ids)) == sorted([COMPLETE, *OLD])  # not the refused nor the pending
    assert json.loads((layout.ids / "torn").read_text()) == {"uid": None}
    for kept in (layout.running / "run.json", layout.places / "back.json", layout.groups / "expanding.yaml"):
        kept.unlink()  # the reservation alone says whose the id is now
    write_json(layout.record(layout.places, "late"), {"uid": BOB, "queued_at": 1.0})  # never read again
    assert {i: held_for(layout, i) for i in OLD} == MIGRATED
    assert all(id_taken(layout, i) for i in (*OLD, "refused", "waiting"))
    assert held_for(layout, "late") is None and not id_taken(layout, "late")
    assert migrate(layout) == 0


def test_a_worker_fills_the_ids_of_an_older_queue_at_its_start(tmp_path):
    layout = Layout(tmp_path / "root")
    layout.ensure()
    _old_queue(layout)
    PassWorker(layout.root)
    assert (layout.ids / COMPLETE).exists() and {i: held_for(layout, i) for i in OLD} == MIGRATED


def test_ids_is_the_queue_accounts_and_made_where_it_is_missing(tmp_path):
    """state/ids/ is a spool directory (init gives it the mode of the others: the team reads it,
    only the queue's account writes it), and a reservation on a queue whose worker has not made
    it yet makes it."""
    layout = Layout(tmp_path / "root")
    assert layout.ids in layout.directories() and layout.ids not in layout.member_writable()
    layout.ensure()
    os.rmdir(layout.ids)
    assert reserve(layout, "x", ALICE) == ALICE and held_for(layout, "x") is None  # not complete: the older way
    assert migrate(layout) == 0 and held_for(layout, "x") == ALICE


def test_ids_made_by_a_worker_started_with_a_loose_umask_is_not_the_teams_to_write(tmp_path):
    """A queue from before state/ids/, its worker started with umask 002 (an admin's shell):
    ids/ was made group-writable (2775), and a member of the team could rename one reservation
    over another (his own finished job's onto her held job's id) or remove `.complete`. Every
    directory under state/ a worker makes is made with state/'s mode, whatever the umask."""
    layout = Layout(tmp_path / "root")
    layout.ensure()
    os.chmod(layout.state, 0o2750)
    layout.ids.rmdir()
    layout.places.rmdir()
    old = os.umask(0o002)
    try:
        migrate(layout)
        layout.ensure()
        keep_place(layout, "j", BOB, 1000.0)
    finally:
        os.umask(old)
    for made in (layout.ids, layout.places):
        assert stat.S_IMODE(os.stat(made).st_mode) == 0o2750, made


def test_a_file_another_member_keeps_making_under_her_id_never_keeps_her_job_held_or_ended(layout):
    """bob re-created jobs/hx.yaml in a loop while alice released her held job hx (and retried
    her ended job rx): each request found his file there and gave up ("move that file away",
    which she cannot: his, in a sticky directory), for good, since a pass applies its requests
    before its intake refuses his file. A file not hers under her id is set aside now."""
    alice = Actor(ALICE, "alice", False)
    _spec(layout, "hx", ALICE)
    hold(layout, "hx", "a", alice)
    _spec(layout, "hx", BOB, "command: his\n")
    assert "released" in release(layout, "hx", "a", alice)
    assert os.lstat(layout.jobs / "hx.yaml").st_uid == ALICE and (layout.jobs / "hx.yaml").read_text() == SPEC
    (aside,) = [p for p in layout.rejected.iterdir() if p.suffix == ".yaml"]
    assert aside.read_text() == "command: his\n" and "belongs to" in aside.with_suffix(".error").read_text()

    ended = Record(id="rx", state=State.DONE, spec={"command": "echo"}, uid=ALICE, spec_text=SPEC)
    write_json(layout.record(layout.finished, "rx"), ended.to_json())
    reserve(layout, "rx", ALICE)
    _spec(layout, "rx", BOB, "command: his\n")
    assert "back in the queue" in retry(layout, "rx", "a", alice)
    assert os.lstat(layout.jobs / "rx.yaml").st_uid == ALICE
    # A file of her own there is hers to move: that still refuses.
    hold(layout, "hx", "a", alice)
    _spec(layout, "hx", ALICE, "command: her new one\n")
    with pytest.raises(HoldError, match="exists"):
        release(layout, "hx", "a", alice)
