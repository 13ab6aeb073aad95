"""Facts about this host that are side effects to read (boot id, process start times, mounts),
and this host's own files opened safely (a private directory, a log to append to, whether
anyone else could swap a path's parts).

It imports nothing but os, errno and stat (pathlib alone costs a cron start 15 ms): the
cron start's lock test (single_instance.py) checks its local directory with it.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
import struct

from gpuq.host.safefile import NotPlain, read_plain

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from typing import TypeVar

    PathT = TypeVar("PathT", str, Path)  # a name given as a str (single_instance) comes back a str

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """Changes at every reboot; tells a rebooted host's stale records from live ones."""
    override = os.environ.get("GPUQ_TEST_BOOT_ID")  # tests stand in a reboot
    if override:
        return override
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip().replace("-", "")
    except OSError:
        return "unknown-boot"


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot: with the pid it names one process
    for the life of the boot, so a recycled pid is never mistaken for our supervisor."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


class UnsafePath(PermissionError):
    """A path someone other than root and this process's account could swap: refused."""


MAX_LINK_HOPS = 40  # as the kernel's ELOOP
MAX_PATH = 4096  # as the kernel's PATH_MAX: links that grow a path beyond it are refused, not followed


def chain_problems(path: str | Path, trusted_uid: int) -> list[tuple[str, str, str]]:
    """(entry, why, fix) for each entry on the way to `path` that someone other than root and
    `trusted_uid` could change, and so make `path` name something of theirs: every existing
    prefix of the path as written (a symlink counts by its owner: its own mode means nothing),
    and at each link, every entry on the way to where it points, hop by hop (a link through a
    directory others can write is theirs to redirect, even when it ends somewhere safe). A
    sticky directory others can write (like /tmp) is fine: nobody can rename or remove what
    another put there. Group write is allowed only for group root. Empty when the whole chain
    is safe; the part from the first missing entry down is not judged (whoever creates it
    judges what it made)."""
    found: list[tuple[str, str, str] | None] = []
    pending, hops = os.path.abspath(path), 0
    while hops <= MAX_LINK_HOPS and len(pending) <= MAX_PATH:
        parts = [p for p in pending.split("/") if p]
        link = None
        # One prefix at a time: a walk stops at the first link, and a path of thousands of
        # components (a link's target may be 4 KB) must not be spelled out whole each hop.
        prefixes = ("/" + "/".join(parts[:i]) for i in range(len(parts) + 1))
        for depth, prefix in enumerate(prefixes):
            try:
                st = os.lstat(prefix)
            except OSError:
                return _problems(found)
            found.append(entry_problem(prefix, st, trusted_uid))
            if stat.S_ISLNK(st.st_mode):
                link = (prefix, parts[depth:])
                break
        if link is None:
            return _problems(found)
        prefix, rest = link
        try:
            target = os.readlink(prefix)
        except OSError:
            return _problems(found)
        # The rest of the path, now below the link's target (not normalized: a `..` after a
        # link is its target's parent, as the kernel resolves it).
        pending, hops = os.path.join(os.path.dirname(prefix), target, *rest), hops + 1
    too_far = "is reached through too many links, or too long a path"
    found.append((str(path), too_far, f"replace {path} by what it means"))
    return _problems(found)


def _problems(found: list[tuple[str, str, str] | None]) -> list[tuple[str, str, str]]:
    return [problem for problem in dict.fromkeys(found) if problem]


