"""Requests: how a team member asks for a change (docs/security.md).

Members create files only in jobs/ and in the sticky inbox requests/. Every verb that
changes something (cancel, hold, release, edit, retry, drain, resume, and an extra's, such as
book and unbook) writes one request file there; a worker applies it and writes a reply the CLI waits for.

- send (CLI): `requests/r-<ns>-<nonce>.json`, created exclusively, then renamed into place.
- take (worker): rename into state/requests/<host>@<name> — exactly one applier wins — then
  open the taken file without following links and check it there: a regular file with one
  link, under the size cap. Who asks is that file's owner; nothing written inside says so.
  Once taken, the file is in a directory only the worker's account writes: nobody can swap it.
- reply (worker): state/replies/<uid>-<name>, under the asker's uid (the request file's
  owner), then the taken file goes: a member who sends a request under the name of someone
  else's once it was taken (the name is free in the inbox then) gets his own reply, never
  hers. A worker that dies before its reply finds its taken requests at its next pass and
  applies them again (every verb is idempotent: a second cancel says the job already ended);
  a request that has a reply already is dropped unapplied (this host died after replying).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq import hooks
from gpuq.host import safefile
from gpuq.host.faults import wall_time
from gpuq.host.files import atomic_write, open_dir, read_json, set_aside_directory
from gpuq.host.safefile import NotPlain, read_plain
from gpuq.model.names import HOST_RE, JOB_ID_RE
from gpuq.spool.layout import Layout

REQUEST_RE = re.compile(r"^r-\d{1,20}-[0-9a-f]{16}\.json$")
VERBS = ("cancel", "hold", "submit-held", "release", "edit", "retry", "drain", "resume", "forget", "dismiss")
MAX_REQUEST_BYTES = 512 * 1024  # an edit carries a whole spec (at most 256 KiB)
MAX_IDS = 1000  # as many as an array has at most
REPLY_KEEP_S = 3600.0


class RequestError(Exception):
    """A request file that cannot be applied; the message says why (it is the reply)."""


@dataclass(frozen=True)
class Request:
    name: str
    verb: str
    uid: int  # the request file's owner: who asks
    ids: tuple[str, ...] = ()
    args: dict[str, Any] = field(default_factory=dict)
    sent_from: str = ""  # the host the CLI ran on (for messages only)
    by_root: bool = False  # sent by root's gpuq acting as the queue's account (Actor.of trusts it only then)


@dataclass(frozen=True)
class Reply:
    outcomes: tuple[tuple[bool, str], ...]  # (done, message) per id, or one for the request
    by: str = ""  # the host whose worker applied it
    uid: int | None = None  # who asked: the request file's owner (its CLI reads only its own)

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and all(done for done, _ in self.outcomes)

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "outcomes": [{"ok": done, "message": m} for done, m in self.outcomes],
            "by": self.by,
            "uid": self.uid,
            "t": wall_time(),
        }


# --- the CLI's side ----------------------------------------------------------------------


def send(
    layout: Layout, verb: str, ids: tuple[str, ...] = (), sent_from: str = "", by_root: bool = False, **args: Any
) -> str:
    """Write one request into the inbox; returns its name (the reply's name too). The file is
    written under a hidden name unrelated to the final one, then renamed into place: another
    member who sees the temp file cannot guess the final name (64 random bits) and take it
    first. A rename, not a link then an unlink: a worker refuses a request file with two
    links (a member's hard link to someone else's file), and a loaded machine let a worker
    take a linked request before its sender had unlinked the temp name."""
    message = {"verb": verb, "ids": list(ids), "args": args, "from": sent_from} | ({"root": True} if by_root else {})
    data = json.dumps(message).encode()
    if len(data) > MAX_REQUEST_BYTES:
        raise RequestError(f"the request is {len(data)} bytes, over the {MAX_REQUEST_BYTES} cap")
    dir_fd = open_dir(layout.requests)
    tmp = f".tmp-{secrets.token_hex(8)}"
    renamed = False
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        name = f"r-{time.time_ns()}-{secrets.token_hex(8)}.json"
        try:
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except FileNotFoundError:  # over NFS a lost reply turns a done rename into ENOENT
            if _exists(tmp, dir_fd):
                raise
        renamed = True  # the temp name is free, and may be someone else's file by now
        return name
    finally:
        if not renamed:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        os.close(dir_fd)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def reply_path(layout: Layout, name: str, uid: int) -> Path:
    return layout.replies / f"{uid}-{name}"


def read_reply(layout: Layout, name: str, uid: int) -> Reply | None:
    """The reply to request `name` that `uid` sent; None while there is none. A worker of an
    earlier version replied under the request's name alone, with the asker's uid or none:
    a reply there to someone else is not the sender's."""
    for path in (reply_path(layout, name, uid), layout.replies / name):
        try:
            data = read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("outcomes"), list) and data.get("uid", uid) == uid:
            break
    else:
        return None
    return Reply(
        tuple((bool(o.get("ok")), str(o.get("message", ""))) for o in data["outcomes"] if isinstance(o, dict)),
        str(data.get("by", "")),
        uid,
    )


