"""The notify extra through the real CLI and worker on fake GPUs (one user: the worker's own
jobs): a real HTTP receiver on 127.0.0.1 gets one POST per asked event, a command and a
stand-in sendmail run, a receiver down or hanging never holds the queue up, and a worker
killed and restarted sends no message twice."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import psutil
import pytest
from receiver import Receiver, refused_url

from conftest import fake_job, wait_until
from gpuq.extras.notify import sentmarks
from gpuq.host.faults import CRASH_ENV, FAULT_LOG_ENV

pytestmark = pytest.mark.slow  # every test here starts processes


def _home(tmp_path: Path, text: str) -> dict[str, str]:
    """A HOME with ~/.config/gpuq/notify.yaml, for the worker (its jobs are its user's)."""
    home = tmp_path / "home"
    (home / ".config" / "gpuq").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "gpuq" / "notify.yaml").write_text(text)
    return {"HOME": str(home)}


def _log(queue, host: str = "a") -> str:
    path = queue.root / "logs" / "workers" / f"{host}.log"
    return path.read_text() if path.exists() else ""


def _spec(seconds: float = 0.3, notify: str | None = None, extra: str = "") -> str:
    text = f"command: {fake_job(seconds)!r}\ngpus: 1\ngpu_mem: 1GiB\n{extra}"
    return text + (f"notify: {notify}\n" if notify else "")


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_one_post_per_asked_event_with_the_json_slack_ntfy_and_a_receiver_read(queue, tmp_path, receiver):
    env = _home(tmp_path, f"webhook: {receiver.url}\ntopic: gpuq-test\n")
    queue.start_worker("a", "1x24GiB", env=env)
    queue.drop("quiet.yaml", _spec(notify="fail"))  # done: no message
    wait_until(lambda: queue.finished("quiet"), timeout=60, what="quiet to end")
    queue.drop("both.yaml", _spec(notify="all"))
    bodies = wait_until(lambda: len(receiver.of("both")) == 2 and receiver.of("both"), timeout=60, what="2 POSTs")
    start, end = sorted(bodies, key=lambda b: b["event"] != "start")
    assert start["event"] == "start" and start["job"]["state"] == "running"
    assert end["event"] == "end" and end["job"]["state"] == "done" and end["job"]["exit_code"] == 0
    assert end["text"] == end["message"] == "gpuq: job both done on a"
    assert end["topic"] == "gpuq-test" and end["title"] == "gpuq: job both done on a"
    assert end["job"]["id"] == "both" and end["job"]["host"] == "a" and end["job"]["user"]
    assert receiver.of("quiet") == [] and receiver.paths == ["/hooks/SECRET-KEY"] * 2
    log = wait_until(lambda: "sent job both end" in (t := _log(queue)) and t, what="the delivery logged")
    assert "webhook http://127.0.0.1:" in log and "SECRET-KEY" not in log  # the path is the secret


def test_submit_notify_and_the_members_default_and_a_command_and_sendmail(queue, tmp_path, receiver):
    out = tmp_path / "out"
    sendmail = tmp_path / "fake-sendmail"
    sendmail.write_text(f'#!/bin/sh\necho "$@" > {out}.mail-args\ncat > {out}.mail\n')
    sendmail.chmod(0o755)
    env = _home(
        tmp_path,
        f"webhook: {receiver.url}\nmail: me@example.org\nsendmail: {sendmail}\n"
        f'command: \'id -u > {out}.uid; echo "$GPUQ_EVENT $GPUQ_JOB_ID $GPUQ_STATE $GPUQ_EXIT_CODE" > {out}.env; '
        f"cat > {out}.json'\non: [fail]\n",
    )
    queue.start_worker("a", "1x24GiB", env=env)
    cli_env = {**os.environ, **env}
    submitted = queue.gpuq("submit", "--name", "failing", "--gpu-mem", "1GiB", "--", "sh", "-c", "exit 3", env=cli_env)
    failing = submitted.stdout.strip()
    assert wait_until(lambda: queue.record(failing), what="its record")["spec"]["notify"] == ["fail"]  # `on:`
    wait_until(lambda: receiver.of(failing), timeout=60, what="the fail POST")
    assert receiver.of(failing)[0]["event"] == "fail"
    assert receiver.of(failing)[0]["job"]["exit_code"] == 3

    def written(suffix: str) -> str:  # whole: the shell makes the file before `cat` has written
        path = Path(f"{out}.{suffix}")
        text = path.read_text() if path.exists() else ""
        return text if text.rstrip().endswith("}") else ""

    wait_until(lambda: written("json") and written("mail"), timeout=60, what="the command's JSON and the mail")
    wait_until(lambda: Path(f"{out}.env").read_text().strip(), what="the command's variables")
    assert Path(f"{out}.env").read_text().split() == ["fail", failing, "failed", "3"]
    assert json.loads(Path(f"{out}.json").read_text())["job"]["id"] == failing
    assert Path(f"{out}.uid").read_text().strip() == str(os.getuid())
    mail = Path(f"{out}.mail").read_text()
    assert "To: me@example.org\n" in mail and f"Subject: gpuq: job {failing} failed (exit 3) on a\n" in mail
    assert Path(f"{out}.mail-args").read_text().split() == ["-t", "-oi"]
    told = queue.gpuq("submit", "--notify", "start", "--gpu-mem", "1GiB", "--", "true", env=cli_env).stdout.strip()
    assert wait_until(lambda: queue.record(told), what="told's record")["spec"]["notify"] == ["start"]
    wait_until(lambda: receiver.of(told), timeout=60, what="the start POST")
    bad = queue.gpuq("submit", "--notify", "sometimes", "--", "true", env=cli_env, check=False)
    assert bad.returncode == 2 and "--notify: 'sometimes' is not one of start, end, fail, all" in bad.stderr


