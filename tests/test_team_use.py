"""Everyday use of a team root (`gpuq init DIR --group TEAM`, a root worker), as findings of
the 2026-11-30 reviews found it broken: `gpuq show` of a job whose spec never parsed (security
L2), a user outside the team group (L4), and teammates reading each other's logs (L5,
newcomer M3)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

from conftest import PY, REPO, wait_until
from team import ALICE, BOB, EVE, needs_root, team_gid

pytestmark = needs_root


# --- L2: show works for any record ------------------------------------------------------------


def test_show_of_a_job_cancelled_while_its_spec_did_not_parse(team):
    """A pending spec that does not parse, cancelled by root: its record has an empty spec;
    show (text and --json) says what is known instead of a KeyError."""
    team.drop_as(ALICE, "broken.yaml", "command: [echo, unclosed\ngpus: 0\n")
    done = team.gpuq("cancel", "broken", check=False)
    assert done.returncode == 0, done.stderr
    assert team.finished("broken")["spec"] == {}  # the case under test: nothing parsed
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
