"""Attacks by a team member (bob) on a root worker's local directory (security finding K1):
the per-host directory of its lock, lease, job lock files (whose `started` marker names the
pid to signal and may hold a result to record), stop requests and wake FIFO.

By default it was /dev/shm/gpuq-0/<host>-<hash>, and only its last part was checked: /dev/shm
is world-writable and empty after each reboot, so bob could make /dev/shm/gpuq-0 before the
worker's first start, own the parent, and later swap the worker's directory for his own.
Root then wrote through his links, signalled the pid his forged lock file named, and
recorded the result it held. Now a root worker's default is in /run, every part of the path
is checked, and what is read back from it counts only as a plain file of the worker's."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from team import ALICE, BOB, QUEUE, needs_root

from conftest import PY, REPO, remove_local_dir, wait_until

pytestmark = needs_root
PRECIOUS = "precious root data\n"


def _start_once(team) -> subprocess.CompletedProcess:
    """One pass of a root worker for host `a`, as cron would start it."""
    return subprocess.run(
        [PY, str(REPO / "worker.py"), "--root", str(team.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=team.env(),
    )


def _bobs_dir(team, name: str, mode: int) -> Path:
    d = team.base / name
    d.mkdir()
    bob = team.users[BOB]
    os.chown(d, bob.pw_uid, bob.pw_gid)
    os.chmod(d, mode)
    return d


# --- the boundary: where local_dir is, and every part of its path ------------------------------


def test_a_root_worker_refuses_a_local_dir_under_a_members_directory_and_writes_nothing_there(team):
    bobs = _bobs_dir(team, "bobs", 0o755)
    team.write_config(local_dir=str(bobs / "{host}"))
    started = _start_once(team)
    assert started.returncode == 2, started.stderr
    bob_uid = team.users[BOB].pw_uid
    assert f"{bobs} is owned by uid {bob_uid} ({BOB})" in started.stderr
    assert f"Fix: remove {bobs}" in started.stderr and "set local_dir in config.yaml" in started.stderr
    assert os.listdir(bobs) == []  # root created nothing where bob could swap it


def test_a_root_worker_refuses_a_local_dir_that_is_a_members_link(team):
    """bob's link in a sticky directory (like /tmp), where he may create names: the link is
    his to repoint at any time, wherever it leads now."""
    sticky = team.base / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    real = team.base / "real"
    real.mkdir(mode=0o700)
    done = team.run_as(BOB, ["ln", "-s", str(real), str(sticky / "ld-a")])
    assert done.returncode == 0, done.stderr
    team.write_config(local_dir=str(sticky / "ld-{host}"))
    started = _start_once(team)
    assert started.returncode == 2, started.stderr
    assert f"{sticky / 'ld-a'} is owned by uid {team.users[BOB].pw_uid} ({BOB})" in started.stderr
    assert os.listdir(real) == []


def test_a_local_dir_that_is_a_link_is_refused_even_when_roots(team):
    real = team.base / "real"
    real.mkdir(mode=0o700)
    (team.base / "ld-a").symlink_to(real)
    team.write_config(local_dir=str(team.base / "ld-{host}"))
    started = _start_once(team)
    assert started.returncode == 2, started.stderr
    assert f"local_dir {team.base / 'ld-a'} is a symbolic link" in started.stderr
    assert "Fix: remove" in started.stderr and os.listdir(real) == []


def test_a_root_workers_default_local_dir_is_in_run_and_only_root_can_change_any_part_of_it(team):
    from gpuq.spool.layout import Layout

    team.write_config(local_dir=None)
    local = Layout(team.root.resolve()).default_local_dir("a")
    assert str(local).startswith("/run/gpuq/"), local  # never the world-writable /dev/shm
    from gpuq.host.hostinfo import chain_problems

    queue_uid = pwd.getpwnam(QUEUE).pw_uid
    # The queue account's own default would be /dev/shm/gpuq-<uid>, open to anyone: bob makes
    # it first (as after a reboot). The worker, started by root, never looks there.
    shm = Path("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp") / f"gpuq-{queue_uid}"
    shutil.rmtree(shm, ignore_errors=True)  # a leftover of an earlier run's account with this uid
    made = team.run_as(BOB, ["mkdir", "-m", "777", str(shm)])
    assert made.returncode == 0, made.stderr
    try:
        team.start_worker("a", "1x80GiB")
        team.drop_as(ALICE, "runs.yaml", "command: echo ran\ngpus: 0\nworkdir: /\n")
        assert wait_until(lambda: team.finished("runs"), what="alice's job")["state"] == "done"
        # Everything the worker trusts is in the directory root made for it: lock, lease, job locks.
        assert (local / "worker.lock").exists() and (local / "lease").exists() and (local / "jobs").is_dir()
        assert os.listdir(shm) == []
        # The queue's account's (root made it so before it started the worker as that account).
        st = os.lstat(local)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == queue_uid and stat.S_IMODE(st.st_mode) == 0o700, local
        # /run/gpuq may be passed through, never listed or changed by others; root's.
        st = os.lstat(local.parent)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o066, local.parent
        assert chain_problems(local, queue_uid) == []
        for place in (local.parent, local):
            made = team.run_as(BOB, ["mkdir", str(place / "bobs")])
            assert made.returncode != 0 and not (place / "bobs").exists()
        team.stop_worker("a")
    finally:
        remove_local_dir(local)
        shutil.rmtree(shm, ignore_errors=True)


def test_a_users_own_worker_refuses_a_default_parent_another_member_made_first(team):
    """The same attack on a worker alice runs for herself: bob makes /dev/shm/gpuq-<alice's
    uid> (open to her, so that she would use it) before her worker's first start."""
    python, code = team.python, team.code
    alice = team.users[ALICE]
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
        "from gpuq.single_instance import default_local_dir\n"
        "from gpuq.host.hostinfo import ensure_private_dir\n"
        "d = default_local_dir(sys.argv[2], 'a'); print(d)\n"
        "try:\n    ensure_private_dir(Path(d))\nexcept PermissionError as e:\n    print('REFUSED', e)\n"
    )
    shm = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    parent = shm / f"gpuq-{alice.pw_uid}"
    shutil.rmtree(parent, ignore_errors=True)  # a leftover of an earlier run's user with this uid
    try:
        made = team.run_as(BOB, ["mkdir", "-m", "777", str(parent)])
        assert made.returncode == 0, made.stderr
        ran = team.run_as(ALICE, [python, "-c", script, str(code), str(team.root)])
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith(f"{parent}/") and "REFUSED" in ran.stdout
        assert f"{parent} is owned by uid {team.users[BOB].pw_uid} ({BOB})" in ran.stdout
        assert os.listdir(parent) == []
    finally:
        shutil.rmtree(parent, ignore_errors=True)


# --- in depth: what the worker reads back from local_dir, and how it writes there --------------


@pytest.fixture
def local(tmp_path, users):
    """A Runtime over a fresh root, the record of a running attempt, a live stand-in for its
    supervisor, and a file an attack would overwrite."""
    from gpuq.host.hostinfo import ensure_private_dir
    from gpuq.model.record import Record
    from gpuq.model.states import State
    from gpuq.run.joblocal import Runtime
    from gpuq.spool.layout import Layout
    from gpuq.spool.store import write_record

    layout = Layout(tmp_path / "root")
    layout.ensure()
    local_dir = ensure_private_dir(tmp_path / "local")
    ensure_private_dir(local_dir / "jobs")
    claim = "j@a@boot@1@abcd@a1.yaml"
    (layout.claims / claim).write_text("command: echo hi\n")
    record = Record(
        id="j",
        state=State.RUNNING,
        spec={},
        spec_text="command: echo hi\n",
        user="x",
        uid=4242,
        host="a",
        boot_id="boot",
        claim=claim,
        queued_at=1000.0,
    )
    write_record(layout, record)
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        yield Runtime(layout, "a", "boot", local_dir, 1.0, 10.0, {}), record, sleeper, victim
    finally:
        sleeper.kill()
        sleeper.wait()


