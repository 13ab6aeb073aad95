"""Reading jobs/: new, replaced, vanished and half-written specs, with full and quick scans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import wait_until
from gpuq.spool import intake as intake_module
from gpuq.spool.dirwatch import RACY_MTIME_S, MtimeWatch
from gpuq.spool.intake import NOT_READ_YET, Intake, load_pending_for_view, user_name
from gpuq.spool.layout import Layout


def _write(layout: Layout, name: str, text: str) -> None:
    tmp = layout.jobs / f".{name}.tmp"
    tmp.write_text(text)
    os.rename(tmp, layout.jobs / name)  # as an editor saves: a new inode under the old name


def _touch_ctime(path) -> int:
    path.write_text("")
    return os.stat(path).st_ctime_ns


def test_quick_scans_see_new_replaced_and_vanished_specs(tmp_path):
    layout = Layout(tmp_path)
    layout.ensure()
    intake = Intake(layout)
    _write(layout, "a.yaml", "command: x\ngpu_mem: 1GiB\n")
    (layout.jobs / "notes.txt").write_text("ignored")
    intake.scan(0.0, full=True)
    assert [j.id for j in intake.pending()] == ["a"]
    _write(layout, "b.yml", "command: y\n")
    _write(layout, "a.yaml", "command: x\ngpu_mem: 2GiB\n")
    intake.scan(1.0, full=False)
    assert {j.id: j.spec.gpu_mem_mib for j in intake.pending()} == {"a": 2048, "b": None}
    os.unlink(layout.jobs / "b.yml")
    intake.scan(2.0, full=False)
    assert [j.id for j in intake.pending()] == ["a"]


def test_a_scan_whose_listing_failed_does_not_stand(tmp_path, monkeypatch):
    """jobs/ changed, and its mtime stood; the listing then failed (EIO, ESTALE on NFS). The
    scan after must list again: its key was kept before the listing, and the new spec stayed
    unseen until the next full scan."""
    layout = Layout(tmp_path)
    layout.ensure()
    mono = [1000.0]
    intake = Intake(layout, watch=MtimeWatch(lambda: mono[0]))
    intake.scan(mono[0], full=True)
    _write(layout, "a.yaml", "command: x\n")

    def failing() -> dict[str, int]:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(intake, "_list", failing)
    for _ in range(2):  # first seen, then stood
        with pytest.raises(OSError):
            intake.scan(mono[0], full=False)
        mono[0] += RACY_MTIME_S + 1
    monkeypatch.undo()
    intake.scan(mono[0], full=False)
    assert [j.id for j in intake.pending()] == ["a"]


def test_a_half_written_spec_is_re_read_until_it_parses(tmp_path):
    layout = Layout(tmp_path)
    layout.ensure()
    intake = Intake(layout)
    path = layout.jobs / "w.yaml"
    path.write_text("command: [unfinished")
    intake.scan(0.0, full=True)
    assert "w" in intake.unsettled() and intake.settled_errors(0.5, 1.0) == []
    assert [i for i, _ in intake.settled_errors(1.5, 1.0)] == ["w"]
    with open(path, "a") as f:  # completed in place: same inode
        f.write(", done]\n")
    intake.scan(2.0, full=False)
    assert [j.id for j in intake.pending()] == ["w"] and not intake.unsettled()


def test_a_forgotten_spec_that_comes_back_is_read_again(tmp_path):
    layout = Layout(tmp_path)
    layout.ensure()
    intake = Intake(layout)
    _write(layout, "c.yaml", "command: x\n")
    intake.scan(0.0, full=True)
    version = intake.version
    intake.forget("c")  # claimed, then put back under the same name and inode
    assert intake.version > version and intake.pending() == []
    intake.scan(1.0, full=False)
    assert [j.id for j in intake.pending()] == ["c"]


def test_a_spec_with_a_second_link_waits_to_settle_before_it_is_refused(tmp_path):
    """`gpuq submit` (and a worker putting a spec back) link the final name into jobs/ and then
    unlink their own: a loaded box's intake read the spec in between, with two links, and
    refused a member's good submission at once. A second link now waits as a half-written
    spec does; one that stays is refused once settled."""
    layout = Layout(tmp_path)
    layout.ensure()
    intake = Intake(layout)
    sender = tmp_path / ".submit-tmp"
    sender.write_text("command: x\n")
    os.link(sender, layout.jobs / "two.yaml")
    stays = tmp_path / "kept-link"
    stays.write_text("command: y\n")
    os.link(stays, layout.jobs / "linked.yaml")
    intake.scan(0.0, full=True)
    assert set(intake.unsettled()) == {"two", "linked"} and intake.settled_errors(0.5, 1.0) == []
    sender.unlink()  # the sender's own name goes: one link, in jobs/
    intake.scan(0.6, full=False)
    assert [j.id for j in intake.pending()] == ["two"]
    assert [(i, "has more than one hard link" in str(e.error)) for i, e in intake.settled_errors(1.5, 1.0)] == [
        ("linked", True)
    ]


def test_of_two_files_for_one_id_the_one_that_landed_first_keeps_it(tmp_path):
    """x.yml and x.yaml are one id: the second file is refused. A scan that finds both new
    met them in set order, so a member's later file under another's id could take it (a
    loaded run: alice's ay.yml refused for bob's ay.yaml). The earlier file now keeps it."""

    layout = Layout(tmp_path)
    layout.ensure()
    ids = [f"id{i}" for i in range(20)]
    for i in ids:
        _write(layout, f"{i}.yml", "command: first\n")
    first = max(os.stat(layout.jobs / f"{i}.yml").st_ctime_ns for i in ids)
    # the second files' change times a clock tick later (a coarse filesystem clock ticks late)
    wait_until(lambda: _touch_ctime(layout.jobs / ".tick") > first, timeout=5, what="the clock to tick")
    for i in ids:
        _write(layout, f"{i}.yaml", "command: second\n")
    intake = Intake(layout)
    intake.scan(0.0, full=True)
    assert {e.name for e in intake.entries.values()} == {f"{i}.yml" for i in ids}
    assert sorted(intake.take_duplicates()) == sorted((f"{i}.yaml", i) for i in ids)


def test_a_check_that_fails_unforeseen_makes_that_spec_invalid_not_the_scan(tmp_path, monkeypatch):
    """A bug in one field's check (as '²' in gpu_compute once was: isdigit() took it, int()
    did not) must not stop the worker's intake or `gpuq status` for the whole team."""
    from gpuq.spool import intake as intake_mod

    layout = Layout(tmp_path)
    layout.ensure()
    real = intake_mod.parse_entry

    def buggy(layout, job_id, *args):
        if job_id == "odd":
            raise ValueError("invalid literal for int()")
        return real(layout, job_id, *args)

    monkeypatch.setattr(intake_mod, "parse_entry", buggy)
    _write(layout, "odd.yaml", "command: x\n")
    _write(layout, "fine.yaml", "command: x\n")
    intake = Intake(layout)
    intake.scan(0.0, full=True)
    assert [j.id for j in intake.pending()] == ["fine"]
    assert "could not be checked (ValueError: invalid literal" in str(intake.unsettled()["odd"])


