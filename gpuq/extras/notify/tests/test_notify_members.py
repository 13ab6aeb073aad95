"""The notify extra in a team's queue (created members; CI runs as root): the root worker's
root part runs the deliverer as the job's owner, which reads only that member's own
~/.config/gpuq/notify.yaml; a member cannot send a delivery to another member's destination
(a link to their file is refused), nor make root or the queue's account run anything."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from receiver import Receiver
from team import TAG, TEAM, team_gid

from conftest import wait_until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("useradd"),
        reason="creating users needs root and useradd (CI runs as root)",
    ),
    pytest.mark.slow,
]


# Members with homes of their own, made for each test: the session's alice and bob have none,
# and giving them one (usermod -d) would change what tests beside these (in other workers, or a
# copy of the suite) read from the passwd file.
HOMED = (f"gqt-na-{TAG}", f"gqt-nb-{TAG}")


@pytest.fixture
def homed(users) -> Iterator[dict[str, Path]]:
    """Two members of the team group, each with a home of their own (theirs, 0755); removed
    afterwards."""
    base = Path(tempfile.mkdtemp(prefix="gpuq-homes-"))
    os.chmod(base, 0o755)
    homes: dict[str, Path] = {}
    try:
        for name in HOMED:
            home = base / name
            add = ["useradd", "-M", "-d", str(home), "-G", TEAM, "-s", "/bin/sh", name]
            subprocess.run(add, check=True, capture_output=True)
            homes[name] = home
            (home / ".config" / "gpuq").mkdir(parents=True)
            pw = pwd.getpwnam(name)
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(home)], check=True)
        yield homes
    finally:
        for name in homes:  # (userdel refuses a user with a process left: a deliverer still ending)
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
            wait_until(lambda name=name: subprocess.run(["userdel", name], capture_output=True).returncode in (0, 6))
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def members(team, homed) -> tuple[str, str]:
    """The homed members, known to this test's team (its own mapping: the session's stays)."""
    team.users = {**team.users, **{name: pwd.getpwnam(name) for name in homed}}
    return HOMED


def _write_as(team, name: str, path: Path, text: str) -> None:
    done = team.py_as(name, f"open({str(path)!r}, 'w').write({text!r})")
    assert done.returncode == 0, done.stderr


def _spec(notify: str) -> str:
    return f"command: 'true'\ngpus: 1\ngpu_mem: 1GiB\nworkdir: /tmp\nnotify: {notify}\n"


def _log(team) -> str:
    path = team.root / "logs" / "workers" / "a.log"
    return path.read_text() if path.exists() else ""


def test_the_deliverer_runs_as_the_jobs_owner_with_only_their_own_file(team, members, homed):
    alice, _ = members
    homes = homed
    receiver = Receiver()
    try:
        out = homes[alice] / "out"
        _write_as(
            team,
            alice,
            homes[alice] / ".config" / "gpuq" / "notify.yaml",
            f"webhook: {receiver.url}\ncommand: id -u > {out}; echo $HOME $USER >> {out}\n",
        )
        team.start_worker("a", "1x24GiB")
        team.drop_as(alice, "hers.yaml", _spec("end"))
        wait_until(lambda: receiver.of("hers"), timeout=60, what="alice's POST")
        said = wait_until(lambda: out.exists() and len(out.read_text().split()) == 3 and out.read_text(), timeout=60)
        uid, home, user = said.split()
        assert int(uid) == team.users[alice].pw_uid and home == str(homes[alice]) and user == alice
        assert os.stat(out).st_uid == team.users[alice].pw_uid
        assert receiver.of("hers")[0]["job"]["user"] == alice
        starter = psutil.Process(team.workers["a"].pid)  # it reaps the deliverer: no zombie stays
        wait_until(lambda: not [c for c in starter.children() if c.status() == psutil.STATUS_ZOMBIE])
    finally:
        receiver.close()


def test_a_member_cannot_send_to_another_members_destination(team, members, homed):
    """bob's notify.yaml is a link to alice's (which is readable): bob's deliverer, as bob,
    refuses it; alice's receiver hears only of alice's own job."""
    alice, bob = members
    homes = homed
    receiver = Receiver()
    try:
        hers = homes[alice] / ".config" / "gpuq" / "notify.yaml"
        _write_as(team, alice, hers, f"webhook: {receiver.url}\n")
        os.chmod(hers, 0o644)
        linked = team.py_as(
            bob, f"import os; os.symlink({str(hers)!r}, {str(homes[bob] / '.config/gpuq/notify.yaml')!r})"
        )
        assert linked.returncode == 0, linked.stderr
        team.start_worker("a", "1x24GiB")
        team.drop_as(bob, "his.yaml", _spec("end"))
        log = wait_until(lambda: "error job his end" in (t := _log(team)) and t, timeout=60, what="bob's refusal")
        assert "is a symbolic link" in log
        team.drop_as(alice, "hers.yaml", _spec("end"))
        wait_until(lambda: receiver.of("hers"), timeout=60, what="alice's own POST")
        assert receiver.of("his") == [] and len(receiver.bodies) == 1
    finally:
        receiver.close()


def _group_writable_state(team, name: str, home: Path) -> Path:
    """~/.local/state as a member's own tools leave it under umask 002 with the team as its
    group (HPC sites with a shared primary group): group-writable, as .config/gpuq may not be."""
    state = home / ".local" / "state"
    made = team.py_as(name, f"import os; os.makedirs({str(state)!r}); os.chmod({str(state)!r}, 0o2775)")
    assert made.returncode == 0, made.stderr
    os.chown(state, team.users[name].pw_uid, team_gid())
    return state


@pytest.mark.parametrize("plant", ["file", "link"])
def test_another_member_can_neither_suppress_a_members_messages_nor_delete_their_files(team, members, homed, plant):
    """alice plants ~bob/.local/state/gpuq (bob's state folder is group-writable): a plain
    file where the marks folder goes, or a link from it to bob's own data. bob's message is
    still sent, and no file of bob's outside the marks folder is removed."""
    alice, bob = members
    receiver = Receiver()
    try:
        _write_as(team, bob, homed[bob] / ".config" / "gpuq" / "notify.yaml", f"webhook: {receiver.url}\n")
        state = _group_writable_state(team, bob, homed[bob])
        data = homed[bob] / "data"
        kept = str(data / "results-2025.csv")
        code = f"import os; os.makedirs({str(data)!r}); open({kept!r}, 'w').write('x'); os.utime({kept!r}, (1e9, 1e9))"
        assert team.py_as(bob, code).returncode == 0
        sent = state / "gpuq" / "notify-sent"
        code = f"import os; os.mkdir({str(state / 'gpuq')!r}); os.chmod({str(state / 'gpuq')!r}, 0o755)\n"
        code += f"open({str(sent)!r}, 'w').close()" if plant == "file" else f"os.symlink({str(data)!r}, {str(sent)!r})"
        planted = team.py_as(alice, code)
        assert planted.returncode == 0, planted.stderr
        team.start_worker("a", "1x24GiB")
        team.drop_as(bob, "his.yaml", _spec("end"))
        wait_until(lambda: "job his end" in _log(team), timeout=60, what="bob's delivery")
        wait_until(lambda: receiver.of("his") or "before" in _log(team), timeout=20, what="bob's POST")
        assert receiver.of("his"), [line for line in _log(team).splitlines() if "notify" in line]
        assert (data / "results-2025.csv").exists(), "bob's deliverer removed bob's own file"
    finally:
        receiver.close()
