"""Attacks on a root worker's supervisor side, as created users (tests/team.py): what a job
runs and as whom comes from the worker, never from a file on disk (C2); the worker's own
log is never written through a planted name (H3); a job gets a clean environment, not
root's (M5); and its workdir is entered as its owner (newcomer M5).

Each end-to-end test here was seen failing on the code before these defences."""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path

import psutil
import pytest
from team import ALICE, BOB, needs_root, team_gid

from conftest import wait_until

pytestmark = needs_root
PAUSE = {"GPUQ_TEST_PAUSE_AT": "spawner:locked"}  # the spawner stops with the job lock taken


def _paused_spawner(team, host: str) -> psutil.Process:
    """The worker's spawner, once it has stopped itself at the pause point (the worker has
    written the running record and handed the job over; no supervisor runs it yet)."""
    worker = team.worker_process(host)

    def stopped() -> psutil.Process | None:
        for child in worker.children():
            try:
                if "gpuq.run.spawner" in " ".join(child.cmdline()) and child.status() == psutil.STATUS_STOPPED:
                    return child
            except psutil.Error:
                pass
        return None

    return wait_until(stopped, what="the spawner to pause with the job locked")


def _finished(team, job_id: str) -> dict:
    return wait_until(lambda: team.finished(job_id), timeout=30, what=f"{job_id} to be recorded")


def _forged(record: dict, command: str) -> dict:
    """The running record as an attacker wants it: root's, with another command."""
    return {**record, "uid": 0, "user": "root", "spec": {**record["spec"], "command": command}}


# --- C2: hand, don't re-read --------------------------------------------------------------


def test_the_supervisor_runs_the_handed_record_even_when_the_file_on_disk_says_otherwise(team, users):
    """Whoever could replace state/running/<id>.json between the worker's write and the
    supervisor's start (root here: the team can no longer write state/), the job runs as
    alice with alice's command."""
    alice = users[ALICE]
    proof = team.base / "forged-ran"
    team.start_worker("a", "1x80GiB", env=PAUSE)
    team.drop_as(ALICE, "hand.yaml", "command: echo ALICE-COMMAND; id -u\ngpus: 0\nworkdir: /\n")
    spawner = _paused_spawner(team, "a")
    path = team.root / "state" / "running" / "hand.json"
    record = json.loads(path.read_text())
    assert record["uid"] == alice.pw_uid  # the worker recorded alice's job; now swap it
    tmp = path.with_name(".hand.forged")
    tmp.write_text(json.dumps(_forged(record, f"echo FORGED; id -u; touch {proof}")))
    os.rename(tmp, path)
    spawner.resume()
    finished = _finished(team, "hand")
    log = team.log("hand")
    assert finished["state"] == "done", log
    assert "ALICE-COMMAND" in log and str(alice.pw_uid) in log.splitlines(), log
    assert "FORGED" not in log and not proof.exists()
    assert (finished["uid"], finished["spec"]["command"]) == (alice.pw_uid, record["spec"]["command"])


def test_an_attacker_who_swaps_the_running_record_gets_only_his_own_job_run_as_himself(team, users):
    """C2 as the review ran it: bob forges his running record (uid 0, another command, the
    same claim) and renames it in just before the supervisor starts. Either the spool refuses
    his file or the supervisor never reads what to run from it: his harmless command runs,
    as bob."""
    bob = users[BOB]
    proof = team.base / "pwned"
    team.start_worker("a", "1x80GiB", env=PAUSE)
    team.drop_as(BOB, "race3.yaml", "command: echo harmless; id -u\ngpus: 0\nworkdir: /\n")
    spawner = _paused_spawner(team, "a")
    running = team.root / "state" / "running"
    attack = f"""
import json, os
p = {str(running / "race3.json")!r}
try:
    rec = json.load(open(p))
except OSError:  # records not readable: what bob knows of his own job is enough
    rec = {{"id": "race3", "state": "running", "spec": {{"command": "", "gpus": 0}}, "host": "a"}}
rec.update(uid=0, user="root")
rec["spec"]["command"] = "id -u > {proof}; echo FORGED"
try:
    with open(p + ".x", "w") as f:
        json.dump(rec, f)
    os.rename(p + ".x", p)
    print("forged record in place")
except OSError as e:
    print("refused:", e)
"""
    done = team.py_as(BOB, attack)
    assert done.returncode == 0, done.stderr
    spawner.resume()
    finished = _finished(team, "race3")
    log = team.log("race3")
    assert not proof.exists(), f"{done.stdout}: bob's command ran as root"
    assert finished["state"] == "done" and "FORGED" not in log, (done.stdout, log)
    assert "harmless" in log and str(bob.pw_uid) in log.splitlines() and finished["uid"] == bob.pw_uid