@pytest.mark.skipif(os.geteuid() != 0, reason="files of two owners take root to make (CI runs as root)")
def test_a_spec_swapped_after_its_open_is_owned_by_whoever_wrote_the_bytes_read(tmp_path, monkeypatch):
    """A spec's owner is taken from the file opened, never from the name: a member who swaps
    another member's spec in under the name between the open and the look at its owner must
    not have his own bytes run as her (host/safefile.py judges the open descriptor)."""
    his_uid, her_uid = 4343, 4242  # uids without accounts are fine for files
    layout = Layout(tmp_path)
    layout.ensure()
    spec = layout.jobs / "swap.yaml"
    spec.write_text("command: echo his\n")
    os.chown(spec, his_uid, his_uid)
    # He keeps a second name for his file, so that it is still a plain file with one link once
    # the swap has taken jobs/swap.yaml from it (unlinked, it would be refused for that alone).
    os.link(spec, tmp_path / "his-own-name")
    hers = tmp_path / "hers.yaml"
    hers.write_text("command: echo hers\n")
    os.chown(hers, her_uid, her_uid)
    real_open = os.open
    swapped: list[Path] = []

    def open_then_swap(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if os.fspath(path) == str(spec) and not swapped:
            os.rename(hers, spec)  # his file is open; the name is hers from now on
            swapped.append(spec)
        return fd

    monkeypatch.setattr(os, "open", open_then_swap)
    intake = Intake(layout)
    intake.scan(0.0, full=True)
    assert swapped, "the spec was never opened by name: nothing tested"
    (job,) = intake.pending()
    assert (job.spec.command, job.user) == ("echo his", user_name(his_uid))


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other owners (CI runs as root)")
def test_a_scan_reads_for_its_budget_each_owner_in_turn_and_the_next_scan_reads_the_rest(tmp_path, monkeypatch):
    """A member's thousand specs that never parse, touched each second, held one pass past
    the lease (every running job on the box fenced). A scan now reads until its budget is
    spent (one file at least), each owner's files in turn, oldest first; the rest are
    `unread`, read by the next scan though jobs/ has not changed, and shown by `status`."""
    layout = Layout(tmp_path)
    layout.ensure()
    intake = Intake(layout)
    for i in range(4):  # mallory's (uid 4242), landed first
        _write(layout, f"m{i}.yaml", "command: [unclosed\n")
        os.chown(layout.jobs / f"m{i}.yaml", 4242, -1)
    _write(layout, "al.yaml", "command: echo hi\n")
    os.chown(layout.jobs / "al.yaml", 4343, -1)
    intake.scan(0.0, full=True, budget_s=0.0)  # one file: mallory's oldest
    assert intake.failing == {"m0"} and intake.unread == {"m1.yaml", "m2.yaml", "m3.yaml", "al.yaml"}
    intake.scan(1.0, full=False, budget_s=0.0)  # jobs/ unchanged: the unread come all the same
    assert [j.id for j in intake.pending()] == ["al"], "alice's is read before mallory's second"
    intake.scan(2.0, full=False)  # with a budget: the rest
    assert intake.failing == {"m0", "m1", "m2", "m3"} and not intake.unread
    _write(layout, "al2.yaml", "command: echo again\n")
    os.chown(layout.jobs / "al2.yaml", 4343, -1)
    pending, problems = load_pending_for_view(layout, [])  # `gpuq status`, with no worker's cache
    assert {j.id for j in pending} == {"al", "al2"} and set(problems) == {"m0", "m1", "m2", "m3"}
    assert not any(NOT_READ_YET in why for why in problems.values())
    monkeypatch.setattr(intake_module, "READ_BUDGET_S", 0.0)
    pending, problems = load_pending_for_view(layout, [])  # one file read: the rest said unread
    assert len(pending) + len(problems) == 6 and sum(NOT_READ_YET in why for why in problems.values()) == 5


@pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other owners (CI runs as root)")
def test_a_later_file_under_an_id_never_takes_it_while_the_first_waits_unread(tmp_path, monkeypatch):
    """Each owner's first file before anyone's second: ben's later x.yml was read (and took the
    id) while ana's earlier x.yaml waited unread behind her other files (a review). An id's
    files are read side by side, at the place of its first. Two files a scan: each look at the
    clock is a second later, and the budget 1.5 s."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(intake_module.time, "monotonic", lambda: float(next(ticks)))
    layout = Layout(tmp_path)
    layout.ensure()
    intake = Intake(layout)
    for name in ("a1.yaml", "a2.yaml", "a3.yaml", "x.yaml"):
        _write(layout, name, "command: echo ana\n")
        os.chown(layout.jobs / name, 4242, -1)
    _write(layout, "x.yml", "command: echo ben\n")
    os.chown(layout.jobs / "x.yml", 4343, -1)
    for scan in range(8):
        intake.scan(float(scan), full=scan == 0, budget_s=1.5)
        if "x" in intake.entries:
            assert intake.entries["x"].name == "x.yaml", f"scan {scan}: ben's x.yml took the id"
    assert not intake.unread and intake.entries["x"].uid == 4242
    assert intake.take_duplicates() == [("x.yml", "x")]
