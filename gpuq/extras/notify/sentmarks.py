"""Once per event: the deliverer's marks, in its owner's own ~/.local/state/gpuq/notify-sent/.

The worker hands a delivery over again when it was killed between handing it over and striking
it off its list (watch.py), with the same key. A deliverer claims the key before it sends: a
mark named by the key, locked (flock) while it sends and saying `sent` once it has tried. A
second deliverer of the key finds it sent (nothing to do), locked (the first is sending now:
nothing to do), or neither (the first died mid-send, with its box: it sends).

The deliverer runs as the member, in the member's home, where others may have write access
by accident (a group-writable ~/.local under umask 002): the folder is walked one level at a
time without following a link, each level the member's own (or root's) and writable by nobody
else, and every mark is opened, created and removed through the folder's descriptor. A folder
that cannot be used is said, and the event is sent without a mark (a repeat is better than a
loss); a mark that is not a plain file is never taken for a sent event.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from dataclasses import dataclass

SENT_DIR = (".local", "state", "gpuq", "notify-sent")  # under the owner's HOME
KEY_RE = re.compile(r"[0-9a-f]{32}")  # watch.py event_key
MARK_RE = re.compile(r"\.?[0-9a-f]{32}(\.[0-9]+)?")  # a mark, or one being made (.KEY.PID)
SENT = b"sent\n"
KEEP_S = 30 * 86400  # a mark older is removed: no worker hands an event over again that late
MAX_LOOKED_AT = 10_000  # entries the sweep looks at per delivery (about 25 ms): a huge folder costs no delivery much


class Unusable(Exception):
    """The marks folder cannot be used; the message says which level and why."""


@dataclass
class Claim:
    """What a deliverer may do with one event's key."""

    skip: str | None = None  # why nothing is sent: sent before, or being sent now
    note: str | None = None  # why no mark could be made (the event is sent all the same)
    folder: int | None = None  # the marks folder's descriptor, while claimed
    mark: int | None = None  # the mark's, locked while sending


def claim(home: str | None, key: str | None) -> Claim:
    """Claim `key` before sending (see the module's text)."""
    if key is None or not KEY_RE.fullmatch(key):
        return Claim(note="the worker gave no key")
    if not home:
        return Claim(note="no HOME")
    try:
        folder = open_folder(home)
    except Unusable as e:
        return Claim(note=str(e))
    try:
        mark = _make(folder, key)
        if mark is not None:
            return Claim(folder=folder, mark=mark)
        return _existing(folder, key)
    except (OSError, Unusable) as e:
        os.close(folder)
        return Claim(note=f"{os.path.join(home, *SENT_DIR, key)}: {e}")


def finish(claimed: Claim, now: float) -> None:
    """The event was tried: its mark says so, and old marks go."""
    if claimed.mark is not None:
        try:
            os.pwrite(claimed.mark, SENT, 0)
        except OSError:
            pass
        os.close(claimed.mark)
    if claimed.folder is not None:
        sweep(claimed.folder, now)
        os.close(claimed.folder)


def open_folder(home: str) -> int:
    """The marks folder's descriptor; missing levels are made (0700)."""
    me = os.getuid()
    path = home
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise Unusable(f"{home}: {e.strerror}") from None
    try:
        _check(fd, path, me)
        for name in SENT_DIR:
            path = os.path.join(path, name)
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                below = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                raise Unusable(
                    f"{path}: {'not a folder of your own' if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror}"
                ) from None
            os.close(fd)
            fd = below
            _check(fd, path, me)
    except OSError as e:
        os.close(fd)
        raise Unusable(f"{path}: {e.strerror}") from None
    except Unusable:
        os.close(fd)
        raise
    return fd


def _check(fd: int, path: str, me: int) -> None:
    st = os.fstat(fd)
    if st.st_uid not in (me, 0) or st.st_mode & 0o022:
        raise Unusable(f"{path} may be changed by others (Fix: chmod go-w {path})")


def _make(folder: int, key: str) -> int | None:
    """A new mark, locked before it appears under its name (so no other deliverer sees it
    unlocked and unsent); None when one exists."""
    making = f".{key}.{os.getpid()}"
    try:
        os.unlink(making, dir_fd=folder)  # a dead process's of the same pid
    except FileNotFoundError:
        pass
    fd = os.open(making, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.link(making, key, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
    except FileExistsError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    finally:
        os.unlink(making, dir_fd=folder)
    return fd


def _existing(folder: int, key: str) -> Claim:
    fd = os.open(key, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Unusable("not a plain file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            skip: str | None = "another deliverer of the same event is sending it now"
        else:
            sent = os.pread(fd, len(SENT), 0) == SENT
            skip = "handed over again after the worker stopped; not sent twice" if sent else None
    except BaseException:
        os.close(fd)
        raise
    if skip is None:
        return Claim(folder=folder, mark=fd)  # its deliverer died before it had tried: this one sends
    os.close(fd)
    os.close(folder)
    return Claim(skip=skip)


def sweep(folder: int, now: float) -> None:
    """Marks older than KEEP_S, among the first MAX_LOOKED_AT entries; anything else is left."""
    try:
        with os.scandir(folder) as entries:
            for looked, entry in enumerate(entries):
                if looked >= MAX_LOOKED_AT:
                    break
                if not MARK_RE.fullmatch(entry.name):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_mtime < now - KEEP_S:
                        os.unlink(entry.name, dir_fd=folder)
                except OSError:
                    continue
    except OSError:
        pass