def _prefixes(path: str) -> list[str]:
    """The path and every directory above it, from the top: "/a/b" -> ["/", "/a", "/a/b"]."""
    parts = [p for p in path.split("/") if p]
    return ["/"] + ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def entry_problem(
    path: str, st: os.stat_result, trusted_uid: int, sticky_ok: bool = True
) -> tuple[str, str, str] | None:
    """(path, why, fix) when someone other than root and `trusted_uid` could change the entry
    `path` whose lstat is `st`; None when nobody else can. `sticky_ok`: a sticky directory
    others can write passes (nobody can swap what another put there); not inside code, where
    a file anyone may add (a module's cached bytecode, say) is imported as it is."""
    if st.st_uid not in (0, trusted_uid):
        return (
            path,
            f"is owned by uid {st.st_uid}{_name(st.st_uid)}, not by root or this worker's account",
            f"chown root {path}",
        )
    if stat.S_ISLNK(st.st_mode):
        return None  # only its owner can change a link; where it leads is judged on its own
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid != 0)
    if others_write and not (sticky_dir and sticky_ok):
        return path, f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o})", f"chmod go-w {path}"
    if st.st_mode & stat.S_IWGRP and not (sticky_dir and sticky_ok):
        # Root's group may write; but with an ACL these bits are its mask, and a named entry
        # (a default ACL inherited from a shared parent: `setfacl -d -m g:team:rwx`) may let
        # a member write what the mode shows as root's alone.
        if (writer := _acl_writer(path, trusted_uid)) is not None:
            return path, f"can be written by {writer} through its ACL", f"setfacl -b {path}"
    return None


# POSIX ACLs as Linux stores them in the system.posix_acl_access attribute: a version, then
# (tag, permissions, id) entries; ACL_USER and ACL_GROUP are the named ones.
_ACL_HEADER, _ACL_ENTRY = struct.Struct("<I"), struct.Struct("<HHI")
_ACL_USER, _ACL_GROUP, _ACL_WRITE = 0x02, 0x08, 0x02


def _acl_writer(path: str, trusted_uid: int) -> str | None:
    """Who other than root and `trusted_uid` a named ACL entry of `path` lets write it
    ("uid 1001 (bob)", "gid 1003"); None: no such entry (or no ACL). Read without following
    a link."""
    try:
        acl = os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
    except OSError:
        return None  # no ACL (ENODATA), or a filesystem without them
    for offset in range(_ACL_HEADER.size, len(acl) - _ACL_ENTRY.size + 1, _ACL_ENTRY.size):
        tag, perm, who = _ACL_ENTRY.unpack_from(acl, offset)
        if perm & _ACL_WRITE and tag == _ACL_USER and who not in (0, trusted_uid):
            return f"uid {who}{_name(who)}"
        if perm & _ACL_WRITE and tag == _ACL_GROUP and who != 0:
            return f"gid {who}"
    return None


def _name(uid: int) -> str:
    """ " (bob)" for a uid with an account: a message names who could swap a path."""
    try:
        return f" ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return ""


def ensure_private_dir(
    path: PathT, what: str = "local_dir", others_read: bool = False, owner: int | None = None
) -> PathT:
    """`path` as a directory private to this process's account, created (with what is missing
    above it, each 0711: others may pass through, never list or change them) only where
    nobody else can swap any part of it: every existing entry
    from / down is root's or ours and not writable by others unless sticky (chain_problems),
    and `path` itself is a real directory (never a link) of ours with mode 0700 (0755 with
    `others_read`: only we may change it, others may read it, as jobs read the MPS pipe
    directories of the mps extra). A root worker writes its locks, lease, stop requests and job
    lock files there, and trusts what it reads back. `owner`: whose it is to be (another
    account than ours only for root, which makes the queue account's local_dir before it
    starts the worker as that account). Raises UnsafePath naming the entry, its owner and the
    fix; OSError when it cannot be created."""
    euid = os.geteuid() if owner is None else owner
    literal = os.path.abspath(path)
    _refuse_unsafe_chain(literal, euid, what)  # before creating anything under it
    final_mode = 0o755 if others_read else 0o700
    for prefix in _prefixes(literal)[1:]:
        try:
            os.lstat(prefix)
        except FileNotFoundError:
            try:
                mode = final_mode if prefix == literal else 0o711
                os.mkdir(prefix, mode)
                # Its mode whatever the umask, set on what was made: never through a link a
                # racer put by that name (judged below, with the rest of the chain).
                fd = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    if os.fstat(fd).st_uid == os.geteuid():
                        os.fchmod(fd, mode)
                        if prefix == literal and euid != os.geteuid():
                            os.fchown(fd, euid, -1)
                finally:
                    os.close(fd)
            except FileExistsError:
                pass  # made meanwhile, by someone: judged below
    _refuse_unsafe_chain(literal, euid, what)  # what was made, by us or by a racer in a sticky dir
    st = os.lstat(literal)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == euid and not st.st_mode & (0o022 if others_read else 0o077):
        return path
    kind = (
        "a symbolic link"
        if stat.S_ISLNK(st.st_mode)
        else "a directory"
        if stat.S_ISDIR(st.st_mode)
        else "not a directory"
    )
    fix = (
        f"chmod 700 {literal}"
        if stat.S_ISDIR(st.st_mode) and st.st_uid == euid
        else f"remove {literal} (the worker creates it)"
    )
    raise UnsafePath(
        f"{what} {literal} is {kind} owned by uid {st.st_uid}{_name(st.st_uid)} with mode "
        f"{stat.S_IMODE(st.st_mode):04o}, not a directory private to this worker (uid {euid}, "
        f"mode 0700). Fix: {fix}, or set local_dir in config.yaml"
    )