def test_whom_a_root_worker_runs_a_record_as(users):
    """Where jobs run as their owners (the root part is root): uid 0 is never "as myself"
    unless allow_root_jobs; a record naming no owner, or an owner with no account here,
    cannot start. A user's worker runs everything as itself."""
    from gpuq.model.record import Record
    from gpuq.model.states import State
    from gpuq.run.joblocal import Runtime
    from gpuq.run.launch import CannotStart, job_identity
    from gpuq.spool.layout import Layout

    def rt(allow_root: bool) -> Runtime:
        return Runtime(Layout(Path("/q")), "a", "boot", Path("/l"), 10, 180, {}, allow_root)

    def record(uid: int) -> Record:
        return Record(id="j", state=State.RUNNING, spec={}, uid=uid)

    alice = users[ALICE]
    assert job_identity(rt(False), record(alice.pw_uid), True).uid == alice.pw_uid
    assert job_identity(rt(True), record(0), True) is None  # root's own job, allowed by config
    assert job_identity(rt(False), record(alice.pw_uid), False) is None  # a user's worker
    unused = max(p.pw_uid for p in pwd.getpwall()) + 1000
    for allow, uid, reason in (
        (False, 0, "the job's owner is root, and allow_root_jobs is off"),
        (True, -1, "the record names no owner (uid -1)"),
        (True, unused, f"uid {unused}, the spec's owner, has no account here"),
    ):
        with pytest.raises(CannotStart) as refused:
            job_identity(rt(allow), record(uid), True)
        assert str(refused.value) == reason


# --- H3: the worker's own log ------------------------------------------------------------


def _plant(kind: str, log: Path, target: Path, bob: pwd.struct_passwd) -> None:
    if kind == "symlink":
        log.symlink_to(target)
    elif kind == "hard link":
        os.link(target, log)
    elif kind == "fifo":
        os.mkfifo(log)
    else:  # someone else's file
        log.write_text("bob's file\n")
        os.chown(log, bob.pw_uid, bob.pw_gid)


@pytest.mark.parametrize("kind", ["symlink", "hard link", "fifo", "someone else's file"])
def test_a_planted_worker_log_is_never_written_through(team, users, kind):
    """logs/worker-<host>.log planted as a link, a FIFO or another user's file (root plants
    it here: the team can no longer write logs/, and the defence must hold anyway): the root
    worker and its spawner write nothing through it, say so, and run jobs all the same."""
    target = team.base / "root-owned"
    target.write_text("root's file\n")
    os.chmod(target, 0o644)
    log = team.root / "logs" / "workers" / "a.log"
    log.parent.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    _plant(kind, log, target, users[BOB])
    before = None if kind == "fifo" else os.lstat(log)
    worker = team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "after-plant.yaml", "command: echo ran\ngpus: 0\nworkdir: /\n")
    assert _finished(team, "after-plant")["state"] == "done"  # the spawner started, too
    team.stop_worker("a")
    said = team.worker_stderr(worker)
    assert target.read_text() == "root's file\n"
    if before is not None:
        after = os.lstat(log)
        assert (after.st_size, after.st_uid) == (before.st_size, before.st_uid)
    else:
        assert stat.S_ISFIFO(os.lstat(log).st_mode)
    assert "cannot write the worker log" in said and "the spawner writes to the worker's stderr" in said, said


# --- M5: the job's environment, and its workdir ------------------------------------------


