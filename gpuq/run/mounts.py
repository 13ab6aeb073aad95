"""The host paths a root client mounts, opened as the owner and handed over pinned.

A root worker runs docker and rootful podman on the owner's behalf, and the runtime (root)
resolves each host path it mounts. So each such path (the workdir, the spec's mounts) is first
opened as the owner, refused when the owner cannot read it, and bind-mounted at a private path
of the worker's that the runtime gets instead (`stage_mounts`): the runtime mounts what the owner
could read when gpuq looked, whatever a symlink or a rename does to the path afterwards. The
bind is undone when the container is removed (run/containers.ContainerControl.remove).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import json
import os
import signal
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuq.host.owners import Identity
from gpuq.run.containers import ContainerRun

OPEN_AS_OWNER_TIMEOUT_S = 30.0  # a mount source on a hung file system must not hang the supervisor
MOUNTS_DIR = "mounts"  # in the worker's local_dir: the staged mount sources, per job
_MS_BIND, _MS_REC, _MNT_DETACH = 0x1000, 0x4000, 2


@dataclass(frozen=True)
class StagedMounts:
    """Private binds (`base/0`, `base/1`, ...) of the paths one container mounts."""

    base: Path

    def release(self) -> None:
        """Undo the binds and remove their mount points. Never a recursive removal: a bind
        that could not be undone keeps its directory (rmdir fails on it), and the owner's files."""
        try:
            names = [n for n in os.listdir(self.base) if n.isdigit()]
        except FileNotFoundError:
            return
        for target in (self.base / n for n in names):
            _libc().umount2(os.fsencode(target), _MNT_DETACH)  # fails harmlessly where nothing is mounted
            for remove in (os.rmdir, os.unlink):  # a directory or a file; a busy one stays
                try:
                    remove(target)
                    break
                except OSError:
                    pass
        try:
            os.rmdir(self.base)
        except OSError:
            pass


def stage_mounts(run: ContainerRun, owner: Identity, local_dir: Path, job_id: str) -> ContainerRun:
    """For a root client running a container on `owner`'s behalf (docker, rootful podman):
    each host path it mounts opened as the owner, then bind-mounted at a private path of the
    worker's that the runtime gets instead. Raises OSError naming a path the owner cannot read
    (or that does not exist: root's runtime would create it). The binds are undone by
    `run.staged.release()` (ContainerControl.remove does it)."""
    if run.client_as_owner or not run.volumes:
        return run
    sources = [run.argv[i].split(":", 1)[0] for i in run.volumes]
    fds = _open_as(owner, sources)
    base = _private_dir(Path(os.path.realpath(local_dir)) / MOUNTS_DIR) / job_id
    StagedMounts(base).release()  # what a killed supervisor of this job left
    argv = list(run.argv)
    try:
        os.mkdir(base, 0o700)
        for n, (index, fd) in enumerate(zip(run.volumes, fds)):
            target = base / str(n)
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.mkdir(target, 0o700)
            else:
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            if _libc().mount(f"/proc/self/fd/{fd}".encode(), os.fsencode(target), None, _MS_BIND | _MS_REC, None):
                code = ctypes.get_errno()
                raise OSError(
                    code,
                    f"mount source {sources[n]} cannot be bound for the runtime ({os.strerror(code)}: "
                    "a root worker needs CAP_SYS_ADMIN to hand it over safely)",
                    sources[n],
                )
            argv[index] = f"{target}:{argv[index].split(':', 1)[1]}"
    except BaseException:
        StagedMounts(base).release()
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return dataclasses.replace(run, argv=argv, staged=StagedMounts(base))


def release_leftover_mounts(local_dir: Path, job_id: str) -> None:
    """The private binds of an attempt whose supervisor was killed before it undid them."""
    StagedMounts(Path(os.path.realpath(local_dir)) / MOUNTS_DIR / job_id).release()


def _open_as(owner: Identity, paths: list[str]) -> list[int]:
    """Each path opened (O_PATH) by a child that has become `owner` (groups, gid, uid), and
    checked readable by it; the descriptors come back over a socket. The kernel decides, with
    the owner's whole identity: os.access in a root process would ask about root's real uid."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the child: no Python code of the supervisor's runs here, and it ends in _exit
        status = 1
        try:
            ours.close()
            os.setgroups(list(owner.groups))
            os.setgid(owner.gid)
            os.setuid(owner.uid)
            fds: list[int] = []
            refused: list[object] | None = None
            for path in paths:
                try:
                    fds.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
                except OSError as e:
                    refused = [path, e.errno]
                    break
                if not os.access(f"/proc/self/fd/{fds[-1]}", os.R_OK):  # uid == euid: the owner's answer
                    refused = [path, errno.EACCES]
                    break
            socket.send_fds(theirs, [json.dumps(refused).encode()], [] if refused else fds)
            status = 0
        finally:
            os._exit(status)
    theirs.close()
    try:
        ours.settimeout(OPEN_AS_OWNER_TIMEOUT_S)
        message, fds, _, _ = socket.recv_fds(ours, 65536, len(paths))
    except OSError as e:  # a timeout too: a hung file system
        os.kill(pid, signal.SIGKILL)
        raise OSError(
            errno.ETIMEDOUT,
            f"mount sources {', '.join(paths)} could not be opened as {owner.name} "
            f"within {OPEN_AS_OWNER_TIMEOUT_S:g} s ({e})",
            paths[0],
        ) from None
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if not message:  # the child could not become the owner, or died
        raise OSError(errno.EIO, f"mount sources {', '.join(paths)} could not be checked as {owner.name}", paths[0])
    refusal = json.loads(message)  # the child's [path, errno], or null
    if refusal is None and len(fds) == len(paths):
        return fds
    for fd in fds:
        os.close(fd)
    path, code = refusal if refusal else (paths[0], errno.EIO)
    what = (
        "does not exist"
        if code == errno.ENOENT
        else f"is not readable by {owner.name}"
        if code in (errno.EACCES, errno.EPERM)
        else f"cannot be opened by {owner.name} ({os.strerror(code)})"
    )
    raise OSError(code, f"mount source {path} {what}", path)


def _private_dir(path: Path) -> Path:
    """`path`, a 0700 directory of this (root) process, whose every parent only root can
    change (or is sticky): a path handed to the runtime must keep naming what gpuq put there."""
    path.mkdir(mode=0o700, exist_ok=True)
    for d in [path, *path.parents]:
        st = os.lstat(d)
        if (
            not stat.S_ISDIR(st.st_mode)
            or st.st_uid != os.geteuid()
            or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX)
            or (d == path and st.st_mode & 0o077)
        ):
            raise PermissionError(
                errno.EPERM,
                f"{d} can be changed by others, so the job's mounts cannot be "
                "handed to the runtime safely: set local_dir in config.yaml to a directory only "
                "root can change",
                str(d),
            )
    return path


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc
