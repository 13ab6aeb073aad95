"""A member against the ids of another member's jobs (found by two attack reviews): a file bob
drops into jobs/ under the id of alice's job is not her job, whatever he does with it before
a pass refuses it, and nothing of hers (pending, claimed, ended, on its way back) is his to
take, not even through a file of his refused under its id; and a sweep too big to write is
refused before the worker writes any of it."""

from __future__ import annotations

import os
import signal
import tempfile

import pytest
import yaml
from team import ALICE, BOB, needs_root

from conftest import wait_until
from gpuq.host.faults import CRASH_ENV

pytestmark = [needs_root, pytest.mark.slow]
WHO_RAN = "command: id -un\ngpus: 1\nworkdir: /\n"
BUSY = "command: sleep 300\ngpus: 1\nworkdir: /\n"


def _drop_and_ask(team, job_id: str, verb: str) -> tuple[int, str]:
    """bob drops jobs/<id>.yml and at once sends `gpuq VERB ID`: the worker's next pass applies
    requests before it looks at jobs/, so his request meets his file still there."""
    jobs = str(team.root / "jobs")
    code = (
        "import os, subprocess\n"
        f"tmp = os.path.join({jobs!r}, '.x.tmp')\n"
        "open(tmp, 'w').write('command: echo bobs\\ngpus: 0\\nworkdir: /\\n')\n"
        f"os.rename(tmp, os.path.join({jobs!r}, {job_id + '.yml'!r}))\n"
        f"r = subprocess.run([{team.python!r}, {str(team.code / 'gpuq.py')!r}, '--root', {str(team.root)!r},"
        f" {verb!r}, {job_id!r}], capture_output=True, text=True)\n"
        "print(r.returncode, r.stdout, r.stderr)\n"
    )
    done = team.py_as(BOB, code)
    code_, _, said = done.stdout.partition(" ")
    return int(code_), said


def _alice_pending(team, job_id: str) -> None:
    """alice's job `job_id` waits in the queue: the box's only GPU runs her `busy` job."""
    team.start_worker("a", "1x24GiB")
    team.drop_as(ALICE, "busy.yaml", BUSY)
    wait_until(lambda: (team.record("busy") or {}).get("state") == "running", timeout=60, what="busy to run")
    team.drop_as(ALICE, f"{job_id}.yaml", WHO_RAN)
    wait_until(lambda: job_id in [p["id"] for p in team.status()["pending"]], what=f"{job_id} pending")


@pytest.mark.parametrize("verb", ["cancel", "hold"])
def test_a_members_file_under_a_pending_jobs_id_is_not_that_job(team, verb):
    """bob's x.yml beside alice's pending x.yaml, cancelled (or held) before a pass refused it:
    the worker cancelled his file and recorded x cancelled, as his; alice's cancel then said
    "already ended", her job vanished from status while it ran, and once a worker looked at
    jobs/ afresh her spec was refused as an earlier job's id and lost. His request is refused
    as for her job, nothing is recorded under x, and her job stays hers."""
    _alice_pending(team, "x")
    for _ in range(3):  # each try refused; his file then goes to rejected/
        code, said = _drop_and_ask(team, "x", verb)
        assert code == 1 and f"x: belongs to {ALICE}" in said, said
        assert team.finished("x") is None and not (team.root / "state" / "held" / "x.yaml").exists()
        wait_until(lambda: not (team.root / "jobs" / "x.yml").exists(), what="bob's x.yml refused")
    team.stop_worker("a", signal.SIGKILL)  # a fresh look at jobs/ (cron's next start, another box)
    team.start_worker("a", "1x24GiB")
    team.wait_passes("a")
    assert (team.root / "jobs" / "x.yaml").exists()
    done = team.as_user(ALICE, verb, "x")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_members_cancel_under_the_id_of_a_job_a_dead_box_claimed(team):
    """Box a died right after claiming alice's `al`; bob dropped al.yml and cancelled it at once:
    a cancelled record of his under her id, and then `gpuq forget a` deleted her claim (a claim
    beside a finished record) and her job was nowhere. His cancel is refused; forget puts her
    job back and it runs, as her."""
    team.write_config(lost_after_s=5, grace_s=1)
    a = team.start_worker("a", "1x24GiB", env={CRASH_ENV: "worker:claimed"})
    team.drop_as(ALICE, "al.yaml", WHO_RAN)
    a.wait(timeout=60)
    assert a.returncode == -signal.SIGKILL
    team.start_worker("b", "1x24GiB")
    plain = team.as_user(BOB, "cancel", "al")  # her claimed job, no file of his (or his refused already)
    assert plain.returncode == 1 and f"al: belongs to {ALICE}" in plain.stderr, plain.stdout + plain.stderr
    hers = team.as_user(ALICE, "cancel", "al")
    assert hers.returncode == 1 and "claimed by a but not started" in hers.stderr and "gpuq forget a" in hers.stderr
    code, said = _drop_and_ask(team, "al", "cancel")
    assert code == 1 and f"al: belongs to {ALICE}" in said, said
    assert team.finished("al") is None
    wait_until(lambda: team.gpuq("forget", "a", check=False).returncode == 0, timeout=60, what="a forgotten")
    final = wait_until(lambda: team.finished("al"), timeout=60, what="al to run on b")
    assert (final["state"], final["user"], final["host"]) == ("done", ALICE, "b"), final
    assert team.log("al").splitlines().count(ALICE) == 1


