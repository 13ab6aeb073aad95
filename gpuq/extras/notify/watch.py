"""The notify extra's publisher: with each publication of its box's state (at most once per
poll interval) a worker reads what its own host appended to state/events/HOST.jsonl since
its cursor, and for each start or end of a job whose spec's `notify` asks for it hands one
delivery over: the root part starts the deliverer as the job's owner (host/rootorders.py
`program`); without a root part (a pass driven in-process), the worker starts it itself, only
for its own user's jobs. It never waits for a delivery: it reads what each deliverer says,
without blocking, capped, as safe text, into the worker's log.

Once per event, across crashes: each transition is logged once, by the host that made it,
and the cursor (inode, offset, first bytes of the log) is kept in the box's private local
directory together with the deliveries it has passed and not yet handed over (written
durably before the first is handed over, again after each): a worker killed meanwhile hands
the rest over when it starts again. None is lost. A kill between a hand-over and the write
that follows it hands that one over twice: each delivery carries its event's key (the host, the
log's inode, the line's offset and digest: one per event line), and the deliverer sends a key once
(sentmarks.py). A new box's cursor starts at the end of its log: no message for the past.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq.extras.notify.events import event_of
from gpuq.hooks import module_argv
from gpuq.host import rootorders
from gpuq.host.faults import crash_point
from gpuq.host.files import read_json, write_json
from gpuq.host.privsep import MAX_PROGRAMS_PER_MEMBER
from gpuq.host.wire import Refused, StarterGone
from gpuq.model.config import Config
from gpuq.model.text import safe_text
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event
from gpuq.worker.publishing import Publish, Published

log = logging.getLogger("gpuq.notify")
PROGRAM = "notify"  # its name in hooks.Registry.member_programs
CURSOR = "notify-cursor.json"
HEAD_BYTES = 256
MAX_BATCH_BYTES = 1 << 20  # of the event log read in one pass (the rest next pass)
MAX_LINE_BYTES = 1 << 20
MAX_SAID = 4096  # of one deliverer's output, logged
SAID_WAIT_S = 120.0  # after which a deliverer still talking is no longer listened to
MAX_LISTENING = 32  # deliverers at once per box: a member's 10,000 jobs ending together do not fork 10,000


@dataclass
class Delivery:
    """A deliverer handed over: what it has said so far, on a pipe read without blocking."""

    label: str
    uid: int
    fd: int
    since: float
    said: bytearray = field(default_factory=bytearray)


def start(layout: Layout, config: Config, host: str) -> Publish:
    """A hooks.BoxPublisher's start (worker.publishing.StartPublisher)."""
    return NotifyWatch(layout, host, layout.local_dir(host, config.local_dir)).publish


