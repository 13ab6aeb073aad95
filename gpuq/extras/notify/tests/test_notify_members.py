"""The notify extra in a team's queue (created members; CI runs as root): the root worker's
root part runs the deliverer as the job's owner, which reads only that member's own
~/.config/gpuq/notify.yaml; a member cannot send a delivery to another member's destination
(a link to their file is refused), nor make root or the queue's account run anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from receiver import Receiver
from team import ALICE, BOB

from conftest import wait_until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("useradd"),
        reason="creating users needs root and useradd (CI runs as root)",
    ),
    pytest.mark.slow,
]


@contextmanager
def _homes(team, names: list[str]):
    """Each member a home of their own under the team's folder for the test (theirs, 0755),
    their passwd entry's home set back afterwards."""
    homes = {}
    try:
        for name in names:
            pw = team.users[name]
            home = team.base / f"home-{name}"
            (home / ".config" / "gpuq").mkdir(parents=True)
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(home)], check=True)
            subprocess.run(["usermod", "-d", str(home), name], check=True, capture_output=True)
            homes[name] = home
        yield homes
    finally:
        for name in homes:
            subprocess.run(["usermod", "-d", f"/nonexistent/{name}", name], capture_output=True)


def _write_as(team, name: str, path: Path, text: str) -> None:
    done = team.py_as(name, f"open({str(path)!r}, 'w').write({text!r})")
    assert done.returncode == 0, done.stderr


def _spec(notify: str) -> str:
    return f"command: 'true'\ngpus: 1\ngpu_mem: 1GiB\nworkdir: /tmp\nnotify: {notify}\n"


def _log(team) -> str:
    path = team.root / "logs" / "workers" / "a.log"
    return path.read_text() if path.exists() else ""


def test_the_deliverer_runs_as_the_jobs_owner_with_only_their_own_file(team):
    receiver = Receiver()
    try:
        with _homes(team, [ALICE]) as homes:
            out = homes[ALICE] / "out"
            _write_as(
                team,
                ALICE,
                homes[ALICE] / ".config" / "gpuq" / "notify.yaml",
                f"webhook: {receiver.url}\ncommand: id -u > {out}; echo $HOME $USER >> {out}\n",
            )
            team.start_worker("a", "1x24GiB")
            team.drop_as(ALICE, "hers.yaml", _spec("end"))
            wait_until(lambda: receiver.of("hers"), timeout=60, what="alice's POST")
            said = wait_until(
                lambda: out.exists() and len(out.read_text().split()) == 3 and out.read_text(), timeout=60
            )
            uid, home, user = said.split()
            assert int(uid) == team.users[ALICE].pw_uid and home == str(homes[ALICE]) and user == ALICE
            assert os.stat(out).st_uid == team.users[ALICE].pw_uid
            assert receiver.of("hers")[0]["job"]["user"] == ALICE
            starter = psutil.Process(team.workers["a"].pid)  # it reaps the deliverer: no zombie stays
            wait_until(lambda: not [c for c in starter.children() if c.status() == psutil.STATUS_ZOMBIE])
    finally:
        receiver.close()


def test_a_member_cannot_send_to_another_members_destination(team):
    """bob's notify.yaml is a link to alice's (which is readable): bob's deliverer, as bob,
    refuses it; alice's receiver hears only of alice's own job."""
    receiver = Receiver()
    try:
        with _homes(team, [ALICE, BOB]) as homes:
            hers = homes[ALICE] / ".config" / "gpuq" / "notify.yaml"
            _write_as(team, ALICE, hers, f"webhook: {receiver.url}\n")
            os.chmod(hers, 0o644)
            linked = team.py_as(
                BOB, f"import os; os.symlink({str(hers)!r}, {str(homes[BOB] / '.config/gpuq/notify.yaml')!r})"
            )
            assert linked.returncode == 0, linked.stderr
            team.start_worker("a", "1x24GiB")
            team.drop_as(BOB, "his.yaml", _spec("end"))
            log = wait_until(lambda: "error job his end" in (t := _log(team)) and t, timeout=60, what="bob's refusal")
            assert "is a symbolic link" in log
            team.drop_as(ALICE, "hers.yaml", _spec("end"))
            wait_until(lambda: receiver.of("hers"), timeout=60, what="alice's own POST")
            assert receiver.of("his") == [] and len(receiver.bodies) == 1
    finally:
        receiver.close()