def test_a_members_unfinished_file_never_blocks_the_retry_of_an_ended_job(team):
    """alice's job ended; bob kept jobs/af.yaml unfinished (never settling), and every `gpuq
    retry af` of hers said jobs/ held a file with that id. An id with a record is held for its
    owner: his file is refused at once, and her retry works."""
    team.write_config(spec_settle_s=600)
    team.start_worker("a", "1x24GiB")
    team.drop_as(ALICE, "af.yaml", "command: 'false'\ngpus: 0\nworkdir: /\n")
    assert wait_until(lambda: team.finished("af"), timeout=60, what="af to end")["state"] == "failed"
    team.drop_as(BOB, "af.yaml", "command: [never closed\n")
    wait_until(lambda: f"job id 'af' belongs to {ALICE}'s job" in team.refusals("af"), what="bob's af.yaml refused")
    done = team.as_user(ALICE, "retry", "af")
    assert done.returncode == 0 and "attempt 2" in done.stdout, done.stdout + done.stderr


def _refused_under(team, job_id: str) -> None:
    """bob gets a file of his refused under `job_id` at the next pass (others may write it)."""
    team.drop_as(BOB, f"{job_id}.yml", "command: id -un\ngpus: 0\nworkdir: /\n", mode=0o666)
    wait_until(lambda: "can be changed by other users" in team.refusals(job_id), what=f"bob's {job_id}.yml refused")


def test_a_refused_file_holds_no_id(team):
    """A refused spec held its id for its owner for a while (so that no one took the id of
    alice's refused spec): bob got a file refused under the id of her ended job, and her retry
    was refused as his once her record moved aside; so were her released job and the members
    of her array and sweep whose ids he had been refused under. A refused file holds no id."""
    team.write_config(spec_settle_s=0.5)
    team.start_worker("a", "1x24GiB")
    team.drop_as(ALICE, "x.yaml", "command: id -un\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("x"), timeout=60, what="x to end")
    _refused_under(team, "x")
    retried = team.as_user(ALICE, "retry", "x")
    assert retried.returncode == 0, retried.stderr
    final = wait_until(lambda: (team.finished("x") or {}).get("attempt") == 2 and team.finished("x"), what="x again")
    assert (final["state"], final["user"]) == ("done", ALICE), final
    for member in ("arr_1", "sw_s2"):
        _refused_under(team, member)
    assert (
        team.as_user(ALICE, "submit", "--id", "arr", "--array", "0-2", "--gpus", "0", "--", "id", "-un").returncode == 0
    )
    team.drop_as(ALICE, "sw.yaml", "command: 'echo {s}; id -un'\ngpus: 0\nworkdir: /\nsweep: {s: [1, 2]}\n")
    for member in ("arr_0", "arr_1", "arr_2", "sw_s1", "sw_s2"):
        done = wait_until(lambda m=member: team.finished(m), timeout=60, what=member)
        assert (done["state"], done["user"]) == ("done", ALICE), done


def test_a_sweep_too_big_to_write_is_refused_before_anything_is_written(team):
    """bob's 240 KB sweep of 1,000 members whose command repeats a placeholder 75,000 times: the
    worker wrote 750 MB of members into jobs/ as root, its heartbeat stood still for 218 s, and
    another box took it for dead and restarted alice's running job there. It is refused on
    the spot, naming the field, and alice's job runs on, once."""
    team.start_worker("a", "1x24GiB")
    team.drop_as(ALICE, "long.yaml", "command: id -un; sleep 2\ngpus: 1\nworkdir: /\n")
    wait_until(lambda: team.record("long"), timeout=60, what="alice's job to start")
    values = [f"v{i:07d}xx" for i in range(1000)]
    huge = yaml.safe_dump({"command": "echo " + "{a}" * 75000, "gpus": 0, "workdir": "/", "sweep": {"a": values}})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir="/tmp") as src:  # too long for a command line
        src.write(huge)
        src.flush()
        os.chmod(src.name, 0o644)
        jobs = str(team.root / "jobs")
        copy = f"import os, shutil; t = {jobs!r} + '/.amp.tmp'; shutil.copy({src.name!r}, t)\n"
        copy += f"os.rename(t, {jobs!r} + '/amp.yaml')"
        assert team.py_as(BOB, copy).returncode == 0
    error = wait_until(lambda: (team.root / "state" / "rejected" / "amp.error").exists(), what="the sweep refused")
    assert error
    text = (team.root / "state" / "rejected" / "amp.error").read_text()
    assert "field 'sweep'" in text and "over the 4 MiB a sweep or array may write" in text, text
    assert not any(n.startswith("amp_") for n in os.listdir(team.root / "jobs"))
    assert not (team.root / "state" / "groups" / "amp.json").exists()
    final = wait_until(lambda: team.finished("long"), timeout=60, what="alice's job to end")
    assert (final["state"], final["attempt"]) == ("done", 1), final