@pytest.mark.parametrize("receiver_is", ["down", "hanging"])
def test_a_receiver_down_or_hanging_never_holds_the_queue_up_and_is_logged(queue, tmp_path, receiver_is):
    hanging = Receiver(hang=True) if receiver_is == "hanging" else None
    try:
        url = hanging.url if hanging else refused_url()
        queue.start_worker("a", "1x24GiB", env=_home(tmp_path, f"webhook: {url}\n"))
        queue.drop("first.yaml", _spec(notify="end"))
        wait_until(lambda: queue.finished("first"), timeout=60, what="first to end")
        queue.drop("second.yaml", _spec())
        second = wait_until(lambda: queue.finished("second"), timeout=60, what="second to end")
        assert second["state"] == "done"
        if hanging:  # the deliverer still waits on the receiver (5 s a try, 3 tries), the queue did not
            assert "failed job first end" not in _log(queue)
        log = wait_until(
            lambda: "failed job first end" in (t := _log(queue)) and "try 3" in t and t, timeout=90, what="the failure"
        )
        assert ("timed out" in log) if hanging else ("Connection refused" in log)
    finally:
        if hanging:
            hanging.close()


def test_a_worker_killed_right_after_a_job_ended_sends_its_message_once(queue, tmp_path, receiver):
    env = _home(tmp_path, f"webhook: {receiver.url}\n")
    queue.start_worker("a", "1x24GiB", env=env)
    queue.drop("once.yaml", _spec(notify="end"))
    wait_until(lambda: queue.finished("once"), timeout=60, what="once to end")
    queue.kill_worker("a")
    queue.start_worker("a", "1x24GiB", env=env)
    wait_until(lambda: receiver.of("once"), timeout=60, what="the end POST")
    queue.drop("later.yaml", _spec(notify="end"))  # a later delivery: the first had every chance to repeat
    wait_until(lambda: receiver.of("later"), timeout=60, what="later's POST")
    queue.wait_passes("a", 3)
    assert len(receiver.of("once")) == 1 and len(receiver.of("later")) == 1


@pytest.mark.parametrize("point", ["notify:marked", "notify:handed"])
def test_a_worker_killed_between_reading_and_handing_over_sends_once(queue, tmp_path, receiver, point):
    """Killed once the batch is marked read: the restarted worker hands it over (never lost).
    Killed after the hand-over, before it is struck off: handed over again, and the second
    deliverer finds the event's key already sent by the first (never twice)."""
    faults = tmp_path / "faults.log"
    env = _home(tmp_path, f"webhook: {receiver.url}\n")
    queue.start_worker("a", "1x24GiB", env={**env, CRASH_ENV: point, FAULT_LOG_ENV: str(faults)})
    queue.drop("once.yaml", _spec(notify="end"))
    wait_until(lambda: faults.exists() and f"crash {point}" in faults.read_text(), timeout=60, what=point)
    queue.stop_worker("a", signal.SIGKILL)  # the starter too, were it still there
    queue.start_worker("a", "1x24GiB", env=env)
    wait_until(lambda: receiver.of("once"), timeout=60, what="the end POST")
    if point == "notify:handed":
        wait_until(lambda: "sent job once end before" in _log(queue), timeout=60, what="the second hand-over")
    queue.wait_passes("a", 3)
    assert len(receiver.of("once")) == 1