def _refuse_unsafe_chain(literal: str, euid: int, what: str) -> None:
    problems = chain_problems(literal, euid)
    if problems:
        entry, why, fix = problems[0]  # the topmost: the others may go with it
        # The directory itself, someone else's: whatever it holds may be planted, and handing
        # it over (chown) would make that the worker's. Only removing it is safe.
        fix = "" if entry == literal else f" or {fix}"
        raise UnsafePath(
            f"{what} {literal} is not safe: {entry} {why}, so others could swap the worker's "
            f"files in it for their own. Fix: remove {entry} (the worker creates what "
            f"is missing, private to it){fix}, or set local_dir in config.yaml to a directory "
            f"only root and uid {euid} can change"
        )


def open_to_append(path: Path, mode: int, owner_uid: int, what: str, whose: str) -> tuple[int, bool]:
    """Open `path` for appending, never through a link: created with `mode` (O_EXCL), or,
    when it exists, only a plain file with one link that `owner_uid` owns. Returns
    (descriptor, created). A name planted in a directory others can write (a symlink, a FIFO,
    a hard link, someone else's file) must not make this process write into another file:
    it raises PermissionError naming `what` ("log x.log") and `whose` ("the job's owner")."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode), True
    except FileExistsError:
        try:
            fd, created = os.open(path, flags), False
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO):  # a symlink, or a FIFO nobody reads
                raise PermissionError(e.errno, f"{what} is a link or a FIFO, not written through") from None
            raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (not created and st.st_uid != owner_uid):
        os.close(fd)
        raise PermissionError(errno.EPERM, f"{what} exists and is not a plain file of {whose}")
    if created:
        os.fchmod(fd, mode)  # whatever the umask
    return fd, created


# File systems where flock does not exclude across hosts, or is not local at all.
NETWORK_FILESYSTEMS = (
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "fuse.sshfs",
    "ceph",
    "glusterfs",
    "fuse.glusterfs",
    "lustre",
    "gpfs",
    "beegfs",
    "afs",
)
MOUNTINFO_ENV = "GPUQ_TEST_MOUNTINFO"  # tests stand in a mount table


def mount_of(path: Path) -> tuple[str, str, str] | None:
    """(mount point, file system type, mount options) of the file system holding `path`:
    the longest mount point above it in the mount table."""
    try:
        with open(os.environ.get(MOUNTINFO_ENV) or "/proc/self/mountinfo") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    target, found = os.path.realpath(path), None
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 6:
            continue
        mount_point = fields[4].replace("\\040", " ")
        after = line.split(" - ", 1)[1].split()
        options = ",".join(filter(None, (fields[5], after[2] if len(after) > 2 else "")))
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and (found is None or len(mount_point) >= len(found[0])):
            found = (mount_point, after[0], options)
    return found


def filesystem_type(path: Path) -> str | None:
    """The type of the file system holding `path`."""
    found = mount_of(path)
    return found[1] if found else None


def read_owned(path: "os.PathLike[str] | str", owners: "set[int] | frozenset[int]", cap: int) -> bytes | None:
    """The bytes of `path` when it is a plain file with one link, owned by one of `owners`
    and at most `cap` bytes, read without following a link or blocking on a FIFO
    (host/safefile.py); None for anything else (missing, a link, a FIFO, a device, someone
    else's file, too big)."""
    try:
        return read_plain(path, cap, owners)[0]
    except (NotPlain, OSError):
        return None
