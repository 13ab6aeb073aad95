"""Shared use with real users (created here; CI runs as root): jobs run as their spec's owner,
logs are theirs and never written through a planted link, who may run and cancel what."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from team import ALICE, BOB, TEAM, drop_as

from conftest import Queue, wait_until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("useradd"),
        reason="creating users needs root and useradd (CI runs as root)",
    ),
    pytest.mark.slow,
]
ANA, BO = ALICE, BOB  # tests/team.py makes them (names of this test process's own)


def test_a_root_worker_runs_each_job_as_its_owner_with_a_log_of_theirs(shared, users):
    ana = users[ANA]
    shared.start_worker("a", "1x80GiB")
    drop_as(shared, ana, "who.yaml", "command: id; echo HOME=$HOME USER=$USER LOGNAME=$LOGNAME\ngpus: 0\nworkdir: /\n")
    record = wait_until(lambda: shared.finished("who"), what="who to run")
    assert record["state"] == "done", shared.log("who")
    expected_id = subprocess.run(["id", ANA], capture_output=True, text=True).stdout.strip()
    lines = shared.log("who").splitlines()
    assert expected_id in lines and f"gid={ana.pw_gid}" in expected_id and TEAM in expected_id
    assert f"HOME={ana.pw_dir} USER={ANA} LOGNAME={ANA}" in lines
    st = os.stat(shared.root / "logs" / "who.log")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (ana.pw_uid, ana.pw_gid, 0o640)


def test_a_planted_log_link_is_never_written_through(shared, users):
    target = shared.root.parent / "precious"
    target.write_text("root's file\n")
    (shared.root / "logs").mkdir(parents=True, exist_ok=True)
    os.symlink(target, shared.root / "logs" / "evil.log")
    shared.start_worker("a", "1x80GiB")
    drop_as(shared, users[ANA], "evil.yaml", "command: echo pwned\ngpus: 0\nworkdir: /\n")
    record = wait_until(lambda: shared.finished("evil"), what="evil to be settled")
    assert record["state"] == "failed" and "log evil.log exists and is not a plain file of" in record["reason"]
    assert target.read_text() == "root's file\n"


def test_a_root_owned_spool_under_a_shared_jobs_dir_is_refused(shared, users):
    """Root would read members' specs and write the spool as root: a shared jobs/ needs a
    queue account (`gpuq init --group`), and the worker says so instead of starting."""
    os.chmod(shared.root / "jobs", 0o1777)
    proc = subprocess.run(
        [*shared.worker_command(), "--root", str(shared.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        env=shared.env(),
    )
    assert proc.returncode == 2 and "is writable by others" in proc.stderr, proc.stderr
    assert "--group TEAM" in proc.stderr and not (shared.root / "state" / "workers" / "a.json").exists()


def test_root_owned_and_writable_specs_are_refused_with_the_reason(team):
    shared = team
    shared.start_worker("a", "1x80GiB")
    (shared.root / "jobs" / "rooty.yaml").write_text("command: id\ngpus: 0\n")
    team.drop_as(ANA, "open.yaml", "command: id\ngpus: 0\n", mode=0o666)
    for job_id, reason in (
        ("rooty", "is owned by root, and gpuq does not run jobs as root"),
        ("open", "can be changed by other users (mode 0666)"),
    ):
        wait_until(
            lambda job_id=job_id: (shared.root / "state" / "rejected" / f"{job_id}.error").exists(),
            what=f"{job_id} to be refused",
        )
        assert reason in (shared.root / "state" / "rejected" / f"{job_id}.error").read_text()
    assert shared.finished("rooty") is None and shared.finished("open") is None
    # The message names the file where it is now (newcomer review: it named jobs/open.yaml,
    # gone), and the fix is a fresh copy: a chmod of that one, then a retry, once ran what
    # another member had written into it through a handle opened while they could.
    said = (shared.root / "state" / "rejected" / "open.error").read_text()
    assert "Fix: write a fresh copy yourself with mode 0644" in said and "jobs/open.yaml:" in said, said
    # Kept under a name `gpuq retry` never takes: its text may be another member's.
    assert re.search(r"kept as state/rejected/open\+\d+\.[0-9a-f]+\.yaml\.", said) and "gpuq retry" not in said, said
    shown = shared.gpuq("status").stdout  # the fix on a line of its own, whole
    assert "    Fix: write a fresh copy yourself with mode 0644" in shown, shown


def test_submit_refuses_what_the_workers_would_refuse_for_its_owner(shared):
    """Newcomer review: `gpuq submit` as root printed an id and exited 0, then the worker
    rejected the spec ("owned by root"). Submit checks the owner as the workers will."""
    shared.write_config(allow_root_jobs=False)
    refused = shared.gpuq("submit", "--gpus", "0", "--id", "as-root", "--", "id", check=False)
    assert refused.returncode == 2 and "would be owned by root" in refused.stderr, refused.stderr
    assert "allow_root_jobs" in refused.stderr and "Nothing was written" in refused.stderr
    assert not list((shared.root / "jobs").glob("as-root*"))
    shared.write_config(allow_root_jobs=True)  # where everything runs as root (a container)
    assert shared.gpuq("submit", "--gpus", "0", "--id", "as-root", "--", "id").stdout.split()[-1] == "as-root"


def _worker_as(queue: Queue, user: pwd.struct_passwd, shared_code) -> subprocess.Popen:
    python, code = shared_code  # an interpreter and code the user can run (tests/team.py)
    proc = subprocess.Popen(
        [
            python,
            str(code / "worker.py"),
            "--root",
            str(queue.root),
            "--host",
            "a",
            "--fake-gpus",
            "1x80GiB",
            "--foreground",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**queue.env(), "HOME": "/tmp"},
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
    )
    queue.workers["a"] = proc
    return proc


def test_a_worker_not_run_as_root_runs_only_its_users_specs(shared, users, shared_code):
    ana, bo = users[ANA], users[BO]
    for d in ("jobs", "state", "logs"):
        (shared.root / d).mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["chown", "-R", f"{ana.pw_uid}:{ana.pw_gid}", str(shared.root), str(shared.local_base.parent)], check=True
    )
    shared.local_base.mkdir(exist_ok=True)
    os.chown(shared.local_base, ana.pw_uid, ana.pw_gid)
    _worker_as(shared, ana, shared_code)
    drop_as(shared, ana, "mine.yaml", "command: id -un\ngpus: 0\nworkdir: /\n")
    drop_as(shared, bo, "theirs.yaml", "command: id -un\ngpus: 0\nworkdir: /\n")
    assert wait_until(lambda: shared.finished("mine"), what="ana's own job")["state"] == "done"
    wait_until(lambda: (shared.root / "state" / "rejected" / "theirs.error").exists(), what="bo's refusal")
    assert (
        f"runs as {ANA}, which runs only its own specs"
        in (shared.root / "state" / "rejected" / "theirs.error").read_text()
    )
    shared.stop_worker("a")
    shared.write_config(allow_root_jobs=False, run_for_users=[BO])
    _worker_as(shared, ana, shared_code)
    drop_as(shared, bo, "for-bo.yaml", "command: id -un\ngpus: 0\nworkdir: /\n")
    record = wait_until(lambda: shared.finished("for-bo"), what="bo's job, run by ana's worker")
    assert record["state"] == "done" and ANA in shared.log("for-bo").splitlines()


def test_one_users_own_queue_works_end_to_end_without_root(users, shared_code, tmp_path_factory):
    """Nothing a single user had is lost: ana makes a queue of her own (`gpuq init`, no group),
    runs its worker as herself (its starter and keepers are hers: nothing to drop), and submits,
    watches, cancels and reads logs with her own gpuq."""
    python, code = shared_code
    ana = users[ANA]
    base = Path(tempfile.mkdtemp(prefix="gpuq-own-"))
    os.chown(base, ana.pw_uid, ana.pw_gid)
    as_ana = {"user": ana.pw_uid, "group": ana.pw_gid, "extra_groups": [], "cwd": "/"}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(base), "GPUQ_ROOT": str(base / "q")}

    def gpuq(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, str(code / "gpuq.py"), *args], capture_output=True, text=True, env=env, **as_ana)

    worker = None
    try:
        assert gpuq("init", str(base / "q")).returncode == 0
        worker = subprocess.Popen(
            [python, str(code / "worker.py"), "--host", "a", "--fake-gpus", "1x24GiB", "--foreground"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            **as_ana,
        )
        sub = gpuq(
            "submit",
            "--id",
            "hello",
            "--gpus",
            "1",
            "--gpu-mem",
            "4GiB",
            "--",
            "id -un; echo CVD=$CUDA_VISIBLE_DEVICES",
        )
        assert sub.returncode == 0, sub.stderr
        assert gpuq("submit", "--id", "long", "--gpus", "0", "--", "sleep 300").returncode == 0
        wait_until(lambda: (base / "q" / "state" / "finished" / "hello.json").exists(), what="her job")
        logs = gpuq("logs", "hello")
        assert logs.returncode == 0 and ANA in logs.stdout and "CVD=0" in logs.stdout, logs
        wait_until(
            lambda: "long" in gpuq("status").stdout and (base / "q" / "state" / "running" / "long.json").exists()
        )
        cancel = gpuq("cancel", "long")
        assert cancel.returncode == 0 and "cancel" in cancel.stdout, cancel
        record = json.loads(
            wait_until(lambda: (p := base / "q" / "state" / "finished" / "long.json").exists() and p.read_text())
        )
        assert record["state"] == "cancelled" and record["user"] == ANA
        for p in psutil.process_iter(["uids", "cmdline"]):  # everything of her queue is hers
            if str(base) in " ".join(p.info["cmdline"] or []):
                assert p.info["uids"].real == ana.pw_uid and p.info["uids"].effective == ana.pw_uid, p.info
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        subprocess.run(["pkill", "-KILL", "-u", ANA, "-f", str(base)], capture_output=True)
        digest = hashlib.sha1(str(base / "q").encode()).hexdigest()[:10]  # her worker's local dir (RAM)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
        shutil.rmtree(f"{shm}/gpuq-{ana.pw_uid}/a-{digest}", ignore_errors=True)
        shutil.rmtree(base, ignore_errors=True)
