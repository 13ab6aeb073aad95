"""Bookings: the extra's hooks (verbs, request kinds, the placement rule, the status section),
a worker driven pass by pass honouring a booking as the plan is handed it, the store's
writes; booking, clashes and damaged files through the CLI's main and a box's passes in this
process (tests/harness.py); through real workers and members' CLIs: caps, garbage, other users."""

from __future__ import annotations

import errno
import json
import os
import pwd
import resource
import time
from pathlib import Path

import pytest
from harness import PassWorker, Team, gpuq
from harness import status as status_of
from team import ALICE, BOB, needs_root

from conftest import wait_until
from gpuq import hooks
from gpuq.cli.doctor import check_extras
from gpuq.extras.bookings import store, view
from gpuq.host import faults
from gpuq.host.owners import Actor
from gpuq.model.config import Config
from gpuq.model.jobs import SetAside
from gpuq.spool.applying import apply_request
from gpuq.spool.inbox import Request
from gpuq.spool.layout import Layout
from gpuq.views.render import status_text, top_screen
from gpuq.views.status import status


def _me() -> Actor:
    return Actor(os.getuid(), pwd.getpwuid(os.getuid()).pw_name, True)


# --- in this process ----------------------------------------------------------------------------


def test_the_extra_gives_its_verbs_request_kinds_rule_and_status_section():
    got = hooks.registry()
    assert "bookings" in got.loaded and {"book", "unbook"} <= {v.name for v in got.verbs}
    assert got.request_kinds == {
        "book": "extras.bookings.requests:apply_book",
        "unbook": "extras.bookings.requests:apply_unbook",
    }
    assert [r.name for r in got.placement_rules] == ["bookings"] and "BOOKINGS" in [v.title for v in got.views]


def test_a_booking_is_applied_as_a_request_and_handed_to_the_plan_as_a_value(tmp_path: Path):
    layout = Layout(tmp_path)
    layout.ensure()
    now = time.time()
    args = {"host": "box", "gpus": [0, 1], "start": now - 60, "end": now + 3600, "owner": None, "note": "demo"}
    reply = apply_request(layout, Config(), "box", Request("r-1", "book", os.getuid(), args=args))
    assert reply.ok and reply.outcomes[0][1].startswith("bk-1: booked (") and "· demo" in reply.outcomes[0][1]
    clash = apply_request(layout, Config(), "box", Request("r-2", "book", os.getuid(), args={**args, "gpus": [1]}))
    assert not clash.ok and "overlaps booking bk-1" in clash.outcomes[0][1]
    me = _me().name
    assert hooks.set_aside(layout, now) == [SetAside("box", (0, 1), now - 60, now + 3600, me)]
    assert [b["id"] for b in view.read(layout, now, frozenset())] == ["bk-1"]
    assert hooks.set_aside(layout, now + 7200) == []
    gone = apply_request(layout, Config(), "box", Request("r-3", "unbook", os.getuid(), args={"id": "bk-1"}))
    assert gone.ok and gone.outcomes[0][1].startswith("bk-1: removed") and hooks.set_aside(layout, now) == []


