"""Everyday use of a team root (`gpuq init DIR --group TEAM`, a root worker), as findings of
the 2026-11-30 reviews found it broken: `gpuq show` of a job whose spec never parsed (security
L2), a user outside the team group (L4), and teammates reading each other's logs (L5,
newcomer M3)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from team import ALICE, BOB, EVE, needs_root, team_gid

from conftest import PY, REPO, wait_until

pytestmark = needs_root


# --- L2: show works for any record ------------------------------------------------------------


def test_show_of_a_job_cancelled_while_its_spec_did_not_parse(team):
    """A pending spec that does not parse, cancelled by root: its record has an empty spec;
    show (text and --json) says what is known instead of a KeyError. The record says root
    cancelled it (root's gpuq acts as the queue's account: it said that account's name)."""
    team.drop_as(ALICE, "broken.yaml", "command: [echo, unclosed\ngpus: 0\n")
    done = team.gpuq("cancel", "broken", check=False)
    assert done.returncode == 0, done.stderr
    assert team.finished("broken")["spec"] == {}  # the case under test: nothing parsed
    assert team.finished("broken")["reason"] == "cancelled by root while pending", team.finished("broken")["reason"]
    for who in (None, ALICE, BOB):
        shown = team.gpuq("show", "broken", check=False) if who is None else team.as_user(who, "show", "broken")
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert "cancelled" in shown.stdout and "broken" in shown.stdout
        assert "did not parse" in shown.stdout, shown.stdout
        as_json = (
            team.gpuq("show", "broken", "--json", check=False)
            if who is None
            else team.as_user(who, "show", "broken", "--json")
        )
        assert as_json.returncode == 0, as_json.stderr
        job = json.loads(as_json.stdout)
        assert (job["id"], job["state"], job["user"]) == ("broken", "cancelled", ALICE)
        assert job["spec"] == {} and "did not parse" in job["spec_note"]


# --- L4: someone outside the team group -------------------------------------------------------


def test_a_user_outside_the_group_gets_one_line_from_every_verb(team):
    fix = ": permission denied. Fix: ask the root's owner to add you to its group (docs/security.md)"
    for args in (("status",), ("show", "x"), ("logs", "x"), ("submit", "--gpus", "0", "--", "true"), ("cancel", "x")):
        done = team.as_user(EVE, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and "Traceback" not in done.stderr, (args, done.stderr)  # refused
        assert len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith(f"gpuq {args[0]}: cannot read {team.root}") and lines[0].endswith(fix), (
            args,
            lines[0],
        )
    assert not list((team.root / "jobs").iterdir())  # and nothing was submitted


# --- L5: the team reads its logs --------------------------------------------------------------


def test_a_teammates_log_is_the_teams_to_read(team):
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "al.yaml", "command: echo hello-from-alice\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("al"), what="alice's job to finish")
    st = os.stat(team.root / "logs" / "al.log")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (team.users[ALICE].pw_uid, team_gid(), 0o640)
    read = team.as_user(BOB, "logs", "al")
    assert read.returncode == 0 and "hello-from-alice" in read.stdout, read.stderr
    assert team.as_user(EVE, "logs", "al").returncode == 1  # outside the group: refused, not hers to read


def _open_log_in(logs: Path, uid: int) -> os.stat_result:
    """What a supervisor (and a Slurm bridge) of root's own queue does for a job of `uid` (in a
    team root the queue's account makes it, and the root part gives it, keeping its group)."""
    code = (
        "import os; from pathlib import Path\n"
        "from gpuq.run.launch import prepare_log; from gpuq.host.owners import Identity\n"
        f"prepare_log(Path({str(logs / 'j.log')!r}), Identity.of({uid}), None)\n"
    )
    done = subprocess.run([PY, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return os.stat(logs / "j.log")


def test_a_log_in_a_team_roots_logs_keeps_the_team_group(team):
    """The supervisor's and the bridge's one way of creating a log, straight in a team root
    (the queue's account's own worker is tested above)."""
    alice = team.users[ALICE]
    st = _open_log_in(team.root / "logs", alice.pw_uid)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (alice.pw_uid, team_gid(), 0o640)


def test_a_private_roots_log_keeps_the_owners_group(users):
    """No group (plain `gpuq init DIR`, logs/ not setgid): the owner's primary group, as before."""
    alice = users[ALICE]
    base = Path(tempfile.mkdtemp(prefix="gpuq-private-"))
    try:
        subprocess.run([PY, str(REPO / "gpuq.py"), "init", str(base / "root")], check=True, capture_output=True)
        assert not os.stat(base / "root" / "logs").st_mode & stat.S_ISGID
        st = _open_log_in(base / "root" / "logs", alice.pw_uid)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (alice.pw_uid, alice.pw_gid, 0o640)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=True)


# --- fair share from usage (issue: a plan that knows time) ----------------------------------------


def test_fair_share_ranks_by_what_each_member_ran_not_only_what_they_hold_now(team):
    """alice ran 20 GPU-hours yesterday (an event log of a box since retired says so); bob
    holds the one GPU now. When it frees, bob's next job goes before alice's, though hers came
    first: usage decayed over a week outweighs one GPU held now (before, only what each held
    now counted, and alice's went first). `status --shares` shows why."""
    import pwd as _pwd

    from team import QUEUE

    day = 86400.0
    now = __import__("time").time()
    history = team.root / "state" / "events" / "retired-box.jsonl"
    event = {"t": now - day, "by": "retired-box", "job": "old-run", "from": "running", "to": "done", "user": ALICE}
    event.update({"host": "retired-box", "gpus": [0, 1], "started_at": now - 11 * 3600 - day, "ended_at": now - day})
    history.write_text(json.dumps(event) + "\n")
    os.chown(history, _pwd.getpwnam(QUEUE).pw_uid, team_gid())
    team.start_worker("a", "1x80GiB")
    go = team.root / "go"  # bob's blocker holds the GPU until the queue's order has been seen
    team.drop_as(BOB, "blocker.yaml", f"command: while [ ! -e {go} ]; do sleep 0.1; done\ngpus: 1\n")
    wait_until(lambda: (team.record("blocker") or {}).get("state") == "running", what="bob's blocker to run")
    team.drop_as(ALICE, "a-next.yaml", "command: 'true'\ngpus: 1\n")
    wait_until(lambda: any(p["id"] == "a-next" for p in team.status()["pending"]), what="alice's job to be queued")
    team.drop_as(BOB, "b-next.yaml", "command: sleep 1\ngpus: 1\n")
    wait_until(lambda: len(team.status()["pending"]) == 2, what="both jobs to be queued")
    shares = team.as_user(ALICE, "status", "--shares")
    assert shares.returncode == 0, shares.stderr
    assert "FAIR SHARE" in shares.stdout, shares.stdout
    order = [line.split()[1] for line in shares.stdout.splitlines() if line.strip()[:2] in ("1 ", "2 ")]
    assert order == ["b-next", "a-next"], shares.stdout
    rows = {r["user"]: r for r in team.status()["fair_share"]}
    assert rows[BOB]["factor"] > rows[ALICE]["factor"] and rows[ALICE]["usage_gpu_h"] > 15, rows
    go.touch()
    a = wait_until(lambda: team.finished("a-next"), timeout=60, what="alice's job to run")
    b = team.finished("b-next")
    assert b is not None and b["claimed_at"] < a["claimed_at"], (a, b)
    # The worker's usage file for status is no heartbeat (a review saw it read as one: a warning
    # at every start, and a false alert of a silent worker).
    assert (team.root / "state" / "workers" / "a.usage").exists()
    assert "left out of the plan" not in (team.root / "logs" / "workers" / "a.log").read_text()


def test_a_cron_started_worker_the_queues_account_cannot_run_says_why_and_exits_2(team, tmp_path):
    """cron's line named gpuq's code under a directory only root may enter: the worker (as the
    queue's account) could not load it, and the cron-started process, already a daemon with
    its stderr nowhere, exited 0 with no word anywhere, every minute. It now tries the start
    first, as that account, and says why on stderr (cron mails it), exit 2."""
    hidden = Path(tempfile.mkdtemp(prefix="gpuq-root-only-"))  # 0700, root's
    try:
        code = hidden / "code"
        shutil.copytree(team.code, code)
        done = subprocess.run(
            [team.python, str(code / "worker.py"), "--root", str(team.root), "--host", "hid", "--fake-gpus", "1x24GiB"],
            capture_output=True,
            text=True,
            timeout=300,
            env={"PATH": "/usr/bin:/bin"},  # as cron's
        )
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert "cannot start the worker: the queue's account" in done.stderr and "Fix: install gpuq" in done.stderr
        assert not (team.root / "state" / "workers" / "hid.json").exists()
    finally:
        shutil.rmtree(hidden, ignore_errors=True)


def test_submit_warns_of_a_workdir_the_member_may_not_enter_as_such(team):
    """-D of a teammate's private directory warned "is not a directory here": it is one, which
    the submitter may not enter (the job then failed, rightly, as not accessible to them)."""
    private = Path(tempfile.mkdtemp(prefix="gpuq-bobs-"))
    try:
        (private / "proj").mkdir()
        os.chown(private, team.users[BOB].pw_uid, -1)
        os.chmod(private, 0o700)
        done = team.as_user(ALICE, "submit", "--gpus", "0", "-D", str(private / "proj"), "--", "ls")
        assert done.returncode == 0, done.stderr
        assert f"--workdir {private / 'proj'} is behind a directory you may not enter" in done.stderr, done.stderr
        assert "not a directory here" not in done.stderr
    finally:
        shutil.rmtree(private, ignore_errors=True)


def test_submit_under_a_teammates_id_says_whose_it_is_not_to_retry_it(team):
    """`submit --id` of a teammate's id told the member to `gpuq retry` it, which only its
    owner may; it now says whose it is. Her own ended id still suggests retry."""
    team.drop_as(BOB, "shared-1.yaml", "command: 'true'\ngpus: 0\nworkdir: /\n")
    done = team.as_user(ALICE, "submit", "--gpus", "0", "--id", "shared-1", "--", "true")
    assert done.returncode != 0 and f"job id 'shared-1' is {BOB}'s job. Fix: pick another --id" in done.stderr, done
    assert "retry" not in done.stderr
    team.drop_as(ALICE, "mine-1.yaml", "command: 'true'\ngpus: 0\nworkdir: /\n")
    again = team.as_user(ALICE, "submit", "--gpus", "0", "--id", "mine-1", "--", "true")
    assert again.returncode != 0 and "gpuq retry mine-1" in again.stderr, again.stderr


def test_an_edit_that_ends_before_its_hold_is_answered_leaves_the_job_unheld(team):
    """The hold `gpuq edit` asks for may be applied after the edit has ended (a hang-up while
    it waited for the reply; here no worker runs to answer): the job was then held "being
    edited" for good. The edit now sends the release after it, and the worker applies both."""
    team.drop_as(ALICE, "ed.yaml", "command: 'true'\ngpus: 0\nworkdir: /\n")
    done = team.as_user(ALICE, "edit", "ed", env={"EDITOR": "true"})
    assert done.returncode == 3 and "no worker is running" in done.stderr, done.stderr
    team.start_worker("a", "1x80GiB")
    record = wait_until(lambda: team.finished("ed"), what="ed to run")
    assert record["state"] == "done" and not (team.root / "state" / "held" / "ed.yaml").exists()
