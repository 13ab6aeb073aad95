"""Attacks by a team member (bob) on a root worker, on README's recommended setup (`gpuq init
--group TEAM`), each one a finding of the 2026-11-30 security and newcomer reviews: bob must
never make root write, delete, chown or run anything, nor touch alice's jobs; and every
member can still cancel, hold, release, edit and retry their own jobs, on every box.

Findings kept elsewhere: containers (C6) in test_attack_containers.py, the supervisor (C2, H3,
M5) in test_attack_supervisor.py, the Slurm bridge (C7) in test_attack_bridge.py, secrets
(M4) in test_secrets.py, terminals and bad input (M8, M9, LOW) in test_terminal_safety.py
and test_bad_input.py."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest
from team import ALICE, BOB, EVE, QUEUE, needs_root

from conftest import PY, REPO, wait_until

pytestmark = needs_root
SLEEPER = "command: sleep 60\ngpus: 0\nworkdir: /\n"


def _root_only_target(team) -> Path:
    """A root-owned file in a root-only directory: what an attack would overwrite."""
    d = team.base / "rootonly"
    d.mkdir(mode=0o700, exist_ok=True)
    target = d / "victim"
    target.write_text("precious root data\n")
    os.chmod(target, 0o600)
    return target


def _intact(target: Path) -> bool:
    st = os.lstat(target)
    return target.read_text() == "precious root data\n" and (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600)


def _state(team, job_id: str) -> str | None:
    for d, state in (("running", None), ("finished", None), ("held", "held")):
        p = team.root / "state" / d / f"{job_id}.json"
        if p.exists():
            return state or json.loads(p.read_text())["state"]
    return "pending" if (team.root / "jobs" / f"{job_id}.yaml").exists() else None


# --- the boundary itself -------------------------------------------------------------------


def test_a_member_can_create_or_replace_files_only_in_jobs_and_the_inbox(team):
    """The structural check: everything under the root but jobs/ and requests/ is the
    worker's; bob can neither create, replace, rename nor remove anything there."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al.yaml", SLEEPER)
    wait_until(lambda: _state(team, "al") == "running", what="alice's job to run")
    team.stop_worker("a")  # its files stay: bob tries each of them
    script = f"""
import os, sys
root = {str(team.root)!r}
allowed = {{os.path.join(root, "jobs"), os.path.join(root, "requests")}}
made = []
for d, dirs, files in os.walk(root):
    for name in dirs + files + ["bob-was-here"]:
        p = os.path.join(d, name)
        for attempt in ("create", "replace", "remove"):
            try:
                if attempt == "create":
                    os.close(os.open(p + ".bob", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                elif attempt == "replace" and name != "bob-was-here":
                    os.rename(os.path.join(root, "jobs", "mine.yaml"), p)
                elif attempt == "remove" and name != "bob-was-here" and not os.path.isdir(p):
                    os.unlink(p)
                else:
                    continue
            except OSError:
                continue
            if d not in allowed:
                made.append(attempt + " " + p)
print("\\n".join(made))
"""
    team.drop_as(BOB, "mine.yaml", "command: echo ok\ngpus: 0\n")
    done = team.py_as(BOB, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"bob changed the worker's files:\n{done.stdout}"
    queue_uid = pwd.getpwnam(QUEUE).pw_uid
    for name, owner in (("config.yaml", 0), ("state", queue_uid), ("logs", queue_uid)):
        st = os.stat(team.root / name)
        assert st.st_uid == owner and not st.st_mode & 0o022, f"{name} must be uid {owner}'s and not writable by others"
    for inbox in ("jobs", "requests"):
        assert stat.S_IMODE(os.stat(team.root / inbox).st_mode) == 0o3770


def test_a_root_worker_refuses_a_config_or_root_others_can_write(team):
    """C3 / B2: whoever can write config.yaml sets alert_command, which the worker runs."""
    os.chmod(team.root / "config.yaml", 0o664)
    proc = subprocess.run(
        [PY, str(REPO / "worker.py"), "--root", str(team.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        env=team.env(),
    )
    assert proc.returncode == 2 and "config.yaml" in proc.stderr and "chmod go-w" in proc.stderr
    assert not (team.root / "state" / "workers" / "a.json").exists()
    os.chmod(team.root / "config.yaml", 0o644)
    os.chmod(team.root, 0o2770)  # a group-writable root: bob could swap state/ or config.yaml
    proc = subprocess.run(
        [PY, str(REPO / "worker.py"), "--root", str(team.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        env=team.env(),
    )
    assert proc.returncode == 2 and "the queue root" in proc.stderr
    edit = team.run_as(BOB, ["/bin/sh", "-c", f"echo 'alert_command: id' >> {team.root / 'config.yaml'}"])
    assert edit.returncode != 0  # init made it root's 0644


# --- forged state (C1, C5, H4, H5, H6): the team cannot write it; garbage never spreads ---------


def test_forged_records_are_refused_and_never_used_as_paths(team):
    """C1: a record naming an absolute claim, or an id with ../, made root delete any file.
    bob can no longer write state/running/; and a record that is not gpuq's (put there by
    anyone who can) is skipped and reported, never acted on."""
    target = _root_only_target(team)
    forged = {
        "id": "evil",
        "state": "running",
        "spec": {},
        "host": "a",
        "boot_id": "not-this-boot",
        "attempt": 99,
        "claim": str(target),
        "uid": team.users[BOB].pw_uid,
        "user": BOB,
    }
    as_bob = team.py_as(BOB, f"open({str(team.root / 'state' / 'running' / 'evil.json')!r}, 'w')")
    assert as_bob.returncode != 0 and "Permission denied" in as_bob.stderr
    (team.root / "state" / "running" / "evil.json").write_text(json.dumps(forged))
    (team.root / "state" / "running" / "dots.json").write_text(json.dumps({**forged, "id": "../../x", "claim": None}))
    (team.root / "state" / "running" / "junk.json").write_text("{not json")
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "fine.yaml", "command: echo ok\ngpus: 0\nworkdir: /\n")
    assert wait_until(lambda: team.finished("fine"), what="alice's job, past the junk")["state"] == "done"
    assert _intact(target)
    status = team.as_user(ALICE, "status")
    assert status.returncode == 0 and "fine" in status.stdout, status.stderr
    log = (team.root / "logs" / "workers" / "a.log").read_text()
    assert "state/running/evil.json skipped" in log and "state/running/junk.json skipped" in log


def test_an_error_file_is_never_written_through_a_link_and_stays_one_line(team):
    """C5: `.error` was written with write_text through a link bob planted, with his
    newline-injected YAML key as new lines (a crontab line, as root)."""
    target = _root_only_target(team)
    as_bob = team.run_as(BOB, ["ln", "-s", str(target), str(team.root / "state" / "rejected" / "zz.error")])
    assert as_bob.returncode != 0  # state/rejected is the worker's now
    os.symlink(target, team.root / "state" / "rejected" / "zz.error")  # as if it were there anyway
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "zz.yaml", 'command: echo\n"x\\n* * * * * root cp /bin/sh /tmp/rootsh": 1\n')
    rejected = team.root / "state" / "rejected"
    # Beside a zz.error already there (the planted link), the rejection is kept under a name of its own.
    errors = lambda: [p for p in rejected.glob("zz*.error") if not p.is_symlink()]  # noqa: E731
    error = wait_until(lambda: errors() and errors()[0], timeout=30, what="the rejection")
    assert _intact(target) and (rejected / "zz.error").is_symlink()
    text = error.read_text()
    assert text.count("\n") == 1 and "\\n* * * * * root" in text
    assert "\n* * * * *" not in (team.root / "logs" / "workers" / "a.log").read_text()


def test_garbage_groups_never_stop_a_worker_or_status(team):
    """H6: one bad file in state/groups/ crashed every worker start (a cron restart loop).
    (H5, garbage bookings: the bookings extra's tests.)"""
    (team.root / "state" / "groups" / "leak.yaml").write_text("a: [unclosed\n")
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "ok.yaml", "command: echo ok\ngpus: 1\ngpu_mem: 1GiB\nworkdir: /\n")
    assert wait_until(lambda: team.finished("ok"), what="a job past the garbage")["state"] == "done"
    status = team.as_user(BOB, "status")
    assert status.returncode == 0 and "Traceback" not in status.stderr
    assert team.workers["a"].poll() is None
    assert "sweep leak left as it is" in (team.root / "logs" / "workers" / "a.log").read_text()


# --- writes through links a member planted in jobs/ (C4, H1) -------------------------------


def test_a_sweep_never_writes_through_a_planted_link(team):
    """C4: the worker wrote each member to jobs/.<member>.group.tmp through bob's link, then
    chowned the target to him."""
    target = _root_only_target(team)
    team.start_worker("a", "1x80GiB")
    planted = team.run_as(BOB, ["ln", "-s", str(target), str(team.root / "jobs" / ".hq_x1.group.tmp")])
    assert planted.returncode == 0, planted.stderr
    team.drop_as(BOB, "hq.yaml", "command: echo {x}\ngpus: 0\nworkdir: /\nsweep: {x: [1, 2]}\n")
    for member in ("hq_x1", "hq_x2"):
        record = wait_until(lambda member=member: team.finished(member), what=f"sweep member {member}")
        assert record["state"] == "done" and record["uid"] == team.users[BOB].pw_uid
    assert _intact(target)


def test_retry_and_edit_by_root_never_write_through_a_planted_link(team):
    """H1: root's `gpuq retry` wrote jobs/.<id>.retry.tmp and chowned it, through bob's link;
    `gpuq edit` did the same in state/held/."""
    target = _root_only_target(team)
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "race1.yaml", "command: echo one\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("race1"), what="race1")
    assert team.run_as(BOB, ["ln", "-s", str(target), str(team.root / "jobs" / ".race1.retry.tmp")]).returncode == 0
    assert team.gpuq("retry", "race1").stdout.startswith("race1: back in the queue as attempt 2")
    record = wait_until(lambda: (r := team.finished("race1")) and r["attempt"] == 2 and r, what="attempt 2")
    assert record["state"] == "done" and record["uid"] == team.users[BOB].pw_uid
    assert _intact(target)
    team.stop_worker("a")  # edit a job that stays pending
    team.drop_as(BOB, "ed1.yaml", "command: echo hi\ngpus: 0\nworkdir: /\n")
    edited = team.gpuq("edit", "ed1", env={**team.env(), "EDITOR": "sed -i s/hi/hello/"})
    assert "ed1: edited, back at its place in the queue" in edited.stdout
    spec = team.root / "jobs" / "ed1.yaml"
    assert "hello" in spec.read_text() and os.stat(spec).st_uid == team.users[BOB].pw_uid
    assert _intact(target)


# --- who may do what: the request file's owner decides (M2, M3, M4, H4, B1) ------------------


def test_members_change_only_their_own_jobs_and_admins_any(team):
    """H4: bob could kill, cancel, release or wipe alice's jobs by writing state/; the
    request file's owner decides now. M3: an admin could not cancel, hold or edit a pending
    job of someone else in the sticky jobs/."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al-run.yaml", SLEEPER.replace("gpus: 0", "gpus: 1"))
    wait_until(lambda: _state(team, "al-run") == "running", what="al-run")
    team.drop_as(ALICE, "al-pend.yaml", SLEEPER.replace("gpus: 0", "gpus: 1"))  # waits: the GPU is alice's
    refused = team.as_user(BOB, "cancel", "al-run")
    assert refused.returncode == 1 and f"belongs to {ALICE}; only its owner, root or an admin" in refused.stderr
    refused = team.as_user(BOB, "hold", "al-pend")
    assert refused.returncode == 1 and f"belongs to {ALICE}" in refused.stderr
    for verb in ("hold", "edit"):  # a running job of another: whose it is comes first, not "not pending"
        refused = team.as_user(BOB, verb, "al-run", env={"EDITOR": "true"})
        assert refused.returncode == 1 and f"belongs to {ALICE}; only its owner" in refused.stderr, refused.stderr
    held = team.as_user(ALICE, "hold", "al-pend")
    assert held.returncode == 0, held.stderr
    for verb in ("edit", "hold"):  # held by her ("already held" told bob to release it)
        refused = team.as_user(BOB, verb, "al-pend", env={"EDITOR": "true"})
        assert refused.returncode == 1 and f"belongs to {ALICE}; only its owner" in refused.stderr, refused.stderr
    assert team.as_user(ALICE, "release", "al-pend").returncode == 0
    assert _state(team, "al-run") == "running" and _state(team, "al-pend") in ("pending", "running")
    team.stop_worker("a")
    team.write_config(admins=[BOB])  # bob becomes an admin
    team.start_worker("a", "1x80GiB")
    held = team.as_user(BOB, "hold", "al-pend")
    assert held.returncode == 0, held.stderr
    assert _state(team, "al-pend") == "held"
    cancelled = team.as_user(BOB, "cancel", "al-run", "al-pend")
    assert cancelled.returncode == 0, cancelled.stderr
    record = wait_until(lambda: team.finished("al-run"), what="al-run cancelled by the admin")
    assert record["state"] == "cancelled" and f"cancelled by {BOB}" in record["reason"]
    assert team.finished("al-pend")["state"] == "cancelled"


def test_a_backdated_spec_does_not_jump_the_queue(team):
    """Found in the second attack round: the queue place came from the spec's mtime, which
    bob can set to any past day (`touch -d`). The file's change time he cannot set."""
    one_gpu = SLEEPER.replace("sleep 60", "sleep 1").replace("gpus: 0", "gpus: 1")
    team.drop_as(ALICE, "al-first.yaml", one_gpu)
    team.drop_as(BOB, "bob-later.yaml", one_gpu)
    backdated = team.run_as(BOB, ["touch", "-d", "2001-01-01", str(team.root / "jobs" / "bob-later.yaml")])
    assert backdated.returncode == 0, backdated.stderr
    team.start_worker("a", "1x80GiB")
    first = wait_until(lambda: team.finished("al-first"), what="alice's job")
    second = wait_until(lambda: team.finished("bob-later"), what="bob's job")
    assert first["claimed_at"] < second["claimed_at"]
    assert second["queued_at"] > time.time() - 3600  # not 2001: the place is when the file landed


def test_drain_judges_the_file_owner_not_the_environment(team):
    """Newcomer: anyone could drain any host (M4, unbook: the bookings extra's tests)."""
    team.start_worker("a", "2x80GiB")
    drain = team.as_user(BOB, "drain", "a")
    assert drain.returncode == 1 and "only root or an admin" in drain.stderr
    assert not (team.root / "state" / "drain" / "a.json").exists()


def test_a_forged_request_is_judged_by_its_owner_and_garbage_is_answered(team):
    """A request claiming to be alice's is bob's (the file's owner); a request that is not
    one (garbage, a FIFO) gets an answer, and the worker goes on."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al.yaml", SLEEPER)
    wait_until(lambda: _state(team, "al") == "running", what="al")
    inbox = team.root / "requests"
    script = f"""
import json, os
inbox = {str(inbox)!r}
def put(name, data):
    with open(os.path.join(inbox, "." + name), "w") as f: f.write(data)
    os.rename(os.path.join(inbox, "." + name), os.path.join(inbox, name))
put("r-1-00000000000000aa.json", json.dumps({{"verb": "cancel", "ids": ["al"], "by": {ALICE!r}, "uid": 0}}))
put("r-1-00000000000000bb.json", "{{garbage")
put("r-1-00000000000000cc.json", json.dumps({{"verb": "cancel", "ids": ["../../etc/passwd"]}}))
os.mkfifo(os.path.join(inbox, "r-1-00000000000000dd.json"))
"""
    assert team.py_as(BOB, script).returncode == 0
    replies, bob = team.root / "state" / "replies", team.users[BOB].pw_uid
    for name in ("aa", "bb", "cc", "dd"):
        wait_until(lambda name=name: (replies / f"{bob}-r-1-00000000000000{name}.json").exists(), what=f"reply {name}")
    reply = lambda n: json.loads((replies / f"{bob}-r-1-00000000000000{n}.json").read_text())  # noqa: E731
    assert not reply("aa")["ok"] and f"belongs to {ALICE}" in reply("aa")["outcomes"][0]["message"]
    assert "not JSON" in reply("bb")["outcomes"][0]["message"]
    assert "is not a job id" in reply("cc")["outcomes"][0]["message"]
    assert "not a plain file" in reply("dd")["outcomes"][0]["message"]
    assert _state(team, "al") == "running" and team.workers["a"].poll() is None
    assert list(inbox.iterdir()) == []


# --- a team's everyday use (B1, M1, M2) ----------------------------------------------------


def test_two_members_each_manage_their_own_jobs_on_two_boxes(team):
    """B1 / M1 / M2: only the first member per host could cancel, hold, release, retry or
    edit (per-host files created lazily with private modes), and verbs failed half done."""
    team.start_worker("a", "1x80GiB")
    team.start_worker("b", "1x80GiB")
    for user in (ALICE, BOB):
        short = {ALICE: "al", BOB: "bo"}[user]
        for box in ("a", "b"):  # one running job per member per box
            team.drop_as(
                user,
                f"{short}-run-{box}.yaml",
                f"command: sleep 60\ngpus: 1\ngpu_mem: 1GiB\nhosts: [{box}]\nworkdir: /\n",
            )
        team.drop_as(user, f"{short}-done.yaml", "command: 'false'\ngpus: 0\nworkdir: /\n")
    for user in (ALICE, BOB):
        short = {ALICE: "al", BOB: "bo"}[user]
        for box in ("a", "b"):
            wait_until(
                lambda box=box, short=short: _state(team, f"{short}-run-{box}") == "running", what=f"{short} on {box}"
            )
        wait_until(lambda short=short: team.finished(f"{short}-done"), what=f"{short}-done")
    for user in (ALICE, BOB):  # pending jobs: they wait behind the running ones (one GPU per box)
        short = {ALICE: "al", BOB: "bo"}[user]
        team.drop_as(
            user,
            f"{short}-wait.yaml",
            "command: echo hi\ngpus: 1\ngpu_mem: 1GiB\nworkdir: /\nhosts: [a]\nafter_any: [" + f"{short}-run-a]\n",
        )
    for user in (ALICE, BOB):
        short = {ALICE: "al", BOB: "bo"}[user]
        assert _state(team, f"{short}-wait") == "pending"
        hold = team.as_user(user, "hold", f"{short}-wait")
        assert hold.returncode == 0 and "held" in hold.stdout, hold.stderr
        edit = team.as_user(user, "edit", f"{short}-wait", env={"EDITOR": "sed -i s/hi/hello/"})
        assert edit.returncode == 0 and "edited (still held)" in edit.stdout, edit.stderr
        release = team.as_user(user, "release", f"{short}-wait")
        assert release.returncode == 0 and "released" in release.stdout, release.stderr
        retry = team.as_user(user, "retry", f"{short}-done")
        assert retry.returncode == 0 and "attempt 2" in retry.stdout, retry.stderr
        for box in ("a", "b"):
            cancel = team.as_user(user, "cancel", f"{short}-run-{box}")
            assert cancel.returncode == 0 and f"running on {box}" in cancel.stdout, cancel.stderr
    for user in (ALICE, BOB):
        short = {ALICE: "al", BOB: "bo"}[user]
        for box in ("a", "b"):
            record = wait_until(
                lambda box=box, short=short: team.finished(f"{short}-run-{box}"), what=f"{short} on {box} cancelled"
            )
            assert record["state"] == "cancelled" and f"cancelled by {user}" in record["reason"]
        record = wait_until(lambda short=short: team.finished(f"{short}-wait"), what=f"{short}-wait ran")
        assert record["state"] == "done" and "hello" in team.log(f"{short}-wait")
    events = team.events()
    for user in (ALICE, BOB):
        short = {ALICE: "al", BOB: "bo"}[user]
        assert any(e.get("job") == f"{short}-wait" and e.get("to") == "held" for e in events)
        assert any(e.get("job") == f"{short}-done" and str(e.get("reason")).startswith("retry by") for e in events)


def test_a_request_with_no_worker_says_it_waits(team):
    team.drop_as(ALICE, "w.yaml", SLEEPER)
    done = team.as_user(ALICE, "cancel", "w")
    assert done.returncode == 3 and "no worker is running" in done.stderr and "waits" in done.stderr
    assert _state(team, "w") == "pending"
    team.start_worker("a", "1x80GiB")  # the waiting request is applied at its first pass
    record = wait_until(lambda: team.finished("w"), what="the waiting cancel")
    assert record["state"] == "cancelled" and f"cancelled by {ALICE}" in record["reason"]


def test_a_cancel_on_a_failing_disk_loses_nothing(team, monkeypatch):
    """M7: a cancel whose record could not be written left the spec hidden for good."""
    team.drop_as(ALICE, "cfail.yaml", SLEEPER)
    env = {**team.env(), "GPUQ_TEST_IO_FAULT": "write:finished=ENOSPC"}
    done = team.gpuq("cancel", "cfail", check=False, env=env)  # root applies it itself
    assert done.returncode == 1 and "No space left on device" in done.stderr and "nothing was changed" in done.stderr
    assert _state(team, "cfail") == "pending"
    assert not [p for p in (team.root / "state" / "finished").iterdir()]


def test_doctor_for_a_member_judges_workers_by_heartbeat_and_flags_what_others_can_write(team):
    """Newcomer M9: doctor told every member to install a worker crontab of their own; B2 and
    M10: it flagged neither a group-writable config nor an interpreter the team cannot run."""
    from team import _reachable_by_others

    team.start_worker("a", "1x80GiB")
    member = team.as_user(BOB, "doctor")
    assert "workers are up (by their heartbeats): a" in member.stdout, member.stdout
    assert "crontab" not in member.stdout and "FAIL permissions" not in member.stdout
    admin = team.gpuq("doctor", check=False).stdout  # the team's own venv: everyone reaches it
    assert "ok   reachable" in admin, admin
    if not _reachable_by_others(PY):  # this test run's interpreter, under an admin's home
        admin = subprocess.run(
            [PY, str(REPO / "gpuq.py"), "--root", str(team.root), "doctor"], capture_output=True, text=True
        )
        assert admin.returncode == 1 and "FAIL reachable" in admin.stdout, admin.stdout + admin.stderr
        assert "cannot read" in admin.stdout and "venv every member can reach" in admin.stdout, admin.stdout
    os.chmod(team.root / "config.yaml", 0o664)
    member = team.as_user(BOB, "doctor")
    assert member.returncode == 1 and "FAIL permissions" in member.stdout and "config.yaml" in member.stdout
    assert "chmod go-w" in member.stdout


def test_doctor_never_tells_a_member_to_start_or_fix_a_worker(team):
    """Newcomer M9: a member who followed doctor's advice ran a worker of their own and made a
    phantom host. With no worker yet, and then with a stopped one, a member is told whom to ask;
    the workers' owner is told what to run."""

    def advice(out: str) -> str:
        return "\n".join(line for line in out.splitlines() if not line.startswith("ok "))

    for stage in ("no worker yet", "a stopped worker"):
        member = team.as_user(BOB, "doctor")
        said = advice(member.stdout)
        assert member.returncode == 1 and "ask the root's owner" in said, (stage, member.stdout)
        for start_one in ("crontab -e", "worker.py", "gpuq-worker", "--fake-gpus", "add to each box"):
            assert start_one not in said, (stage, start_one, member.stdout)
        admin = team.gpuq("doctor", check=False).stdout
        assert ("add to each box's crontab" if stage == "no worker yet" else "check its crontab") in admin, admin
        if stage == "no worker yet":
            team.start_worker("a", "1x80GiB")
            team.stop_worker("a")  # stops cleanly: its last heartbeat says so
            wait_until(
                lambda: "its worker stopped cleanly" in team.as_user(BOB, "doctor").stdout,
                timeout=60,
                what="a's last heartbeat",
            )


def test_a_state_tree_owned_by_another_account_is_refused_and_doctor_says_so(team):
    """Shared disks: a root worker must own the spool it writes (an NFS export that squashes
    root leaves it owned by another account). No NFS here: a state/ owned by another account
    stands in for it; the worker refuses to start, and doctor names the path and the fix."""
    os.chown(team.root / "state", team.users[EVE].pw_uid, -1)
    proc = subprocess.run(
        [PY, str(REPO / "worker.py"), "--root", str(team.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        env=team.env(),
    )
    assert proc.returncode == 2 and "state" in proc.stderr and f"uid {team.users[EVE].pw_uid}" in proc.stderr
    assert not (team.root / "state" / "workers" / "a.json").exists()
    doctor = team.gpuq("doctor", check=False)
    assert doctor.returncode == 1 and "FAIL permissions" in doctor.stdout and "state" in doctor.stdout


def test_no_job_log_can_take_a_workers_log(team):
    """An attack review: bob's job `worker-box-c` made logs/worker-box-c.log his, before box-c's
    worker first started; that worker then ran with no log, and admins would read his lines as
    its own. Workers log in logs/workers/, the queue account's, where no job's log goes."""
    team.start_worker("a", "1x80GiB")
    for job_id in ("worker-c", "workers"):
        assert (
            team.as_user(BOB, "submit", "--id", job_id, "--gpus", "0", "--workdir", "/", "--", "echo squat").returncode
            == 0
        )
        wait_until(lambda job_id=job_id: team.finished(job_id), what=job_id)
    team.start_worker("c", "1x80GiB")
    log = team.root / "logs" / "workers" / "c.log"
    wait_until(lambda: log.exists() and "worker c started" in log.read_text(), what="c's own log")
    assert os.stat(log).st_uid == pwd.getpwnam(QUEUE).pw_uid
    assert os.stat(team.root / "logs" / "worker-c.log").st_uid == team.users[BOB].pw_uid  # his job's, apart


def test_a_box_without_the_queues_account_says_how_to_make_it(team):
    """Every box needs the queue's account, with the uid state/ has (init made it on one box
    only): a worker, and root's gpuq, on a box without it say so and what to run, and
    change nothing."""
    unknown = 3_999_123
    assert subprocess.run(["getent", "passwd", str(unknown)], capture_output=True).returncode != 0
    os.chown(team.root / "state", unknown, -1)
    proc = subprocess.run(
        [*team.worker_command(), "--root", str(team.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        env=team.env(),
    )
    assert proc.returncode == 2 and f"owned by uid {unknown}, which has no account on this box" in proc.stderr
    assert f"useradd --system --uid {unknown}" in proc.stderr, proc.stderr
    status = team.gpuq("status", check=False)
    assert status.returncode == 2 and "which has no account on this box" in status.stderr, status.stderr
    assert not (team.root / "state" / "workers" / "a.json").exists()


def test_doctor_says_when_the_export_squashes_root(team):
    """An NFS export that squashes root refuses root's creates in the root-owned state/. No
    NFS here: a user namespace maps a member to root, and that 'root' meets exactly what a
    squashed one meets (euid 0 inside, EACCES from the real owner's directory); doctor must
    name the export and its fix."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = team.run_as(ALICE, ["unshare", "--user", "--map-root-user", "id", "-u"])
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.strip()}")
    assert probe.stdout.strip() == "0"
    as_squashed_root = [
        "unshare",
        "--user",
        "--map-root-user",
        team.python,
        str(team.code / "gpuq.py"),
        "--root",
        str(team.root),
    ]
    doctor = team.run_as(ALICE, [*as_squashed_root, "doctor"])
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    squash = [line for line in doctor.stdout.splitlines() if "squash" in line]
    assert any("FAIL" in line and "the export squashes root" in line for line in squash), doctor.stdout + doctor.stderr
    assert "no_root_squash" in doctor.stdout, doctor.stdout
    assert not list((team.root / "state").glob(".doctor-*")), "the probe must not be left behind"
    # Outside the team's group, a squashed root cannot even read jobs/: it is told why.
    denied = team.run_as(EVE, [*as_squashed_root, "status"])
    assert denied.returncode == 1 and "squashes root" in denied.stderr and "no_root_squash" in denied.stderr, denied
