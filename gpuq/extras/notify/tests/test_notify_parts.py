"""The notify extra's parts, in-process: the spec's field and its refusals, which event a
transition is, the member's file read as hostile input, the deliverer's JSON and what its
lines may say of a webhook, and the root part's refusals of a `program` order."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

import pytest

from gpuq.extras.notify import deliver, sentmarks, watch
from gpuq.extras.notify.events import event_of
from gpuq.extras.notify.memberfile import MemberFileError, Settings, parse, read_own
from gpuq.host import privsep
from gpuq.host.wire import Identity, Refused
from gpuq.model.errors import SpecError
from gpuq.model.spec import validate_spec


def _spec(notify: object) -> dict:
    return {"command": "true", "notify": notify}


def test_the_spec_field_takes_words_lists_and_comma_lists():
    assert validate_spec(_spec("end,fail"), "a.yaml").extras["notify"] == ["end", "fail"]
    assert validate_spec(_spec(["all"]), "a.yaml").extras["notify"] == ["all"]
    assert validate_spec(_spec([]), "a.yaml").extras == {}


@pytest.mark.parametrize(
    "value, problem",
    [
        ("sometimes", "'sometimes' is not one of start, end, fail, all"),
        ("end,,fail", "has an empty word"),
        ({"webhook": "http://elsewhere/"}, "must be a word or a list of words, not dict"),  # never a destination
        (3, "must be a word or a list of words, not int"),
    ],
)
def test_a_bad_notify_names_the_file_the_field_and_the_fix(value, problem):
    with pytest.raises(SpecError) as e:
        validate_spec(_spec(value), "jobs/a.yaml")
    assert e.value.file == "jobs/a.yaml" and e.value.field == "notify" and e.value.problem == problem
    assert "notify: [end, fail]" in e.value.fix


@pytest.mark.parametrize(
    "notify, transition, event",
    [
        (["start"], {"from": "pending", "to": "running"}, "start"),
        (["end"], {"from": "running", "to": "done"}, "end"),
        (["end"], {"from": "pending", "to": "cancelled"}, "end"),
        (["fail"], {"from": "running", "to": "done"}, None),
        (["fail"], {"from": "running", "to": "timeout"}, "fail"),
        (["fail"], {"from": "running", "to": "lost"}, "fail"),
        (["fail"], {"from": "running", "to": "cancelled"}, None),
        (["all"], {"from": "pending", "to": "running"}, "start"),
        (["all"], {"from": "running", "to": "failed"}, "end"),
        (["end"], {"from": "running", "to": "pending"}, None),  # put back: not an end
        (["end"], {"job": "x", "note": "warning"}, None),
        (None, {"from": "running", "to": "done"}, None),
        ("end", {"from": "running", "to": "done"}, None),  # a record's value is the list the field made
    ],
)
def test_which_event_a_transition_is(notify, transition, event):
    assert event_of(notify, transition) == event


def test_the_members_file_keys_and_their_checks():
    got = parse(b"webhook: https://ntfy.sh\ntopic: my-jobs\nmail: me@example.org\non: [end, fail]\n", "f")
    assert got == Settings("https://ntfy.sh", "my-jobs", "me@example.org", None, None, ("end", "fail"))
    for text, said in [
        (b"webhook: file:///etc/passwd\n", "webhook must be an http:// or https:// URL"),
        (b"mail: 'me@example.org\nBcc: all@example.org'\n", "mail must be one address"),
        (b"url: https://x\n", "unknown key 'url'"),
        (b"topic: a/b\n", "topic must be"),
        (b"sendmail: sendmail\n", "sendmail must be an absolute path"),
        (b"on: sometimes\n", "on 'sometimes' is not one of"),
        (b"- a\n", "not a mapping"),
        (b"webhook: [\n", "f"),
    ]:
        with pytest.raises(MemberFileError, match=None) as e:
            parse(text, "f")
        assert said in str(e.value), (text, str(e.value))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / ".config" / "gpuq").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / ".config" / "gpuq" / "notify.yaml"


def test_the_members_file_is_read_as_hostile_input(home: Path, tmp_path: Path):
    assert read_own(missing_ok=True) is None
    home.write_text("webhook: http://127.0.0.1:9/\n")
    assert read_own() == Settings(webhook="http://127.0.0.1:9/")
    home.chmod(0o664)
    with pytest.raises(MemberFileError, match="may be written by others"):
        read_own()
    home.unlink()
    os.mkfifo(home)  # a FIFO nobody writes: opened without blocking, refused at once
    with pytest.raises(MemberFileError, match="is not a plain file"):
        read_own()
    home.unlink()
    (tmp_path / "elsewhere.yaml").write_text("webhook: http://127.0.0.1:9/\n")
    home.symlink_to(tmp_path / "elsewhere.yaml")
    with pytest.raises(MemberFileError, match="is a symbolic link"):
        read_own()
    home.unlink()
    home.write_bytes(b"#" * (1 << 17))
    with pytest.raises(MemberFileError, match="over 65536"):
        read_own()
    if os.geteuid() == 0:  # a file of another user's (a hard link, a copy left by an admin)
        home.write_text("webhook: http://127.0.0.1:9/\n")
        os.chown(home, 12345, -1)
        with pytest.raises(MemberFileError, match="is not yours"):
            read_own()


def test_the_body_slack_mattermost_ntfy_and_a_receiver_read_and_no_line_names_the_path():
    event = deliver.checked_event(
        b'{"event": "end", "job": {"id": "train", "state": "failed", "exit_code": 2, "host": "a", '
        b'"reason": "exit code 2", "extra": "dropped"}}'
    )
    body = deliver.body_of(event, Settings(webhook="https://ntfy.sh", topic="mine"))
    assert body["text"] == body["message"] == "gpuq: job train failed (exit 2) on a: exit code 2"
    assert body["topic"] == "mine" and body["event"] == "end" and body["job"]["id"] == "train"
    assert "extra" not in body["job"] and "topic" not in deliver.body_of(event, Settings(webhook="https://x"))
    assert deliver.where("https://hooks.slack.com/services/T0/B0/SECRET") == "https://hooks.slack.com"
    assert deliver.where("http://127.0.0.1:8080/topic-secret") == "http://127.0.0.1:8080"
    for bad in (b"[]", b'{"event": "other", "job": {"id": "x"}}', b'{"event": "end"}'):
        with pytest.raises(ValueError):
            deliver.checked_event(bad)


def test_the_root_part_runs_only_a_registered_program_and_only_as_a_member():
    programs = {"notify": ["/bin/true"]}
    queue_account = next(p for p in pwd.getpwall() if p.pw_uid != 0)  # an account this host has
    team = privsep.Account(uid=queue_account.pw_uid, gid=54321)
    with pytest.raises(Refused, match="no program 'sh' is registered"):
        privsep._program({"name": "sh", "uid": 1000, "stdin": ""}, team, programs)
    with pytest.raises(Refused, match="stdin must be text"):
        privsep._program({"name": "notify", "uid": 1000, "stdin": "x" * (1 << 17)}, team, programs)
    with pytest.raises(Refused, match="not a uid"):
        privsep._program({"name": "notify", "uid": "0", "stdin": ""}, team, programs)
    if os.geteuid() == 0:
        with pytest.raises(Refused, match="never runs anything as root"):
            privsep._program({"name": "notify", "uid": 0, "stdin": ""}, team, programs)
        with pytest.raises(Refused, match="the queue's own account runs no jobs"):
            privsep._program({"name": "notify", "uid": team.uid, "stdin": ""}, team, programs)


def test_the_root_part_runs_at_most_a_few_programs_as_one_member_at_once(monkeypatch):
    """A compromised queue account may forge an event (it chooses the text, never what runs),
    but cannot flood a member with programs: the ninth while eight run is refused."""
    member = Identity(4242, 4242, (4242,), "ana")
    monkeypatch.setattr(privsep, "_member", lambda uid, account: member)
    monkeypatch.setattr(privsep, "_programs", {4242: set(range(1, privsep.MAX_PROGRAMS_PER_MEMBER + 1))})
    with pytest.raises(Refused, match="8 programs run as ana already"):
        privsep._program(
            {"name": "notify", "uid": 4242, "stdin": "{}"}, privsep.Account(uid=999, gid=999), {"notify": ["/bin/true"]}
        )


def test_a_webhook_whose_port_is_out_of_range_is_refused_and_never_a_traceback():
    with pytest.raises(MemberFileError, match="port"):
        parse(b"webhook: http://127.0.0.1:99999/hooks/x\n", "notify.yaml")
    assert deliver.where("http://127.0.0.1:99999/hooks/x") == "http://127.0.0.1"


def test_one_try_is_bounded_whole_even_against_a_receiver_that_trickles(monkeypatch):
    """The socket's timeout bounds each wait only: a receiver that sends a header line every
    half second would hold a try for as long as it likes without the whole-try deadline."""
    import socket
    import threading
    import time

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            ends = time.monotonic() + 12  # without the deadline a try would last this long
            while not stop.is_set() and time.monotonic() < ends:
                try:
                    conn.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    break
                time.sleep(0.3)
            conn.close()

    threading.Thread(target=trickle, daemon=True).start()
    monkeypatch.setattr(deliver, "WEBHOOK_TIMEOUT_S", 1.0)
    monkeypatch.setattr(deliver, "WEBHOOK_TRIES", 2)
    monkeypatch.setattr(deliver, "BACKOFF_S", (0.0,))
    said: list[str] = []
    monkeypatch.setattr(deliver, "say", said.append)
    try:
        began = time.monotonic()
        assert deliver.post(f"http://127.0.0.1:{server.getsockname()[1]}/x", {"text": "t"}, "job j end") is False
        assert time.monotonic() - began < 10  # two tries of 1 s (without the deadline: 12 s each)
    finally:
        stop.set()
        server.close()
    assert [line.split(": ")[-1] for line in said] == ["timed out (no whole answer within 1 s)"] * 2


def test_an_events_key_is_claimed_once_sent_or_being_sent_and_taken_over_from_a_dead_deliverer(
    tmp_path: Path,
):
    """A hand-over repeated after the worker's crash carries the same key: a second deliverer
    sends nothing while the first holds the mark (sending) or once it says sent; a mark left
    by a deliverer that died mid-send (unlocked, not sent) is taken over and sent."""
    home = str(tmp_path)
    key, other = watch.event_key("a", 12, 340, b"{}\n"), watch.event_key("a", 12, 341, b"{}\n")
    assert sentmarks.KEY_RE.fullmatch(key) and key != other and key != watch.event_key("b", 12, 340, b"{}\n")
    assert sentmarks.KEY_RE.fullmatch(watch.event_key("_gpu-1", 1, 0, b"x"))  # any host name
    first = sentmarks.claim(home, key)
    assert first.mark is not None and not first.skip and not first.note
    assert "sending it now" in (sentmarks.claim(home, key).skip or "")
    sentmarks.finish(first, time.time())
    assert "not sent twice" in (sentmarks.claim(home, key).skip or "")
    marks = tmp_path.joinpath(*sentmarks.SENT_DIR)
    (marks / other).write_bytes(b"")  # its deliverer died before it had tried
    taken = sentmarks.claim(home, other)
    assert taken.mark is not None and not taken.skip
    sentmarks.finish(taken, time.time())
    assert sorted(p.name for p in marks.iterdir()) == sorted([key, other])
    for bad in (None, "../../x", "..", "", "A" * 32, 7):
        job = {"id": "j"}
        assert deliver.checked_event(json.dumps({"event": "end", "job": job, "key": bad}).encode())["key"] is None
        if not isinstance(bad, int):
            assert sentmarks.claim(home, bad).note == "the worker gave no key"
    assert sentmarks.claim(None, key).note == "no HOME"


def test_old_marks_go_and_nothing_else_in_the_folder(tmp_path: Path):
    marks = tmp_path.joinpath(*sentmarks.SENT_DIR)
    marks.mkdir(parents=True)
    now = time.time()
    old = now - sentmarks.KEEP_S - 1
    names = {"old": "a" * 32, "young": "b" * 32, "making": f".{'c' * 32}.123", "other": "notes.txt", "dir": "d" * 32}
    for kind, name in names.items():
        (marks / name).mkdir() if kind == "dir" else (marks / name).write_text("x")
        if kind != "young":
            os.utime(marks / name, (old, old))
    claimed = sentmarks.claim(str(tmp_path), "e" * 32)
    sentmarks.finish(claimed, now)
    assert sorted(p.name for p in marks.iterdir()) == sorted([names["young"], names["other"], names["dir"], "e" * 32])


@pytest.mark.parametrize("plant", ["file", "link", "writable", "dangling"])
def test_a_marks_folder_that_cannot_be_used_is_said_and_the_event_sent(tmp_path: Path, plant: str):
    """Never taken for "sent before" (that would lose every message), and no link followed."""
    state = tmp_path / ".local" / "state" / "gpuq"
    state.mkdir(parents=True)
    elsewhere = tmp_path / "data"
    elsewhere.mkdir()
    (elsewhere / "results.csv").write_text("x")
    os.utime(elsewhere / "results.csv", (1e9, 1e9))
    if plant == "file":
        (state / "notify-sent").write_text("")
    elif plant == "link":
        (state / "notify-sent").symlink_to(elsewhere)
    elif plant == "dangling":
        (state / "notify-sent").symlink_to(tmp_path / "nowhere")
    else:
        (tmp_path / ".local").chmod(0o777)
    claimed = sentmarks.claim(str(tmp_path), "f" * 32)
    assert claimed.skip is None and claimed.mark is None and claimed.note, claimed
    said = "may be changed by others" if plant == "writable" else "not a folder"
    assert said in claimed.note
    sentmarks.finish(claimed, time.time())
    assert sorted(p.name for p in elsewhere.iterdir()) == ["results.csv"]