def test_a_root_worker_gives_a_job_its_owners_clean_environment(team, users):
    """Not the root worker's own variables (a vault token, root's PATH): the owner's HOME,
    USER, LOGNAME, SHELL, a plain PATH, the locale and TZ, the spec's env, gpuq's variables."""
    alice = users[ALICE]
    team.start_worker(
        "a",
        "1x80GiB",
        env={
            "ROOT_VAULT_TOKEN": "root-only-vault-token",
            "TZ": "UTC",
            "LC_TIME": "C",
            "PATH": "/root/secret-bin:" + os.environ["PATH"],
        },
    )
    team.drop_as(ALICE, "env.yaml", "command: env\ngpus: 0\nworkdir: /\nenv: {SEED: '3'}\n")
    assert _finished(team, "env")["state"] == "done", team.log("env")
    text = team.log("env")
    seen = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("==>"))
    assert "root-only-vault-token" not in text and "ROOT_VAULT_TOKEN" not in seen
    assert {k: seen.get(k) for k in ("HOME", "USER", "LOGNAME", "SHELL", "PATH", "TZ", "LC_TIME", "SEED")} == {
        "HOME": alice.pw_dir,
        "USER": ALICE,
        "LOGNAME": ALICE,
        "SHELL": alice.pw_shell,
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "TZ": "UTC",
        "LC_TIME": "C",
        "SEED": "3",
    }
    assert seen["GPUQ_JOB_ID"] == "env" and seen["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_the_base_environment_is_inherited_only_by_the_workers_own_jobs(monkeypatch):
    """A user's worker (or root's own job) passes its environment on; a job run as its
    owner by a root worker gets none of it but the locale and TZ."""
    from gpuq.host.owners import Identity
    from gpuq.run import launch

    worker_env = {
        "PATH": "/opt/worker/bin:/usr/bin",
        "SECRET_TOKEN": "x",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
        "HOME": "/root",
    }
    monkeypatch.setattr(launch, "inherited_environment", lambda: worker_env)
    assert launch.base_environment(None) == worker_env
    ana = Identity(54321, 54321, (54321,), "gpuq-nobody-here", "/home/ana")
    assert launch.base_environment(ana) == {
        "PATH": launch.JOB_PATH,
        "SHELL": "/bin/sh",
        "HOME": "/home/ana",
        "USER": "gpuq-nobody-here",
        "LOGNAME": "gpuq-nobody-here",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TZ": "UTC",
    }


def test_a_workdir_is_entered_as_its_owner(team, users):
    """A 0755 directory inside root's 0700 one is out of alice's reach, and a root worker
    must not carry her job there; a directory she reaches only through the team group is
    hers to work in."""
    secret = team.base / "rootonly"
    (secret / "sub").mkdir(parents=True)
    (secret / "sub" / "data.txt").write_text("root-only-by-traversal secret\n")
    os.chmod(secret, 0o700)
    os.chmod(secret / "sub", 0o755)
    teamdir = team.base / "teamonly"
    teamdir.mkdir()
    os.chown(teamdir, 0, team_gid())
    os.chmod(teamdir, 0o750)
    (teamdir / "data.txt").write_text("the team's data\n")
    os.chmod(teamdir / "data.txt", 0o644)
    assert team.run_as(ALICE, ["cat", str(secret / "sub" / "data.txt")]).returncode != 0  # no way in as herself
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "trav.yaml", f"command: cat data.txt; pwd\ngpus: 0\nworkdir: {secret / 'sub'}\n")
    team.drop_as(ALICE, "mine.yaml", f"command: cat data.txt\ngpus: 0\nworkdir: {teamdir}\n")
    record, log = _finished(team, "trav"), team.log("trav")
    reason = f"cannot start: workdir {secret / 'sub'} is not accessible to {ALICE} (Permission denied)"
    assert record["state"] == "failed" and record["reason"] == reason, (record["reason"], log)
    assert "root-only-by-traversal secret" not in log and reason in log
    assert _finished(team, "mine")["state"] == "done" and "the team's data" in team.log("mine")
