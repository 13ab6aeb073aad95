"""`gpuq run` and `gpuq shell` through the real CLI and worker on fake GPUs: a command attached
to the caller's terminal (pipes, or a pseudo-terminal), its exit status the CLI's; waiting with
its reason and Ctrl-C cancelling; limits; the idle release; the CLI going away; a box with no
GPU that fits; and a member's session, under a root worker, as that member."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest
from team import ALICE, BOB

from conftest import fake_job, wait_until
from gpuq.single_instance import this_host

pytestmark = pytest.mark.slow  # every test here starts processes

HOST = this_host()  # a session runs on the box it is typed on: the worker is this box's


@pytest.fixture(autouse=True)
def _own_socket_directory(monkeypatch):
    """gpuq run's socket directory ($XDG_RUNTIME_DIR/gpuq) the test's own, removed after: a
    run a test kills leaves its socket behind, and root's /tmp/gpuq-0 gathered them."""
    runtime = tempfile.mkdtemp(prefix="gq-xdg-")  # (short: a socket's path has 107 bytes at most)
    monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    yield
    shutil.rmtree(runtime, ignore_errors=True)


def _cli(queue, *args: str) -> list[str]:
    return [*queue.cli_command(), "--root", str(queue.root), *args]


def test_run_carries_input_output_errors_and_exit_status_and_writes_no_environment(queue):
    queue.start_worker(HOST, "1x24GiB")
    env = {**queue.env(), "MY_API_TOKEN": "s3cret", "FAVOURITE": "blue"}
    script = "echo out CVD=$CUDA_VISIBLE_DEVICES $FAVOURITE $MY_API_TOKEN; echo err >&2; read x; echo got $x; exit 3"
    done = subprocess.run(
        _cli(queue, "run", "--gpu-mem", "4GiB", "--", "sh", "-c", script),
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd="/tmp",
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "out CVD=0 blue s3cret\ngot hello\n"
    assert "err\n" in done.stderr and f"runs on {HOST}, GPUs 0" in done.stderr
    record = wait_until(lambda: queue.finished("run-1"), what="the session's record")
    assert record["state"] == "failed" and record["exit_code"] == 3 and record["host"] == HOST
    assert record["spec"]["gpu_mem_mib"] == 4096 and record["spec"]["workdir"] == "/tmp"
    assert "s3cret" not in record["spec_text"] and "blue" not in record["spec_text"]  # the environment travelled


def test_a_command_that_ends_at_once_or_is_not_found_says_so_with_its_status(queue):
    queue.start_worker(HOST, "1x24GiB")
    for _ in range(3):  # (its end raced the session's start: "No child processes", exit 1)
        quick = subprocess.run(
            _cli(queue, "run", "--", "true"), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90
        )
        assert quick.returncode == 0, quick.stderr
    missing = subprocess.run(
        _cli(queue, "run", "--", "nosuchcmd", "--flag"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert missing.returncode == 127, missing.stderr
    assert "gpuq: cannot run nosuchcmd: No such file or directory (PATH=" in missing.stderr


@pytest.mark.parametrize(
    "closed_at, stdin_null", [(b"runs on", False), (b"started", False), (b"started", True)], ids=str
)
def test_a_terminal_that_closes_without_a_hangup_signal_still_frees_the_gpu(queue, closed_at, stdin_null):
    """The session's process in a session of its own (as `su` leaves it): closing its terminal
    sends it no SIGHUP; its read of the terminal ends, and so does the session. Closed as the
    job starts (`runs on`: gpuq run may not have said hello yet, or set the terminal raw) or
    once the command runs: a hang-up either way, never a failure of the session. With stdin
    not the terminal (`</dev/null`) and a silent command, the terminal's hang-up is seen on
    stdout and stderr (nothing noticed it: the job kept its GPU until the command wrote)."""
    queue.start_worker(HOST, "1x24GiB")
    pid, fd = pty.fork()
    if pid == 0:
        try:  # setsid(1): `gpuq run` in a session of its own, its stdin still this terminal
            if stdin_null:
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            argv = ["setsid", "-w", *_cli(queue, "run", "--", "sh", "-c", "echo started; exec sleep 300")]
            os.execvpe(argv[0], argv, queue.env())
        finally:
            os._exit(127)  # never back into pytest
    try:
        seen = b""
        deadline = time.monotonic() + 90
        while closed_at not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                seen += os.read(fd, 4096)
        assert closed_at in seen, seen
        os.close(fd)  # the terminal is gone (setsid, its session's leader, gets the SIGHUP; gpuq run none)
        fd = -1
        ended = wait_until(lambda: queue.finished("run-1"), timeout=60, what="the session to end")
        assert ended["exit_code"] == 128 + signal.SIGHUP, queue.log("run-1")
        assert "gpuq run went away" in queue.log("run-1")
    finally:
        if fd >= 0:
            os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_much_input_to_a_slow_reader_and_output_to_a_reader_that_stops(queue, tmp_path):
    """8 MiB piped in to a command that reads only after a while, echoed back whole; then
    `gpuq run -- yes | head -1`: the run ends as a pipeline's writer does (SIGPIPE), and so does
    the job, hung up. stdin closed (`<&-`) is no input."""
    queue.start_worker(HOST, "1x24GiB")
    data = tmp_path / "in.bin"
    data.write_bytes(os.urandom(8 << 20))
    with open(data, "rb") as f:
        done = subprocess.run(
            _cli(queue, "run", "--", "sh", "-c", "sleep 2; cat"),
            stdin=f,
            capture_output=True,
            timeout=120,
            env=queue.env(),
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout == data.read_bytes()
    yes = subprocess.Popen(
        _cli(queue, "run", "--", "yes"), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=queue.env()
    )
    try:
        assert yes.stdout is not None and yes.stdout.readline() == b"y\n"
        yes.stdout.close()
        assert yes.wait(timeout=60) == 128 + signal.SIGPIPE
    finally:
        yes.kill()
        yes.wait()
    ended = wait_until(lambda: queue.finished("run-2"), timeout=60, what="yes to be hung up")
    assert ended["exit_code"] == 128 + signal.SIGHUP
    closed = subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", *_cli(queue, "run", "--", "sh", "-c", "cat; echo end")],
        capture_output=True,
        text=True,
        timeout=90,
        env=queue.env(),
    )
    assert (closed.returncode, closed.stdout) == (0, "end\n"), closed.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_run_waits_with_its_reason_and_ctrl_c_or_a_closed_terminal_cancels_it(queue, tmp_path, sig):
    queue.start_worker(HOST, "1x24GiB")
    queue.drop("blocker.yaml", f"command: {fake_job(seconds=120)}\ngpus: 1\n")  # the whole GPU
    wait_until(lambda: (queue.record("blocker") or {}).get("state") == "running", what="the blocker to run")
    err = tmp_path / "run.err"
    with open(err, "w") as f:
        proc = subprocess.Popen(_cli(queue, "run", "--gpu-mem", "4GiB", "--", "true"), stderr=f, env=queue.env())
    try:
        wait_until(lambda: "run-1 waits (#1 in the queue)" in err.read_text(), timeout=60, what="the reason")
        assert "Ctrl-C cancels it" in err.read_text()
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
    finally:
        proc.kill()
        proc.wait()
    assert wait_until(lambda: queue.finished("run-1"), what="the cancel")["state"] == "cancelled"


def _blocked(queue) -> None:
    """This box's one GPU taken whole by a job that runs on: a run waits behind it."""
    queue.start_worker(HOST, "1x24GiB")
    queue.drop("blocker.yaml", f"command: {fake_job(seconds=120)}\ngpus: 1\n")
    wait_until(lambda: (queue.record("blocker") or {}).get("state") == "running", what="the blocker to run")


def _pending(queue, job_id: str) -> bool:
    return (queue.root / "jobs" / f"{job_id}.yaml").exists()


@pytest.mark.parametrize("own_session", [False, True], ids=["hangup", "no-hangup"])
def test_a_terminal_closed_while_the_run_waits_cancels_it(queue, own_session):
    """The terminal is gpuq run's own (SIGHUP as it closes), or gpuq run is in a session of its
    own (setsid, su: no SIGHUP; the terminal's hang-up is seen on its descriptors): the job is
    cancelled, though what gpuq run says of it can no longer be written (it was said first, and
    EIO stopped the cancel; without a SIGHUP nothing noticed until the job started)."""
    _blocked(queue)
    runs: list[psutil.Process] = []
    pid, fd = pty.fork()
    if pid == 0:
        try:
            argv = [*(["setsid", "-w"] if own_session else []), *_cli(queue, "run", "--gpu-mem", "4GiB", "--", "true")]
            os.execvpe(argv[0], argv, queue.env())
        finally:
            os._exit(127)  # never back into pytest
    try:
        seen, deadline = b"", time.monotonic() + 90
        while b"waits" not in seen and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                seen += os.read(fd, 4096)
        assert b"waits" in seen, seen
        runs = psutil.Process(pid).children(recursive=True)  # (gpuq run under setsid: killed if it lingers)
        os.close(fd)
        fd = -1
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        pid = 0
        assert status == (-signal.SIGHUP if own_session else 128 + signal.SIGHUP)  # (setsid itself: hung up)
        assert wait_until(lambda: queue.finished("run-1"), what="the cancel")["state"] == "cancelled"
    finally:
        if fd >= 0:
            os.close(fd)
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for run in runs:
            with contextlib.suppress(psutil.NoSuchProcess):
                run.kill()


def test_a_closed_stderr_or_a_second_signal_while_the_run_waits_still_cancels_it(queue):
    """`gpuq run ... 2>&1 | head -0`: its first word to stderr fails (EPIPE): 141, cancelled
    (it exited 0, the job left pending). SIGHUP then SIGTERM at once, as a closing terminal and
    its shell send them: 129, cancelled (the second interrupted the cancel: the job was left
    pending, or lost with no record when the run applied the cancel itself)."""
    _blocked(queue)
    piped = subprocess.Popen(
        _cli(queue, "run", "--gpu-mem", "4GiB", "--", "true"), stderr=subprocess.PIPE, env=queue.env()
    )
    assert piped.stderr is not None
    piped.stderr.close()  # the reader is gone before a word was said
    try:
        assert piped.wait(timeout=60) == 128 + signal.SIGPIPE
    finally:
        piped.kill()
        piped.wait()
    assert wait_until(lambda: queue.finished("run-1"), what="the cancel")["state"] == "cancelled"
    for attempt in range(3):
        job_id = f"run-{2 + attempt}"
        proc = subprocess.Popen(
            _cli(queue, "run", "--gpu-mem", "4GiB", "--", "true"), stderr=subprocess.DEVNULL, env=queue.env()
        )
        try:
            wait_until(lambda j=job_id: _pending(queue, j), timeout=60, what=f"{job_id} to wait")
            proc.send_signal(signal.SIGHUP)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 128 + signal.SIGHUP
        finally:
            proc.kill()
            proc.wait()
        ended = wait_until(lambda j=job_id: queue.finished(j), what=f"{job_id} cancelled")
        assert ended["state"] == "cancelled" and not _pending(queue, job_id)


def test_a_time_limit_stops_the_attached_command(queue):
    queue.start_worker(HOST, "1x24GiB")
    done = subprocess.run(
        _cli(queue, "run", "--time-limit", "2s", "--", "sleep", "300"),
        capture_output=True,
        text=True,
        timeout=90,
        env=queue.env(),
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "the job is being stopped" in done.stderr
    assert wait_until(lambda: queue.finished("run-1"))["state"] == "timeout"


def test_the_cli_going_away_hangs_up_and_frees_the_gpu(queue, tmp_path):
    queue.start_worker(HOST, "1x24GiB")
    err = tmp_path / "run.err"
    with open(err, "w") as f:
        proc = subprocess.Popen(
            _cli(queue, "run", "--", "sleep", "300"), stdin=subprocess.PIPE, stderr=f, env=queue.env()
        )
    try:
        wait_until(lambda: "runs on" in err.read_text(), timeout=60, what="the session to attach")
        proc.kill()  # the terminal is closed: nothing says goodbye
    finally:
        proc.kill()
        proc.wait()
    ended = wait_until(lambda: queue.finished("run-1"), timeout=60, what="the job to end")
    assert ended["state"] == "failed" and ended["signal"] is None and ended["exit_code"] == 128 + signal.SIGHUP
    assert "gpuq run went away" in queue.log("run-1")


def _pty_session(argv: list[str], env: dict[str, str], answer: list[tuple[bytes, Callable[[], bytes]]], timeout=90.0):
    """Run argv on a pseudo-terminal, writing each answer once its cue has appeared; returns
    (everything it wrote, its exit status)."""
    pid, fd = pty.fork()
    if pid == 0:
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)  # never back into pytest
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    break
                if not data:
                    break
                out += data
            while answer and answer[0][0] in out:
                os.write(fd, answer.pop(0)[1]())
        else:
            raise AssertionError(f"the session did not end: {out!r}")
        return out.decode(errors="replace"), os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def test_a_shell_in_a_terminal_then_released_when_idle(queue):
    queue.write_config(shell_idle_timeout="3s")
    queue.start_worker(HOST, "2x24GiB")
    env = {**queue.env(), "SHELL": "/bin/sh", "PS1": "$ "}
    seen: dict[str, str] = {}

    def status_during() -> bytes:
        seen["status"] = queue.gpuq("status", "-w").stdout
        return b"echo CVD=$CUDA_VISIBLE_DEVICES; tty\n"

    out, rc = _pty_session(_cli(queue, "shell", "--gpu-mem", "2GiB"), env, [(b"$ ", status_during)])
    assert "CVD=0" in out and "/dev/pts/" in out, out
    assert "gpuq shell: released after 3 s without input or output" in out
    assert rc == 0  # released as configured: the session's end, not a failure
    assert "SESSIONS (1" in seen["status"] and "shell" in seen["status"], seen["status"]
    assert "shell-1  root  shell  " in seen["status"] and "idle limit 3.0s" in seen["status"], seen["status"]
    ended = wait_until(lambda: queue.finished("shell-1"))
    assert (ended["host"], ended["state"]) == (HOST, "done")


def test_shell_needs_a_terminal_and_no_box_that_fits_is_said_with_where(queue):
    queue.start_worker(HOST, "1x24GiB")
    queue.start_worker("big", "1x80GiB")
    refused = queue.gpuq("shell", check=False, input="")
    assert refused.returncode == 2 and "needs a terminal" in refused.stderr
    far = queue.gpuq("run", "--gpu-mem", "40GiB", "--", "true", check=False)
    assert far.returncode == 2
    assert f"no GPU on this box ({HOST}) can hold 1 GPU with 40GiB each; big could: ssh big" in far.stderr
    assert list((queue.root / "jobs").iterdir()) == []  # nothing was submitted
    for slurm, ours in (("srun", "gpuq run"), ("salloc", "gpuq shell")):  # typed by habit
        habit = queue.gpuq(slurm, check=False)
        assert habit.returncode == 2 and f"Slurm's {slurm} is {ours} " in habit.stderr + " ", habit.stderr


def test_a_members_session_runs_as_that_member(team):
    team.start_worker(HOST, "1x24GiB")
    # bob took the name of alice's socket directory first: hers is a fresh one, and works
    taken = Path(f"/tmp/gpuq-{team.users[ALICE].pw_uid}")
    shutil.rmtree(taken, ignore_errors=True)
    assert team.run_as(BOB, ["mkdir", "-m", "777", str(taken)]).returncode == 0
    done = team.as_user(ALICE, "run", "--", "sh", "-c", "id -u; echo $CUDA_VISIBLE_DEVICES", timeout=90)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(team.users[ALICE].pw_uid), "0"]
    record = wait_until(lambda: team.finished("run-1"))
    assert record["user"] == ALICE and record["state"] == "done"
    # Her socket's directory is hers alone: bob cannot reach it (made afresh, and removed after).
    ours = team.run_as(ALICE, ["sh", "-c", f"ls -d /tmp/gpuq-{team.users[ALICE].pw_uid}-*"])
    assert ours.returncode != 0  # removed once the session ended
    shutil.rmtree(taken, ignore_errors=True)
    team.as_user(ALICE, "run", "--", "true", timeout=90)  # now under the name, made 0700 by her
    listed = team.run_as(BOB, ["ls", str(taken)])
    assert listed.returncode != 0 and "Permission denied" in listed.stderr
