"""The proof of the privilege boundary, for the tests: in a process of gpuq's that runs as
root, a Python audit hook (PEP 578) records every action that reaches into a member's world.

Installed only when $GPUQ_TEST_AUDIT names a file (tests/test_privsep.py sets it for a root
worker and root's CLI); then, while the process's effective uid is 0, each of these is
judged as it happens:
- open, os.listdir, os.scandir, os.chdir of a path a member can write (the path, or a
  directory on the way to it, is owned by someone other than root and the queue's account,
  or writable by someone else and not sticky), imports included (they open the module's
  file), and an import while sys.path holds such a directory (or the current one, as '');
  a relative path counts as a member's (it may be relative to a descriptor of theirs);
- os.exec*, os.posix_spawn, subprocess.Popen, os.system of such a program or in such a cwd;
- os.kill and os.killpg of a process that is not this one's own descendant.
Each becomes one JSON line in that file: {"pid", "event", "what", "member": true|false,
"by": the innermost gpuq function on the stack}, so a test asserts that no event is a
member's and that every gpuq function that acted as root is one docs/security.md lists.
$GPUQ_TEST_AUDIT_TRUST names the queue account's uid (root is always trusted).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from types import FrameType

AUDIT_ENV = "GPUQ_TEST_AUDIT"
TRUST_ENV = "GPUQ_TEST_AUDIT_TRUST"
_PATH_EVENTS = ("open", "os.listdir", "os.scandir", "os.chdir")
_SPAWN_EVENTS = ("os.exec", "os.posix_spawn", "subprocess.Popen", "os.system")
_SIGNAL_EVENTS = ("os.kill", "os.killpg")
_busy = threading.local()


def install_if_asked() -> None:
    """Install the hook when the tests ask for it; nothing otherwise."""
    target = os.environ.get(AUDIT_ENV)
    if not target:
        return
    trusted = {0} | {int(u) for u in os.environ.get(TRUST_ENV, "").split(",") if u.isdigit()}
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def hook(event: str, args: tuple) -> None:
        if getattr(_busy, "on", False) or os.geteuid() != 0:
            return
        if (
            event not in _PATH_EVENTS
            and event not in _SPAWN_EVENTS
            and event not in _SIGNAL_EVENTS
            and event != "import"
        ):
            return
        _busy.on = True
        try:
            what, member = _judge(event, args, trusted)
            if what is not None:
                _write(target, {"pid": os.getpid(), "event": event, "what": what, "member": member, "by": _by(package)})
        except Exception as e:  # the hook must never break the code it watches
            _write(target, {"pid": os.getpid(), "event": event, "error": repr(e)})
        finally:
            _busy.on = False

    sys.addaudithook(hook)


def _write(target: str, line: dict) -> None:
    """One line, appended (opened each time: the code watched closes descriptors it did not
    open, as a keeper does); never an exception into the code watched."""
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _judge(event: str, args: tuple, trusted: set[int]) -> tuple[str | None, bool]:
    if event in _PATH_EVENTS:
        path = args[0] if args else None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return None, False  # a descriptor: whoever opened it was judged then
        if not path.startswith("/"):  # maybe relative to a descriptor, which the event does not name
            return f"{path} (relative: cannot be judged)", True
        return path, members_path(path, trusted)
    if event == "import":
        entries = args[2] if len(args) > 2 and isinstance(args[2], list) else []
        bad = [e or os.getcwd() for e in entries if isinstance(e, str) and members_path(e or os.getcwd(), trusted)]
        return (f"import {args[0]} with {bad} on sys.path", True) if bad else (None, False)
    if event in _SPAWN_EVENTS:
        program = args[0] if args else None
        cwd = args[2] if event == "subprocess.Popen" and len(args) > 2 else None
        if event == "os.system":
            return str(program), True  # a shell line: nothing of gpuq's runs one as root
        programs = [os.fsdecode(program)] if isinstance(program, (str, bytes)) else []
        cwds = [os.fsdecode(cwd)] if isinstance(cwd, (str, bytes)) else [os.getcwd()]
        return f"{programs} in {cwds}", any(members_path(p, trusted) for p in programs + cwds if p.startswith("/"))
    pid = args[0] if args else None
    if not isinstance(pid, int):
        return None, False
    what = f"signal {args[1] if len(args) > 1 else '?'} to {'group ' if event == 'os.killpg' else ''}{pid}"
    return what, not (_group_ours(pid) if event == "os.killpg" else _descendant(pid))


def members_path(path: str, trusted: set[int]) -> bool:
    """Whether a member could have put `path` where it is or changed it: some entry on the way
    (every prefix, as written) is owned by someone untrusted, or a directory on the way is
    writable by others and not sticky, or the entry itself is writable by others (a device,
    like /dev/null, excepted)."""
    full = os.path.abspath(path)
    parts = full.split("/")[1:]
    current = ""
    for i, part in enumerate(parts):
        current += "/" + part
        try:
            st = os.lstat(current)
        except OSError:
            return False  # not there: nothing of anyone's
        if st.st_uid not in trusted:
            return True
        if stat.S_ISLNK(st.st_mode):
            continue  # a link's mode means nothing; whose it is was judged above
        # A group other than root's may hold members (the team's does).
        others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
        if not others_write or stat.S_ISCHR(st.st_mode):  # /dev/null and the like: writable, harmless
            continue
        if i == len(parts) - 1 or not st.st_mode & stat.S_ISVTX:
            return True  # the thing itself, or a directory above where others may swap it
    return False


def _group_ours(pgid: int) -> bool:
    """Whether every process in group `pgid` is this one's descendant (an empty group is
    nobody's: a signal to it reaches no one)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    group = int(f.read().rsplit(b")", 1)[1].split()[2])
            except (OSError, ValueError, IndexError):
                continue
            if group == pgid and not _descendant(int(entry)):
                return False
    return True


def _descendant(pid: int) -> bool:
    me, seen = os.getpid(), 0
    while pid > 1 and seen < 64:
        if pid == me:
            return True
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        seen += 1
    return False


def _by(package: str) -> str | None:
    """The innermost function of gpuq's on the stack: module:function."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(package + os.sep) and not filename.endswith(os.sep + "audit.py"):
            module = os.path.relpath(filename, os.path.dirname(package))[:-3].replace(os.sep, ".")
            return f"{module}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None