def test_a_worker_starts_nothing_of_others_on_a_booked_gpu_and_status_says_why(tmp_path: Path):
    """The guarantee, through a worker's pass: the plan is handed the bookings as values."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    now = box.clock.wall()
    store.book(box.layout, "a", (0,), now - 1, now + 3600, "nobody", "board demo", now, _me())
    box.drop("mine.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 1GiB\n")
    for _ in range(3):
        box.run_pass(after_s=1)
    assert box.launched() == []
    seen = status(box.layout, box.worker.config, now=box.clock.wall())
    assert seen["pending"][0]["reason"].startswith("GPU a:0 booked for nobody until ")
    assert [(b["owner"], b["active"]) for b in seen["bookings"]] == [("nobody", True)]
    screen = status_text(seen)
    assert "BOOKINGS (gpuq unbook ID removes one)" in screen and "NOW, until" in screen
    top = top_screen("top", screen, 200, 200)  # after HELD, before the ended jobs, as before
    assert [line for line in top if line.startswith(("BOOKINGS", "FINISHED"))][0].startswith("BOOKINGS")
    (store.directory(box.layout) / "bk-1.json").unlink()
    box.run_pass(after_s=1)
    assert box.launched() == ["mine"]


def test_a_booking_the_disk_refuses_leaves_no_file_behind(tmp_path, monkeypatch):
    """A booking was created empty, then written in place: a reader could see half of one (and
    skip it in the overlap check), and a full disk left an empty bk-N.json that nothing removed.
    Now it is written whole, then linked into place."""
    layout = Layout(tmp_path)
    layout.ensure()
    actor = _me()
    monkeypatch.setattr(faults, "_io_faults", {"write:bookings": "ENOSPC"})
    with pytest.raises(OSError) as full:
        store.book(layout, "box", (0,), 100.0, 200.0, actor.name, "", 50.0, actor)
    assert full.value.errno == errno.ENOSPC
    assert sorted(p.name for p in store.directory(layout).iterdir()) == []
    monkeypatch.setattr(faults, "_io_faults", {})
    made = store.book(layout, "box", (0,), 100.0, 200.0, actor.name, "", 50.0, actor)
    assert [b.id for b in store.load(layout)] == [made.id]


def test_bookings_over_for_a_week_go_as_the_next_is_made(tmp_path: Path):
    layout = Layout(tmp_path)
    layout.ensure()
    actor = _me()
    store.book(layout, "box", (0,), 100.0, 200.0, actor.name, "", 50.0, actor)
    store.book(layout, "box", (1,), 300.0, 400.0, actor.name, "", 50.0, actor)
    later = 200.0 + store.KEEP_S + 1
    store.book(layout, "box", (2,), later, later + 100, actor.name, "", later, actor)
    assert [b.gpus for b in store.load(layout)] == [(1,), (2,)]


def test_doctor_says_nothing_of_the_bookings_directory_while_the_extra_is_here(tmp_path: Path):
    layout = Layout(tmp_path)
    layout.ensure()
    (store.directory(layout) / "bk-1.json").write_text("{}")
    assert not [f for f in check_extras(layout, Config()) if "state/bookings" in f.message]


# --- through real workers and the CLI -------------------------------------------------------------


def _one_clear_line(proc, *needles: str) -> str:
    assert proc.returncode not in (0, None), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    return proc.stderr


def _bookings(queue) -> list[str]:
    d = queue.root / "state" / "bookings"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def _two_gib_of_memory() -> None:
    # Without the bound, the range 0-999999999 grew to 24 GB and met the OOM killer: here it
    # meets this limit instead (a MemoryError traceback), and the test fails without taking
    # down the machine.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_booking_keeps_others_jobs_off_its_gpus_until_it_is_removed(tmp_path):
    team = Team(tmp_path / "root")
    box = team.add("a", "2x80GiB")
    team.step()  # its heartbeat: the box and its GPUs are known
    root = team.root
    booked = gpuq(root, "book", "a:0,1", "--from", "now", "--to", "1h", "--for", "nobody", "--note", "board demo")
    assert booked.stdout.startswith("bk-1: booked (nobody, a:0,1, ") and "board demo" in booked.stdout
    clash = gpuq(root, "book", "a:1", "--from", "now", "--to", "30m", check=False)
    assert (
        clash.returncode == 1
        and "overlaps booking bk-1 (nobody, a:0,1," in clash.stderr
        and "gpuq unbook bk-1" in clash.stderr
    )
    later = gpuq(root, "book", "a:1", "--from", "2099-01-01 10:00", "--to", "2h", "--for", "daemon")
    assert later.stdout.startswith("bk-2: booked (daemon, a:1, ")  # a later slot on the same GPU is fine
    job = gpuq(root, "submit", "--gpus", "1", "--gpu-mem", "10GiB", "--name", "mine", "--", "true")
    job = job.stdout.strip().splitlines()[-1]
    for _ in range(3):
        team.step()
    view = status_of(root)
    assert view["pending"][0]["reason"].startswith("GPU a:0 booked for nobody until ")
    assert [(b["owner"], b["active"]) for b in view["bookings"]] == [("nobody", True), ("daemon", False)]
    assert "BOOKINGS" in gpuq(root, "status").stdout and "NOW, until" in gpuq(root, "status").stdout
    assert team.finished(job) is None and box.launched() == []
    assert gpuq(root, "unbook", "bk-1").stdout.startswith("bk-1: removed")
    team.run_until(lambda: team.finished(job))
    assert box.launched() == [job] and (team.finished(job) or pytest.fail(job)).state.value == "done"
    bad = gpuq(root, "book", "a:7", "--from", "now", "--to", "1h", check=False)
    assert bad.returncode == 2 and "a has no GPU 7" in bad.stderr
    missing = gpuq(root, "unbook", "no-such-job", check=False)  # a refusal names its verb, exits 1
    assert missing.returncode == 1 and missing.stderr.startswith("gpuq unbook: "), missing.stderr


@pytest.mark.slow  # the CLI under a 2 GiB address-space limit: a process of its own
def test_a_billion_gpu_range_is_refused_before_it_is_built(queue):
    queue.start_worker("box", "2x80GiB")
    done = queue.gpuq(
        "book", "box:0-999999999", "--from", "now", "--to", "1h", check=False, preexec_fn=_two_gib_of_memory
    )
    _one_clear_line(done, "no box has that many GPUs")
    backwards = queue.gpuq("book", "box:1-0", "--from", "now", "--to", "1h", check=False)
    _one_clear_line(backwards, "backwards")  # not: every GPU of the box, as an empty list meant
    assert _bookings(queue) == []


def test_a_booking_longer_than_a_century_is_refused_and_nothing_is_written(tmp_path):
    box = PassWorker(tmp_path / "root", "box", "2x80GiB")
    box.run_pass()
    done = gpuq(box.root, "book", "box:0", "--from", "now", "--to", "99999999999999999999d", check=False)
    _one_clear_line(done, "99999999999999999999d", "100 years")
    assert _bookings(box) == []
    assert gpuq(box.root, "status").returncode == 0


@pytest.mark.parametrize("start, end", [("NOW-10", 1e300), (1e300, 1e301), ("NOW-10", "Infinity"), ("NaN", "NOW+3600")])
def test_a_damaged_booking_file_does_not_stop_status(tmp_path, start, end):
    root = Team(tmp_path / "root").root
    now = time.time()
    times = [now - 10 if t == "NOW-10" else now + 3600 if t == "NOW+3600" else t for t in (start, end)]
    text = json.dumps(
        {"id": "bk-9", "host": "box", "gpus": [0], "start": 0, "end": 0, "owner": "ana", "note": "", "by": "ana"}
    )
    text = text.replace('"start": 0', f'"start": {times[0]}').replace('"end": 0', f'"end": {times[1]}')
    d = root / "state" / "bookings"
    d.mkdir(parents=True, exist_ok=True)
    (d / "bk-9.json").write_text(text)
    shown = gpuq(root, "status", check=False)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert gpuq(root, "status", "--json", check=False).returncode == 0
    assert gpuq(root, "top", "--iterations", "1", check=False).returncode == 0


@needs_root
def test_garbage_bookings_never_stop_a_worker_or_status(team):
    """H5: one malformed booking stopped every start and crashed status."""
    (team.root / "state" / "bookings" / "bk-999.json").write_text('{"id": "bk-999", "hello": 1}')
    (team.root / "state" / "bookings" / "bk-998.json").write_text(
        '{"id": "bk-998", "host": "a", "gpus": [0], "start": 0, "end": 1e300, "owner": "x"}'
    )
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "ok.yaml", "command: echo ok\ngpus: 1\ngpu_mem: 1GiB\nworkdir: /\n")
    assert wait_until(lambda: team.finished("ok"), what="a job past the garbage")["state"] == "done"
    status = team.as_user(BOB, "status")
    assert status.returncode == 0 and "Traceback" not in status.stderr
    assert team.workers["a"].poll() is None


@needs_root
def test_unbook_judges_the_file_owner_not_the_environment(team):
    """M4: `LOGNAME=alice gpuq unbook` passed as alice; newcomer: anyone could book for anyone."""
    team.start_worker("a", "2x80GiB")
    booked = team.as_user(ALICE, "book", "a:0", "--from", "now", "--to", "1h")
    assert booked.returncode == 0 and booked.stdout.startswith("bk-1:"), booked.stderr
    spoof = team.as_user(BOB, "unbook", "bk-1", env={"LOGNAME": ALICE, "USER": ALICE})
    assert spoof.returncode == 1 and "only they, root or an admin may remove it" in spoof.stderr
    assert (team.root / "state" / "bookings" / "bk-1.json").exists()
    for_other = team.as_user(BOB, "book", "a:1", "--from", "now", "--to", "1h", "--for", ALICE)
    assert for_other.returncode == 1 and "only root or an admin" in for_other.stderr
    assert team.as_user(ALICE, "unbook", "bk-1").returncode == 0


@needs_root
def test_a_members_bookings_are_capped(team, users):
    """bob booked every GPU for 31 days, twice. Now a member books at most
    max_booked_gpu_hours ahead, all bookings together."""
    team.write_config(max_booked_gpu_hours=10)
    team.start_worker("a", "2x80GiB")
    first = team.as_user(BOB, "book", "a:0,1", "--from", "now", "--to", "4h")
    assert first.returncode == 0, first.stderr
    later = ("--from", "2027-06-30 10:00")
    second = team.as_user(BOB, "book", "a:0", *later, "--to", "2027-06-30 13:00")
    assert second.returncode == 1 and "over config max_booked_gpu_hours 10" in second.stderr, second.stderr
    small = team.as_user(BOB, "book", "a:0,1", *later, "--to", "2027-06-30 11:00")
    assert small.returncode == 0, small.stderr  # 8 + 2 GPU-hours: at the cap, not over it


@needs_root
def test_a_members_booking_note_is_shown_escaped(team):
    """A note is a member's text on everyone's terminal (tests/test_terminal_safety.py)."""
    team.start_worker("box", "1x80GiB")
    booked = team.as_user(BOB, "book", "box:0", "--from", "now", "--to", "1h", "--note", "demo \x1b]0;BOOKED\x07\u202e")
    assert booked.returncode == 0, booked.stderr
    for verb in (("status",), ("top", "--iterations", "1")):
        shown = team.as_user(ALICE, *verb)
        assert shown.returncode == 0 and "\x1b]" not in shown.stdout and "\u202e" not in shown.stdout, shown.stdout
    assert "demo \\x1b]0;BOOKED\\x07\\u202e" in team.as_user(ALICE, "status").stdout
