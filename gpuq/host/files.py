"""Writing files so that a reader never sees half of one: temp file + fsync + rename; files
created owned by a given user; JSON in and out."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from gpuq.host import rootorders
from gpuq.host.faults import io_fault


def atomic_write(path: Path, data: bytes, mode: int = 0o640, durable: bool = True, exclusive: bool = False) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix.
    `durable=False` skips the fsync, for files rewritten every second (heartbeats). Not
    world-readable: records hold specs (the team reads them through the root's group;
    docs/security.md). The temp file is created exclusively, never through a link,
    relative to the directory's descriptor. `exclusive`: only where no file is at `path`
    (FileExistsError otherwise, and nothing changed): linked into place, not renamed."""
    tmp_name = f".{path.name[:100]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"  # within NAME_MAX
    dir_fd = open_dir(path.parent)
    try:
        fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                io_fault(f"write:{path.parent.name}")
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            if exclusive:
                os.link(tmp_name, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                os.unlink(tmp_name, dir_fd=dir_fd)
            else:
                os.rename(tmp_name, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp_name, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        os.close(dir_fd)


def open_dir(path: Path) -> int:
    """A descriptor of directory `path` itself, never of what a link there points to."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def set_aside_directory(path: Path, inbox: Path, kind: str) -> Path | None:
    """A member's directory found where the queue takes a file (a spec, a request), moved into
    the queue's tree by the rename that took it: renamed back into the inbox it came from,
    under a dot name the queue ignores, `.<name>.<hex>.not-a-<kind>`. Its maker removes it; the
    queue's account never enters, lists, closes or removes it (a tree of theirs may be 2000
    deep, or still open in a shell of theirs). Returns where it went; None when `path` is not
    a directory (or is gone)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
    except FileNotFoundError:
        return None
    aside = inbox / f".{path.name}.{os.urandom(4).hex()}.not-a-{kind}"
    os.rename(path, aside)
    return aside


def create_owned(
    directory: Path, stem: str, data: bytes, uid: int, gid: int = -1, mode: int = 0o644, mtime_ns: int | None = None
) -> Path:
    """A new file in `directory` (one only the worker's account writes) holding `data`,
    owned by `uid` — a spec the worker writes on a user's behalf (retry, edit, sweep members,
    a recreated claim), given to them by the root part (host/privsep.py). Created exclusively
    and never through a link; owner, mode and times
    are set on the descriptor. The caller renames or links it into place."""
    dir_fd = open_dir(directory)
    try:
        name = f".{stem}.{os.urandom(6).hex()}.tmp"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                os.fchmod(f.fileno(), mode & 0o755)  # never group- or world-writable: intake refuses those
                if mtime_ns is not None:  # the queue's place; only the owner may set it once given
                    os.utime(f.fileno(), ns=(mtime_ns, mtime_ns))
                if uid >= 0 and (uid != os.geteuid() or gid >= 0):  # last: then it is no longer ours
                    rootorders.give(f.fileno(), uid, gid)
        except BaseException:
            os.unlink(name, dir_fd=dir_fd)
            raise
        return directory / name
    finally:
        os.close(dir_fd)


def write_json(path: Path, obj: Any, durable: bool = True, exclusive: bool = False) -> None:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    atomic_write(path, data, durable=durable, exclusive=exclusive)


def read_json(path: Path, durable: bool = False) -> Any | None:
    """The parsed file, or None when it does not exist (a concurrent transition moved it).
    `durable`: also on the disk once this returns (for a file written with durable=False)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
            if durable:
                io_fault(f"fsync:{path.parent.name}")
                os.fsync(f.fileno())
            return json.loads(data)
    except FileNotFoundError:
        return None
