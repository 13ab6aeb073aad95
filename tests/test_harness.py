"""tests/harness.py's in-process CLI behaves as a `gpuq` process would where tests rely on it:
a command that hangs fails after its timeout instead of hanging the run, what it logs reaches
its stderr, and each command is fresh (a problem of the config is told by each)."""

from __future__ import annotations

import pytest
from harness import FOREVER, Team, gpuq

from gpuq.spool import holds


def test_an_in_process_command_that_follows_for_ever_fails_after_its_timeout(tmp_path):
    team = Team(tmp_path / "root", lambda record: FOREVER)
    team.add("a", "1x80GiB")
    job = gpuq(team.root, "submit", "--gpus", "0", "--", "sleep 1000").stdout.split()[-1]
    team.run_until(lambda: team.running())
    with pytest.raises(AssertionError, match=r"still running after 1 s"):
        gpuq(team.root, "logs", "-f", job, timeout=1)


def test_what_an_in_process_command_logs_reaches_its_stderr(tmp_path, monkeypatch):
    """A request that fails is logged with its traceback (spool/applying.py); a gpuq process
    prints that on its stderr, and so does the harness, not pytest's log capture."""
    team = Team(tmp_path / "root")
    team.add("a", "1x80GiB")
    job = gpuq(team.root, "submit", "--gpus", "0", "--", "true").stdout.split()[-1]

    def broken(*args: object, **kwargs: object) -> str:
        raise KeyError("boom")

    monkeypatch.setattr(holds, "hold", broken)
    failed = gpuq(team.root, "hold", job, check=False)
    assert failed.returncode != 0 and "request" in failed.stderr and "KeyError: 'boom'" in failed.stderr


def test_each_in_process_command_tells_the_config_s_problems_again(tmp_path):
    team = Team(tmp_path / "root")
    team.add("a", "1x80GiB")
    config = team.root / "config.yaml"
    config.write_text(config.read_text() + "max_jobs_per_gpu: many\n")
    for _ in range(2):
        assert "max_jobs_per_gpu" in gpuq(team.root, "status").stderr


def test_what_a_verb_makes_of_a_signal_ends_with_it(tmp_path, monkeypatch):
    """`gpuq serve` ignores SIGCHLD for its process's lifetime: in the test process that made
    every later child's exit status 0. The harness puts each signal back as it was."""
    import signal

    from gpuq.cli import status

    def ignoring(args: object) -> int:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return 0

    team = Team(tmp_path / "root")
    monkeypatch.setattr(status, "cmd_status", ignoring)
    before = signal.getsignal(signal.SIGCHLD), signal.getsignal(signal.SIGTERM)
    gpuq(team.root, "status")
    assert (signal.getsignal(signal.SIGCHLD), signal.getsignal(signal.SIGTERM)) == before


def test_wait_prints_to_each_commands_own_stdout(tmp_path):
    """`gpuq wait` bound its output to the stdout of the first command that imported it: a
    second in-process `wait` printed into the first one's."""
    team = Team(tmp_path / "root")
    team.add("a", "1x80GiB")
    job = gpuq(team.root, "submit", "--gpus", "0", "--", "true").stdout.split()[-1]
    team.run_until(lambda: team.finished(job))
    for _ in range(2):
        assert gpuq(team.root, "wait", job).stdout == f"{job}: done (exit 0)\n"