class NotifyWatch:
    def __init__(self, layout: Layout, host: str, local_dir: Path) -> None:
        self.layout, self.host = layout, host
        self.events = layout.host_events(host)
        self.cursor_path = local_dir / CURSOR
        self.listening: list[Delivery] = []
        self.children: list[subprocess.Popen] = []  # deliverers this worker started itself, until reaped
        try:
            cursor = read_json(self.cursor_path)
        except (OSError, ValueError):
            cursor = None
        # Deliveries read and marked, not yet handed over when the last worker stopped.
        self.pending: list[dict[str, Any]] = []
        if isinstance(cursor, dict) and {"inode", "offset", "head"} <= set(cursor):
            self.cursor = {k: cursor[k] for k in ("inode", "offset", "head")}
            found = cursor.get("pending")
            self.pending = [d for d in found if _delivery(d)] if isinstance(found, list) else []
        else:
            self.cursor = self._end_of_log()
            self._save()

    def _end_of_log(self) -> dict[str, Any]:
        try:
            with open(self.events, "rb") as f:
                st = os.fstat(f.fileno())
                return {"inode": st.st_ino, "offset": st.st_size, "head": f.read(HEAD_BYTES).hex()}
        except OSError:
            return {"inode": 0, "offset": 0, "head": ""}

    def _save(self) -> None:
        write_json(self.cursor_path, {**self.cursor, "pending": self.pending}, durable=True)

    def publish(self, published: Published) -> None:
        """Hand over what is pending, then read on. The cursor moves past a batch together
        with the batch itself, kept as pending; each delivery leaves it once handed over. A
        worker killed in between hands the rest over when it starts again: none is lost, and
        one is repeated only if the kill falls between a hand-over and its removal."""
        self._listen(published.mono)
        if not self.pending:
            room = MAX_LISTENING - len(self.listening)
            if room <= 0:
                return  # as many deliverers as a box runs at once: the next events wait in the log
            found, cursor = self._read_new(room)
            if cursor == self.cursor:
                return
            self.cursor, self.pending = cursor, found
            self._save()
            crash_point("notify:marked")  # the batch is marked read, and kept as pending
        busy = Counter(d.uid for d in self.listening)
        for delivery in list(self.pending):
            if len(self.listening) >= MAX_LISTENING or busy[delivery["uid"]] >= MAX_PROGRAMS_PER_MEMBER:
                continue  # its turn comes at a later pass
            self._hand_over(delivery, published.mono)
            crash_point("notify:handed")  # handed over, still pending: handed over again after a restart
            busy[delivery["uid"]] += 1
            self.pending.remove(delivery)
            self._save()

    def _read_new(self, room: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The deliveries (at most `room`) the lines appended since the cursor ask for, and the
        cursor after the last line read.
        A log moved away and begun anew (another inode, shorter, other first bytes) is read from
        its start."""
        try:
            fd = os.open(self.events, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return [], self.cursor
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            head = bytes.fromhex(self.cursor["head"])
            offset = self.cursor["offset"]
            if st.st_ino != self.cursor["inode"] or st.st_size < offset or os.pread(fd, len(head), 0) != head:
                offset, head = 0, b""
            if not head or len(head) < HEAD_BYTES:
                head = os.pread(fd, HEAD_BYTES, 0)
            f.seek(offset)
            found: list[dict[str, Any]] = []
            busy = Counter(d.uid for d in self.listening)
            start = offset
            while offset - start < MAX_BATCH_BYTES and len(found) < room:
                line = f.readline(MAX_LINE_BYTES)
                if not line.endswith(b"\n"):
                    break  # a line still being written: read it whole next time
                delivery = self._asked(line)
                if delivery is not None and busy[delivery["uid"]] >= MAX_PROGRAMS_PER_MEMBER:
                    break  # as many as the root part runs as one member: this one waits its turn, never lost
                if delivery is not None:
                    delivery["key"] = event_key(self.host, st.st_ino, offset, line)
                    found.append(delivery)
                    busy[delivery["uid"]] += 1
                offset += len(line)
        return found, {"inode": st.st_ino, "offset": offset, "head": head.hex()}

    def _asked(self, line: bytes) -> dict[str, Any] | None:
        """The delivery one event line asks for: its job's spec must ask for this event (the
        record, the queue's own file, says; the line only names the job)."""
        if b'"to"' not in line:
            return None
        event = checked_event(line)
        if event is None or event.get("by") not in (None, self.host):
            return None
        record = None
        for folder in (self.layout.finished, self.layout.running, self.layout.finished):  # it may move meanwhile
            try:
                record = read_json(self.layout.record(folder, event["job"]))
            except (OSError, ValueError):
                record = None
            if isinstance(record, dict) and isinstance(record.get("spec"), dict):
                break
            record = None
        if record is None or not (kind := event_of(record["spec"].get("notify"), event)):
            return None
        uid = record.get("uid")
        if type(uid) is not int or uid < 0:
            return None
        job = {
            "id": event["job"],
            "name": event.get("name"),
            "user": event.get("user"),
            "state": event.get("to"),
            "attempt": event.get("attempt"),
            "exit_code": event.get("exit_code"),
            "reason": event.get("reason"),
            "host": event.get("host") or self.host,
            "gpus": event.get("gpus"),
            "started_at": event.get("started_at"),
            "ended_at": event.get("ended_at"),
        }
        return {"uid": uid, "event": kind, "job": job}

    def _hand_over(self, delivery: dict[str, Any], now: float) -> None:
        """Start one deliverer as the job's owner; never wait for it."""
        label = f"job {delivery['job']['id']} {delivery['event']} (uid {delivery['uid']})"
        text = json.dumps({"event": delivery["event"], "job": delivery["job"], "key": delivery.get("key")})
        orders = rootorders.orders()
        try:
            if orders is not None:
                _, fd = orders.program(PROGRAM, delivery["uid"], text)
                proc = None
            elif delivery["uid"] == os.geteuid():
                proc, fd = _start_here(text)
            else:
                log.warning("notify: %s not sent: no root part here to run it as its owner", label)
                return
        except (Refused, StarterGone, OSError) as e:
            log.warning("notify: %s not sent: %s", label, safe_text(e))
            return
        os.set_blocking(fd, False)
        self.listening.append(Delivery(label, delivery["uid"], fd, now))
        if proc is not None:
            self.children.append(proc)

    def _listen(self, now: float) -> None:
        """What each deliverer said since the last pass, without blocking: logged once it has
        closed its output (or after SAID_WAIT_S). Its own children that exited are reaped."""
        self.children = [child for child in self.children if child.poll() is None]
        for delivery in list(self.listening):
            ended = False
            try:
                while chunk := os.read(delivery.fd, 4096):
                    delivery.said += chunk[: max(0, MAX_SAID - len(delivery.said))]
                else:
                    ended = True
            except BlockingIOError:
                pass
            except OSError:
                ended = True
            if ended or now - delivery.since > SAID_WAIT_S:
                self.listening.remove(delivery)
                self._done(delivery, None if ended else f"still running after {SAID_WAIT_S:g} s")

    def _done(self, delivery: Delivery, note: str | None) -> None:
        os.close(delivery.fd)
        lines = [safe_text(line)[:500] for line in delivery.said.decode(errors="replace").splitlines() if line]
        for line in lines or ["said nothing"]:
            if line.startswith("sent "):
                log.info("notify: %s", line)
            else:
                log.warning("notify: %s: %s", delivery.label, line)
        if note:
            log.warning("notify: %s: %s", delivery.label, note)


def event_key(host: str, inode: int, offset: int, line: bytes) -> str:
    """One event line's own key (sentmarks.KEY_RE): where it is, and what it says (a log begun
    anew may get the old one's inode back, and an event at the same offset then still differs
    in its time)."""
    return hashlib.sha256(f"{host}\0{inode}\0{offset}\0".encode() + line).hexdigest()[:32]


def _start_here(text: str) -> tuple[subprocess.Popen, int]:
    """The deliverer as this worker's own child (no root part: its jobs are its own user's)."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        proc = subprocess.Popen(
            module_argv("extras.notify.deliver"),
            stdin=subprocess.PIPE,
            stdout=write_end,
            stderr=write_end,
            cwd="/",
            start_new_session=True,
        )
    finally:
        os.close(write_end)
    assert proc.stdin is not None
    proc.stdin.write(text.encode())
    proc.stdin.close()
    return proc, read_end


def _delivery(found: Any) -> bool:
    """A pending delivery as _asked makes it (the file is the queue account's own, in the
    box's private directory: checked all the same before a uid is taken from it)."""
    return (
        isinstance(found, dict)
        and type(found.get("uid")) is int
        and found["uid"] >= 0
        and found.get("event") in ("start", "end", "fail")
        and isinstance(found.get("job"), dict)
        and isinstance(found["job"].get("id"), str)
        and isinstance(found.get("key", ""), str)
    )
