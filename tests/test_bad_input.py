"""Bad input gets one clear line, never a traceback, a hang or a file written (security review
M8 and its LOW list; newcomer review M3): NaN and infinity in config.yaml, ids that are not
ids, and another user's log (bookings' bad input: the bookings extra's tests). What the CLI
says of an id or a record runs in this process (tests/harness.py: the CLI's main, a box's
passes on a clock the test moves); a worker's start on a bad config and another user's log
need processes (slow)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from harness import Team, gpuq
from team import ALICE, BOB, needs_root

from conftest import PY, REPO, wait_until
from gpuq.model import config as config_mod


def _one_clear_line(proc, *needles: str) -> str:
    assert proc.returncode not in (0, None), proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    return proc.stderr


# --- config -------------------------------------------------------------------------------------


NAN_AND_INFINITY = [
    ("poll_interval", ".nan"),
    ("poll_interval", ".inf"),
    ("lost_after_s", ".nan"),
    ("grace_s", ".nan"),
    ("spec_settle_s", ".nan"),
    ("max_jobs_per_gpu", ".nan"),
    ("alert_gpu_power_w", ".inf"),
    ("time_limit", ".inf"),
]


@pytest.mark.parametrize("key, value", NAN_AND_INFINITY)
def test_config_refuses_nan_and_infinity_naming_the_file_the_key_and_the_fix(tmp_path, key, value):
    """What a worker's start refuses a config with, key by key: the ConfigError it stops on
    (worker_run.py) names config.yaml and the key and says how to fix it. The worker's own
    refusal (exit 2, one line, no traceback) is the process test's below, once."""
    path = tmp_path / "config.yaml"
    # Written as YAML itself (.nan), not through json.dumps (which writes NaN, a string to YAML).
    path.write_text(f"{key}: {value}\n")
    with pytest.raises(config_mod.ConfigError) as refused:
        config_mod.load(path)
    said = str(refused.value)
    assert "config.yaml" in said and f"'{key}'" in said and ("Fix:" in said or "write it like" in said), said
    assert len(said.splitlines()) == 1, said


@pytest.mark.slow  # the worker's start: its exit status and what it writes to stderr
def test_the_worker_refuses_nan_and_infinity_naming_the_key(queue):
    """Every value the test above sees refused ends the worker's start the same way (worker_run
    catches the ConfigError): one of them through the real worker.py."""
    key, value = NAN_AND_INFINITY[0]
    (queue.root / "config.yaml").write_text(
        f"local_dir: {json.dumps(str(queue.local_base / '{host}'))}\n{key}: {value}\n"
    )
    done = subprocess.run(
        [PY, str(REPO / "worker.py"), "--root", str(queue.root), "--host", "box", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        timeout=120,
        env=queue.env(),
    )
    err = _one_clear_line(done, "config.yaml", f"'{key}'")
    assert done.returncode == 2 and ("Fix:" in err or "write it like" in err), err


# --- ids ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "job_id",
    ["x" * 5000, "../x", "*", "../../etc/passwd", ".hidden", "ok\n", "a/b"],
    ids=["5000-chars", "dotdot", "star", "passwd", "dotfile", "newline", "slash"],
)
@pytest.mark.parametrize("verb", [["show"], ["show", "--json"], ["logs"], ["logs", "-f"]], ids=" ".join)
def test_show_and_logs_say_what_is_not_a_job_id(tmp_path, job_id, verb):
    root = Team(tmp_path / "root").root  # a queue root with no box: the verbs read the spool only
    done = gpuq(root, verb[0], job_id, *verb[1:], check=False)
    err = _one_clear_line(done, "is not a job id")
    assert len(err.splitlines()) == 1 and len(err) < 300, err  # one line, not the 5,000 characters


@pytest.mark.parametrize("left", ["", '{"id": "torn'], ids=["empty", "torn"])
def test_show_of_a_record_a_power_cut_emptied_says_so(tmp_path, left: str):
    """A start's running record is synced by its supervisor, not by the worker: a power cut
    before that can leave it empty until the box's worker starts again. `show` said it with a
    JSONDecodeError traceback."""
    root = Team(tmp_path / "root").root
    running = root / "state" / "running"
    running.mkdir(parents=True, exist_ok=True)
    (running / "cut.json").write_text(left)
    for extra in ([], ["--json"]):
        done = gpuq(root, "show", "cut", *extra, check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert "state/running/cut.json is not a record" in done.stdout and "power cut" in done.stdout, done.stdout


def test_status_and_show_pass_over_a_finished_record_that_is_torn(tmp_path):
    """One bad file never crashes status: a finished record that does not parse was a
    RecordError traceback for every member, and for `show` of a job of the same name (it
    reads their peaks)."""
    team = Team(tmp_path / "root")
    team.add("a", "1x80GiB")
    for _ in range(2):
        gpuq(team.root, "submit", "--name", "torn", "--gpus", "0", "--", "true")
    team.run_until(lambda: team.finished("torn-1") and team.finished("torn-2"))
    (team.root / "state" / "finished" / "torn-1.json").write_text('{"id": "torn-1", "state": "done", "host": "-x"')
    for command in (["status"], ["status", "--json"], ["show", "torn-2"]):
        done = gpuq(team.root, *command, check=False)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert "torn-" in done.stdout


# --- another user's log -------------------------------------------------------------------------


@needs_root  # (the team fixture marks it slow: a worker and members' CLIs)
def test_logs_of_another_users_job_says_whose_it_is(team):
    team.start_worker("box", "1x80GiB")
    team.drop_as(ALICE, "private.yaml", "command: echo hello-from-alice\ngpus: 0\n")
    wait_until(lambda: team.finished("private"), timeout=60, what="alice's job to end")
    log = team.root / "logs" / "private.log"
    assert "hello-from-alice" in team.as_user(ALICE, "logs", "private").stdout
    # Whatever mode the queue gives logs, their owner may keep one to themselves.
    assert team.run_as(ALICE, ["chmod", "600", str(log)]).returncode == 0
    for follow in ([], ["-f"]):
        done = team.as_user(BOB, "logs", "private", *follow)
        err = _one_clear_line(done, f"private's log is {ALICE}'s (mode 0600); ask them or an admin")
        assert len(err.splitlines()) == 1, err
        assert "hello-from-alice" not in done.stdout
    assert os.stat(log).st_mode & 0o777 == 0o600


def test_a_low_job_asking_a_grace_over_ten_minutes_is_refused_by_submit_and_held_to_it_in_the_queue(tmp_path):
    """Through the CLI and the worker: `gpuq submit` names the option and the fix, and writes
    nothing; a spec already in jobs/ (dropped there, or put back after a preemption: a review
    found the refusal sent such a job to rejected/, its place lost) runs, its grace ten minutes."""
    from harness import PassWorker

    box = PassWorker(tmp_path / "root")
    done = gpuq(box.root, "submit", "--priority", "low", "--grace", "1d", "--", "true", check=False)
    assert done.returncode != 0, done
    assert "--grace: 1d is longer than an opportunistic job may take to yield (10m)" in done.stderr
    assert list((box.root / "jobs").iterdir()) == []
    box.drop("huge.yaml", "command: 'true'\npriority: low\ngrace: 1d\n")
    for _ in range(8):  # a low job starts once its GPU has been idle a while
        box.run_pass(after_s=10)
    (launched,) = box.spawner.launched
    assert launched.id == "huge" and launched.spec["grace_s"] == 600
