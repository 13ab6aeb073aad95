"""A member's own notify settings: ~/.config/gpuq/notify.yaml, read only by processes that
run as that member (their `gpuq submit`, and the deliverer the root part starts as them).
It is the only place a destination is written: a webhook URL is often a secret (Slack's is
its key), so it is never copied into a spec, a record or a log the team or the queue reads.

The file is read as hostile input even so (a link planted by someone else, a FIFO, a huge
or broken file must not hang or mislead the deliverer): a plain file of the reader's own,
that no one else may write, opened without following a link or blocking, at most
MAX_BYTES, strict YAML with known keys only.
"""

from __future__ import annotations

import argparse
import errno
import os
import pwd
import re
import stat
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from gpuq.extras.notify.events import words
from gpuq.model.errors import SpecError
from gpuq.model.strict_yaml import load_yaml

MAX_BYTES = 1 << 16
KEYS = ("webhook", "topic", "mail", "command", "sendmail", "on")
MAIL_RE = re.compile(r"[^\s@<>,;\"'\\]{1,64}@[A-Za-z0-9.-]{1,190}")
TOPIC_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # ntfy's rule for a topic's name


class MemberFileError(Exception):
    """The member's notify.yaml cannot be used; the message names the file, the problem and the fix."""


@dataclass(frozen=True)
class Settings:
    webhook: str | None = None
    topic: str | None = None  # ntfy's topic, when the webhook is an ntfy server's root
    mail: str | None = None
    command: str | None = None
    sendmail: str | None = None  # a sendmail other than the system's (the member's own, run as them)
    on: tuple[str, ...] = ()  # the default events `gpuq submit` writes into a spec


def own_file() -> Path:
    """~/.config/gpuq/notify.yaml of this process's user: $HOME (the root part sets it from
    the account, as a job's), else the account's home."""
    home = os.environ.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir
    return Path(home) / ".config" / "gpuq" / "notify.yaml"


def read_own(missing_ok: bool = False) -> Settings | None:
    """This user's settings; None when there is no file and `missing_ok`. Raises MemberFileError."""
    path = own_file()
    try:
        raw = _read(path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise MemberFileError(f"{path}: there is none. Fix: write it (gpuq/extras/notify/README.md)") from None
    return parse(raw, str(path))


def _read(path: Path) -> bytes:
    """The file's bytes: only a plain file of this user's that nobody else may write, in a
    directory nobody else may write, opened without following a link and without blocking."""
    me = os.getuid()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileNotFoundError(str(path)) from None
        if e.errno == errno.ELOOP:
            raise MemberFileError(f"{path} is a symbolic link. Fix: make it a plain file of your own") from None
        raise MemberFileError(f"{path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MemberFileError(f"{path} is not a plain file. Fix: make it a plain file of your own")
        if st.st_uid != me:
            raise MemberFileError(f"{path} is not yours (uid {st.st_uid}). Fix: make it a plain file of your own")
        if st.st_mode & 0o022:
            raise MemberFileError(f"{path} may be written by others. Fix: chmod go-w {path}")
        folder = os.stat(path.parent)
        if folder.st_uid not in (me, 0) or folder.st_mode & 0o022:
            raise MemberFileError(f"{path.parent} may be changed by others. Fix: chmod go-w {path.parent}")
        if st.st_size > MAX_BYTES:
            raise MemberFileError(f"{path} is {st.st_size} bytes, over {MAX_BYTES}. Fix: it is a few lines")
        data = os.read(fd, MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise MemberFileError(f"{path} is over {MAX_BYTES} bytes. Fix: it is a few lines")
        return data
    finally:
        os.close(fd)


def parse(raw: bytes, where: str) -> Settings:
    """The settings in `raw` (the file named `where`). Raises MemberFileError."""
    try:
        data = load_yaml(raw, where)
    except SpecError as e:
        raise MemberFileError(str(e)) from None
    if data is None:
        return Settings()
    if not isinstance(data, dict):
        raise MemberFileError(f"{where}: not a mapping. Fix: write lines like `webhook: https://...`")
    if True in data and "on" not in data:  # YAML 1.1 reads a bare `on` as true (GitHub Actions' `on:` too)
        data["on"] = data.pop(True)
    for key in data:
        if key not in KEYS:
            raise MemberFileError(f"{where}: unknown key {str(key)[:40]!r}. Fix: use {', '.join(KEYS)}")
    values: dict = {}
    for key in ("webhook", "topic", "mail", "command", "sendmail"):
        value = data.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip() or "\0" in value):
            raise MemberFileError(f"{where}: {key} must be text. Fix: {key}: ... on one line")
        values[key] = value.strip() if isinstance(value, str) else None
    if values["webhook"] and not values["webhook"].startswith(("http://", "https://")):
        raise MemberFileError(f"{where}: webhook must be an http:// or https:// URL")
    if values["webhook"] and not _port_ok(values["webhook"]):
        raise MemberFileError(f"{where}: webhook's port is not a number from 1 to 65535")
    if values["topic"] and not TOPIC_RE.fullmatch(values["topic"]):
        raise MemberFileError(f"{where}: topic must be letters, digits, _ and -, at most 64 (ntfy's rule)")
    if values["mail"] and not MAIL_RE.fullmatch(values["mail"]):
        raise MemberFileError(f"{where}: mail must be one address, like you@example.org")
    if values["sendmail"] and not values["sendmail"].startswith("/"):
        raise MemberFileError(f"{where}: sendmail must be an absolute path")
    try:
        on = words(data["on"]) if data.get("on") not in (None, []) else []
    except ValueError as e:
        raise MemberFileError(f"{where}: on {e}. Fix: e.g. `on: [end, fail]`") from None
    return Settings(on=tuple(on), **values)


def submit_default() -> list[str] | None:
    """The submitter's own default events for `gpuq submit` (hooks.SpecField.submit_default):
    `on:` in their ~/.config/gpuq/notify.yaml, or None without one. ValueError says why the
    file gives none."""
    try:
        found = read_own(missing_ok=True)
    except MemberFileError as e:
        raise ValueError(str(e)) from None
    return list(found.on) if found is not None and found.on else None


def destinations_problem() -> str | None:
    """Why the submitter's own file sends nothing (none, unreadable, or naming no webhook, mail
    or command), or None."""
    try:
        found = read_own(missing_ok=True)
    except MemberFileError as e:
        return str(e)
    if found is None:
        return "~/.config/gpuq/notify.yaml: there is none. Fix: write it (gpuq/extras/notify/README.md)"
    if not (found.webhook or found.mail or found.command):
        return "~/.config/gpuq/notify.yaml names no webhook, mail or command. Fix: add one"
    return None


def _port_ok(url: str) -> bool:
    try:
        port = urllib.parse.urlsplit(url).port
    except ValueError:
        return False
    return port is None or 0 < port < 65536


def from_options(args: argparse.Namespace) -> str | None:
    """--notify WHEN, as the spec's field (the spec's check judges it, naming --notify). Its
    destinations are in the submitter's own file: where that gives none, say so now, not only
    in a worker's log when the job ends."""
    if args.notify and (problem := destinations_problem()) is not None:
        print(f"gpuq submit: warning: --notify {args.notify}: {problem}; nothing will be sent", file=sys.stderr)
    return args.notify or None
