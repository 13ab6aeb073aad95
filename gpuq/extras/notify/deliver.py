"""The deliverer: one event of one job, sent where its owner's own notify.yaml says. The root
part starts it as the job's owner (host/privsep.py `program`: `python -I`, cwd /, the owner's
HOME, USER, LOGNAME and a fixed PATH), with the event as JSON on stdin; it reads only its own
user's file (memberfile.py), so no spec and no other member can point it anywhere.

Each event is sent once: the worker hands a delivery over again after a crash between handing
it over and striking it off its list, and the deliverer claims each event's key before sending
(sentmarks.py: a mark in the owner's own ~/.local/state/gpuq/notify-sent/).

Each destination is bounded in time and tried a few times, and each try's result is one line
on stdout, which the worker reads (capped, as safe text) into its log: a receiver that is
down or hangs costs this process its time, never the queue's. No line names more of a webhook
than its scheme, host and port (its path is often the secret).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpuq.extras.notify import sentmarks
from gpuq.extras.notify.memberfile import MemberFileError, Settings, read_own
from gpuq.model.text import safe_text

MAX_INPUT = 1 << 16
WEBHOOK_TIMEOUT_S = 5.0
WEBHOOK_TRIES = 3
BACKOFF_S = (1.0, 2.0)  # before the second and third tries
MAIL_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 30.0
SENDMAILS = ("/usr/sbin/sendmail", "/usr/lib/sendmail")
JOB_KEYS = ("id", "name", "user", "state", "attempt", "exit_code", "reason", "host", "gpus", "started_at", "ended_at")


def say(line: str) -> None:
    print(line, flush=True)


def text_of(event: dict[str, Any]) -> tuple[str, str]:
    """(title, message) for people: `gpuq: job train-3 failed (exit 1) on a`."""
    job = event["job"]
    name, state, host = job.get("id"), job.get("state"), job.get("host")
    if event["event"] == "start":
        title = f"gpuq: job {name} started" + (f" on {host}" if host else "")
    else:
        title = f"gpuq: job {name} {state}" + (f" (exit {job['exit_code']})" if job.get("exit_code") else "")
        title += f" on {host}" if host else ""
    message = title + (f": {job['reason']}" if job.get("reason") and event["event"] != "start" else "")
    return safe_text(title)[:200], safe_text(message)[:1000]


def body_of(event: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """One JSON body for every receiver: `text` (Slack, Mattermost), `topic`, `title` and
    `message` (ntfy's JSON publishing, POSTed to the server's root), and `event` and `job`
    for a receiver of one's own."""
    title, message = text_of(event)
    body: dict[str, Any] = {"text": message, "title": title, "message": message}
    if settings.topic:
        body["topic"] = settings.topic
    body["event"] = event["event"]
    body["job"] = event["job"]
    return body


def where(url: str) -> str:
    """What a line may say of a webhook: its scheme, host and port."""
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:  # out of range: memberfile refuses it, but never a traceback here
        port = None
    return safe_text(f"{parts.scheme}://{parts.hostname or '?'}" + (f":{port}" if port else ""))


class _TryTimedOut(Exception):
    pass


def _out_of_time(signum: int, frame: object) -> None:
    raise _TryTimedOut


def _whole_try(seconds: float) -> None:
    """A deadline for the whole of one try (connect, send, every byte of the answer): the
    socket's timeout bounds each wait only, and a receiver that trickles a byte every few
    seconds would hold the deliverer for as long as it likes. 0 cancels it."""
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def post(url: str, body: dict[str, Any], label: str) -> bool:
    """POST the body, up to WEBHOOK_TRIES times with a pause between; a 4xx but 408 and 429
    is not tried again (it will not get better). One line per try."""
    data = json.dumps(body).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for attempt in range(1, WEBHOOK_TRIES + 1):
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json", "User-Agent": "gpuq-notify"}
        )
        try:
            _whole_try(WEBHOOK_TIMEOUT_S)
            with opener.open(request, timeout=WEBHOOK_TIMEOUT_S) as answer:
                answer.read(4096)
                _whole_try(0)
                say(f"sent {label}: webhook {where(url)}: try {attempt}: HTTP {answer.status}")
                return True
        except urllib.error.HTTPError as e:
            _whole_try(0)
            say(f"failed {label}: webhook {where(url)}: try {attempt}: HTTP {e.code}")
            if 400 <= e.code < 500 and e.code not in (408, 429):
                return False
        except _TryTimedOut:
            whole = f"timed out (no whole answer within {WEBHOOK_TIMEOUT_S:g} s)"
            say(f"failed {label}: webhook {where(url)}: try {attempt}: {whole}")
        except (urllib.error.URLError, OSError, ValueError) as e:
            _whole_try(0)
            say(f"failed {label}: webhook {where(url)}: try {attempt}: {why(e)}")
        if attempt < WEBHOOK_TRIES:
            time.sleep(BACKOFF_S[attempt - 1])
    return False


def why(e: Exception) -> str:
    """What a failed try says: the network's own words (refused, timed out, no such host), never
    an exception's text that may quote the URL (http.client's InvalidURL does)."""
    reason = e.reason if isinstance(e, urllib.error.URLError) else e
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return safe_text(reason.strerror)[:200]
    return type(reason).__name__