@pytest.mark.parametrize("bad", ["fifo", "huge", "garbage", "symlink", "writable"])
def test_a_bad_notify_file_is_a_logged_error_and_no_hang(queue, tmp_path, receiver, bad):
    env = _home(tmp_path, "")
    path = Path(env["HOME"]) / ".config" / "gpuq" / "notify.yaml"
    path.unlink()
    if bad == "fifo":
        os.mkfifo(path)
    elif bad == "huge":
        path.write_text(f"webhook: {receiver.url}\n" + "#" * (1 << 17) + "\n")
    elif bad == "garbage":
        path.write_bytes(b"webhook: [\x00\xff: :\n")
    elif bad == "symlink":
        other = tmp_path / "someone-elses.yaml"
        other.write_text(f"webhook: {receiver.url}\n")
        path.symlink_to(other)
    else:
        path.write_text(f"webhook: {receiver.url}\n")
        path.chmod(0o666)
    queue.start_worker("a", "1x24GiB", env=env)
    queue.drop("job.yaml", _spec(notify="end"))
    wait_until(lambda: queue.finished("job"), timeout=60, what="the job to end")
    log = wait_until(lambda: "error job job end" in (t := _log(queue)) and t, timeout=60, what="the error")
    said = {
        "fifo": "is not a plain file",
        "huge": "over 65536",
        "garbage": "notify.yaml",
        "symlink": "is a symbolic link",
        "writable": "may be written by others",
    }[bad]
    assert said in log and receiver.bodies == []
    assert stat.S_ISFIFO(path.lstat().st_mode) or bad != "fifo"


@pytest.mark.parametrize(
    ("text", "said"), [(None, "there is none"), ("on: [fail]\n", "names no webhook, mail or command")]
)
def test_notify_asked_without_a_destination_is_said_at_submit(queue, tmp_path, text, said):
    """Where the member's own file sends nothing, submit says so (the job is still submitted),
    not only the worker's log once the job has ended."""
    home = tmp_path / "home"
    if text is None:
        home.mkdir()
        env = {"HOME": str(home)}
    else:
        env = _home(tmp_path, text)
    done = queue.gpuq("submit", "--gpus", "0", "--notify", "fail", "--", "true", env={**queue.env(), **env})
    assert "gpuq submit: warning: --notify fail: " in done.stderr and said in done.stderr, done.stderr
    assert "nothing will be sent" in done.stderr and done.stdout.strip()  # submitted all the same


def test_a_box_that_dies_with_its_deliverer_mid_send_still_sends_the_message(queue, tmp_path):
    """Killed after the hand-over, before it is struck off, and the deliverer with it (a power
    cut, the unit's cgroup killed, the OOM killer taking the group) while its receiver had not
    answered: the restarted worker hands the event over again and it is sent, not taken for
    sent by the mark the dead deliverer made before sending."""

    faults = tmp_path / "faults.log"
    hanging, receiver = Receiver(hang=True), Receiver()
    try:
        env = _home(tmp_path, f"webhook: {hanging.url}\n")
        queue.start_worker("a", "1x24GiB", env={**env, CRASH_ENV: "notify:handed", FAULT_LOG_ENV: str(faults)})
        box = psutil.Process(queue.workers["a"].pid)
        queue.drop("once.yaml", _spec(notify="end"))
        wait_until(lambda: faults.exists() and "crash notify:handed" in faults.read_text(), timeout=60, what="handed")

        def deliverers() -> list[psutil.Process]:  # this test's own: its HOME is this test's
            found = []
            for p in psutil.process_iter(["cmdline"]):
                try:
                    if "extras.notify.deliver" in " ".join(p.info["cmdline"] or []):
                        if p.environ().get("HOME") == env["HOME"]:
                            found.append(p)
                except psutil.Error:
                    pass
            return found

        wait_until(deliverers, timeout=30, what="the first deliverer")
        marks = Path(env["HOME"]).joinpath(*sentmarks.SENT_DIR)
        # Its mark made, its POST never answered (the receiver hangs).
        wait_until(lambda: marks.is_dir() and any(marks.iterdir()), timeout=30, what="the first deliverer's mark")
        for p in deliverers():  # the whole box goes: its deliverer too
            p.kill()
        if box.is_running():
            queue.stop_worker("a", signal.SIGKILL)
        else:
            queue.workers.pop("a")
        (Path(env["HOME"]) / ".config" / "gpuq" / "notify.yaml").write_text(f"webhook: {receiver.url}\n")
        queue.start_worker("a", "1x24GiB", env=env)
        wait_until(lambda: receiver.of("once") or "before" in _log(queue), timeout=60, what="the second hand-over")
        assert len(receiver.of("once")) == 1, [line for line in _log(queue).splitlines() if "notify" in line]
    finally:
        hanging.close()
        receiver.close()
