"""What a root worker refuses to trust, as sshd's StrictModes does: a config.yaml, a queue
root, a state/ or code that someone other than root and the worker's own account could
change. Whoever can write config.yaml sets alert_command (run by the worker) and admins;
whoever can write the code or the interpreter runs as root at the next cron start.

A file is safe when it, and every directory above it, is owned by root or the worker's
account and is not writable by others (group write is allowed only for group root). A
sticky directory above (like /tmp) is fine: nobody can rename what its owner put there.
"""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from .layout import Layout


def problems(layout: Layout, worker_uid: int, launcher: str | None = None) -> list[str]:
    """One line per unsafe path, each with its fix; empty when all is well."""
    found: list[str] = []
    for path, what in ((layout.config_file, "config.yaml"), (layout.root, "the queue root"),
                       (layout.state, "state/"), (layout.logs, "logs/")):
        _check_chain(path, what, worker_uid, found)
    code = Path(__file__).resolve().parent
    _check_chain(code, "gpuq's code", worker_uid, found)
    for module in sorted(code.glob("*.py")):
        _check_one(module, "gpuq's code", worker_uid, found)
    for extra in (launcher, sys.executable):
        if extra:
            _check_chain(Path(extra), "the worker's launcher" if extra == launcher else "the Python it runs on",
                         worker_uid, found)
    return list(dict.fromkeys(found))


def _check_chain(path: Path, what: str, worker_uid: int, found: list[str]) -> None:
    try:
        resolved = path.resolve(strict=True)
    except OSError:
        return  # missing: whoever needs it says so
    for p in (resolved, *resolved.parents):
        _check_one(p, what, worker_uid, found)


def _check_one(path: Path, what: str, worker_uid: int, found: list[str]) -> None:
    try:
        st = os.lstat(path)
    except OSError:
        return
    owners = {0, worker_uid}
    if st.st_uid not in owners:
        found.append(f"{path} ({what}) is owned by uid {st.st_uid}, not by root or this worker's account; "
                     f"anyone who owns it can change what the worker runs. Fix: chown root {path}")
        return
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
    if others_write and not sticky_dir:
        found.append(f"{path} ({what}) can be written by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                     f"anyone who can change it can change what the worker runs. Fix: chmod go-w {path}")