def answered(layout: Layout, name: str, uid: int) -> bool:
    return os.path.lexists(reply_path(layout, name, uid))


# --- the worker's side -------------------------------------------------------------------


def waiting(layout: Layout) -> list[str]:
    """Names of the requests in the inbox, oldest first (other names are not requests)."""
    try:
        with os.scandir(layout.requests) as it:
            return sorted(e.name for e in it if REQUEST_RE.match(e.name))
    except FileNotFoundError:
        return []


def leftovers(layout: Layout, host: str) -> list[str]:
    """Requests this host took and never replied to (its worker died in between)."""
    prefix = f"{host}@"
    try:
        with os.scandir(layout.taken_requests) as it:
            return sorted(
                e.name[len(prefix) :]
                for e in it
                if e.name.startswith(prefix) and REQUEST_RE.match(e.name[len(prefix) :])
            )
    except FileNotFoundError:
        return []


def take(layout: Layout, host: str, name: str) -> Path | None:
    """Move a request out of the inbox; None: another worker (or its sender) was first."""
    taken = taken_path(layout, host, name)
    try:
        os.rename(layout.requests / name, taken)
    except FileNotFoundError:
        return None
    except PermissionError:  # a member's directory cannot leave their inbox (its `..` is theirs)
        if set_aside_directory(layout.requests / name, layout.requests, "request") is None:
            raise
        return None
    return taken


def taken_path(layout: Layout, host: str, name: str) -> Path:
    assert HOST_RE.match(host) and REQUEST_RE.match(name)
    return layout.taken_requests / f"{host}@{name}"


def read_taken(path: Path, name: str) -> Request:
    """The request in a taken file, checked on the open file (host/safefile.py). RequestError: not one."""
    try:
        raw, st = read_plain(path, MAX_REQUEST_BYTES)
    except NotPlain as e:
        if e.why == safefile.TOO_BIG:
            size = e.st.st_size if e.st else MAX_REQUEST_BYTES + 1
            raise RequestError(f"request {name}: {size} bytes, over the {MAX_REQUEST_BYTES} cap") from None
        raise RequestError(f"request {name}: not a plain file with one link; gpuq's CLI writes requests") from None
    except OSError as e:
        raise RequestError(f"request {name}: cannot be opened ({e.strerror})") from None
    return parse_request(raw, name, st.st_uid)


def parse_request(raw: bytes, name: str, uid: int) -> Request:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(f"request {name}: not JSON; gpuq's CLI writes requests") from None
    known = VERBS + tuple(hooks.registry().request_kinds)  # the core's, and the extras' (hooks.py)
    if not isinstance(data, dict) or data.get("verb") not in known:
        raise RequestError(f"request {name}: no known verb (one of {', '.join(known)})")
    ids, args = data.get("ids", []), data.get("args", {})
    if not isinstance(ids, list) or len(ids) > MAX_IDS or not isinstance(args, dict):
        raise RequestError(f"request {name}: ids must be a list of at most {MAX_IDS}, args an object")
    bad = next((i for i in ids if not isinstance(i, str) or not JOB_ID_RE.match(i)), None)
    if bad is not None:
        raise RequestError(f"request {name}: {str(bad)[:80]!r} is not a job id")
    sent_from = data.get("from", "")
    return Request(
        name,
        data["verb"],
        uid,
        tuple(ids),
        args,
        sent_from if isinstance(sent_from, str) and HOST_RE.match(sent_from) else "",
        data.get("root") is True,
    )


def finish(layout: Layout, host: str, name: str, reply: Reply | None) -> None:
    """Write the reply (readable by the team: it says what was done), then drop the request
    (None, or no asker known: drop it unanswered)."""
    if reply is not None and reply.uid is not None:
        atomic_write(reply_path(layout, name, reply.uid), json.dumps(reply.to_json()).encode(), mode=0o644)
    taken = taken_path(layout, host, name)
    try:
        os.unlink(taken)
    except IsADirectoryError:  # a directory posing as a request: back to its maker, set aside
        set_aside_directory(taken, layout.requests, "request")
    except FileNotFoundError:
        pass


def fair_order(layout: Layout, names: list[str]) -> list[str]:
    """The waiting requests taken in turn by sender (oldest first within each): a member who
    sends a thousand requests delays each other member's by one of theirs, not by all."""
    by_sender: dict[int, list[str]] = {}
    for name in names:
        try:
            uid = os.lstat(layout.requests / name).st_uid
        except FileNotFoundError:
            continue
        by_sender.setdefault(uid, []).append(name)
    queues = list(by_sender.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def sweep_replies(layout: Layout, now: float) -> None:
    """Replies an hour old (their CLI stopped waiting long ago), and temp files of senders
    killed mid-write."""
    for directory, pattern in ((layout.replies, None), (layout.requests, ".tmp-")):
        try:
            with os.scandir(directory) as it:
                for e in it:
                    if pattern is not None and not e.name.startswith(pattern):
                        continue
                    try:
                        if e.stat(follow_symlinks=False).st_mtime < now - REPLY_KEEP_S:
                            os.unlink(e.path)
                    except OSError:
                        pass
        except FileNotFoundError:
            pass