def mail(settings: Settings, event: dict[str, Any], label: str) -> bool:
    """A mail through the box's sendmail (or the member's own `sendmail:`), `sendmail -t -oi`."""
    program = settings.sendmail or next((p for p in SENDMAILS if os.access(p, os.X_OK)), None)
    if program is None:
        say(f"failed {label}: mail: this box has no sendmail ({', '.join(SENDMAILS)})")
        return False
    title, message = text_of(event)
    text = (
        f"To: {settings.mail}\nSubject: {title}\nContent-Type: text/plain; charset=utf-8\n"
        f"Auto-Submitted: auto-generated\n\n{message}\n\n{json.dumps(event['job'], indent=2)}\n"
    )
    code = bounded([program, "-t", "-oi"], text, dict(os.environ), MAIL_TIMEOUT_S)
    ok = code == 0
    say(f"{'sent' if ok else 'failed'} {label}: mail via {safe_text(program)}: {result(code, MAIL_TIMEOUT_S)}")
    return ok


def command(settings: Settings, event: dict[str, Any], label: str) -> bool:
    """The member's command, through /bin/sh, the event in GPUQ_* variables and as JSON on stdin."""
    job = event["job"]
    env = dict(os.environ)
    for key, value in (
        ("GPUQ_EVENT", event["event"]),
        ("GPUQ_JOB_ID", job.get("id")),
        ("GPUQ_JOB_NAME", job.get("name")),
        ("GPUQ_STATE", job.get("state")),
        ("GPUQ_EXIT_CODE", job.get("exit_code")),
        ("GPUQ_HOST", job.get("host")),
        ("GPUQ_REASON", job.get("reason")),
        ("GPUQ_USER", job.get("user")),
        ("GPUQ_MESSAGE", text_of(event)[1]),
    ):
        env[key] = "" if value is None else safe_text(value)[:1000]
    assert settings.command is not None
    code = bounded(["/bin/sh", "-c", settings.command], json.dumps(event), env, COMMAND_TIMEOUT_S)
    ok = code == 0
    say(f"{'sent' if ok else 'failed'} {label}: command: {result(code, COMMAND_TIMEOUT_S)}")
    return ok


def bounded(argv: list[str], stdin: str, env: dict[str, str], timeout: float) -> int | None:
    """Run argv in its own session, at most `timeout` (then its whole group is killed): its
    exit code, or None when it ran past. Its output goes nowhere (the member's command may
    redirect it itself)."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=home if os.path.isdir(home := os.environ.get("HOME") or "/") else "/",
            start_new_session=True,
        )
    except OSError as e:
        say(f"  cannot run {safe_text(argv[0])}: {e.strerror}")
        return 127
    try:
        proc.communicate(stdin.encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        return None
    except BrokenPipeError:
        proc.wait()
    return proc.returncode


def result(code: int | None, timeout: float) -> str:
    return f"no answer within {timeout:g} s, killed" if code is None else f"exit {code}"


def checked_event(raw: bytes) -> dict[str, Any]:
    """The event the worker handed over: {"event": start|end|fail, "job": {...}}."""
    event = json.loads(raw)
    if not isinstance(event, dict) or event.get("event") not in ("start", "end", "fail"):
        raise ValueError("not an event")
    job = event.get("job")
    if not isinstance(job, dict) or not isinstance(job.get("id"), str):
        raise ValueError("not a job's event")
    event["job"] = {k: job.get(k) for k in JOB_KEYS}
    key = event.get("key")
    event["key"] = key if isinstance(key, str) and sentmarks.KEY_RE.fullmatch(key) else None
    return event


def main() -> int:
    try:
        event = checked_event(sys.stdin.buffer.read(MAX_INPUT))
    except ValueError as e:
        say(f"error: the event on stdin: {e}")
        return 2
    label = f"job {safe_text(event['job']['id'])[:80]} {event['event']}"
    try:
        settings = read_own()
    except MemberFileError as e:
        say(f"error {label}: {safe_text(e)[:300]}")
        return 1
    assert settings is not None
    if not (settings.webhook or settings.mail or settings.command):
        say(
            f"error {label}: {safe_text(os.environ.get('HOME', '~'))}/.config/gpuq/notify.yaml names no "
            "webhook, mail or command"
        )
        return 1
    claimed = sentmarks.claim(os.environ.get("HOME"), event["key"])
    if claimed.skip:
        say(f"sent {label} before: {claimed.skip}")
        return 0
    if claimed.note:
        say(f"note {label}: sent without a once-only mark: {safe_text(claimed.note)[:300]}")
    sent = []
    try:
        if settings.webhook:
            sent.append(post(settings.webhook, body_of(event, settings), label))
        if settings.mail:
            sent.append(mail(settings, event, label))
        if settings.command:
            sent.append(command(settings, event, label))
    finally:
        sentmarks.finish(claimed, time.time())
    return 0 if all(sent) else 1


if __name__ == "__main__":
    sys.exit(main())