def _forge_lock(rt, record, owner_uid: int, **marker) -> Path:
    lock = rt.lock_path(record.id)
    lock.write_text(json.dumps({"claim": record.claim, **marker}))
    os.chown(lock, owner_uid, -1)
    return lock


def test_a_lock_file_the_worker_did_not_write_names_no_pid_to_signal(local, users):
    from gpuq.host.hostinfo import process_start_ticks
    from gpuq.run.joblocal import job_roots, request_stop, supervisor_pid

    rt, record, sleeper, _ = local
    _forge_lock(rt, record, users[BOB].pw_uid, supervisor_pid=sleeper.pid, ticks=process_start_ticks(sleeper.pid))
    assert supervisor_pid(rt, record) is None and job_roots(rt, record) == []
    assert request_stop(rt, record, "cancelled") is False
    assert sleeper.poll() is None and not rt.stop_path(record.id).exists()


def test_a_marker_naming_every_process_or_a_group_is_never_a_supervisor(local):
    """kill(-1) from root signals every process; kill(0) the worker's own group."""
    from gpuq.run.joblocal import supervisor_pid

    rt, record, _, _ = local
    for pid, ticks in ((-1, None), (0, None), (1, None), (True, None), ("123", None)):
        _forge_lock(rt, record, os.geteuid(), supervisor_pid=pid, **({} if ticks is None else {"ticks": ticks}))
        assert supervisor_pid(rt, record) is None, pid


def test_a_result_in_a_lock_file_the_worker_did_not_write_is_never_recorded(local, users):
    from gpuq.model.config import Config
    from gpuq.spool.intake import Intake
    from gpuq.worker.box import Box
    from gpuq.worker.recovery import Recovery

    rt, record, _, _ = local
    _forge_lock(
        rt, record, users[BOB].pw_uid, result={"state": "done", "exit_code": 0, "reason": "forged by bob", "uid": 0}
    )
    Recovery(Box(Config(), rt, Intake(rt.layout))).settle_gone(record)
    finished = rt.layout.record(rt.layout.finished, record.id)
    assert not finished.exists()  # never started, as far as the worker knows: requeued
    assert (rt.layout.jobs / "j.yaml").read_text() == "command: echo hi\n"


def test_a_lease_of_someone_else_is_no_heartbeat(local, users):
    from gpuq.run.joblocal import lease_age, write_lease

    rt, _, _, _ = local
    write_lease(rt, 0.0)
    assert lease_age(rt) is not None
    os.chown(rt.lease_path, users[BOB].pw_uid, -1)
    assert lease_age(rt) is None


def test_the_lease_stop_and_container_files_are_never_written_through_a_link(local):
    from gpuq.host.hostinfo import process_start_ticks
    from gpuq.run.joblocal import request_stop, write_lease, write_outside_pid

    rt, record, sleeper, victim = local
    planted = [
        rt.local_dir / f".lease.{os.getpid()}",
        rt.local_dir / f".lease.{os.getpid()}.tmp",
        rt.lease_path,
        rt.stop_path(record.id),
        rt.outside_path(record.id),
        rt.local_dir / "jobs" / f".{record.id}.stop.{os.getpid()}.tmp",
    ]
    for link in planted:
        link.symlink_to(victim)
    write_lease(rt, 12.5)
    write_outside_pid(rt, record, sleeper.pid)
    _forge_lock(rt, record, os.geteuid(), supervisor_pid=sleeper.pid, ticks=process_start_ticks(sleeper.pid))
    assert request_stop(rt, record, "cancelled") is True  # the worker's own marker: obeyed
    wait_until(lambda: sleeper.poll() is not None, what="the stand-in supervisor to get SIGTERM")
    assert victim.read_text() == PRECIOUS
    assert not rt.lease_path.is_symlink() and float(rt.lease_path.read_text()) == 12.5
    assert not rt.stop_path(record.id).is_symlink() and rt.stop_path(record.id).read_text() == "cancelled"
    assert json.loads(rt.outside_path(record.id).read_text())["pid"] == sleeper.pid
