"""Facts about this host that are side effects to read (boot id, process start times, mounts),
and this host's own files opened safely (a private directory, a log to append to)."""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """Changes at every reboot; tells a rebooted host's stale records from live ones."""
    override = os.environ.get("GPUQ_TEST_BOOT_ID")  # tests stand in a reboot
    if override:
        return override
    try:
        return BOOT_ID_FILE.read_text().strip().replace("-", "")
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


def ensure_private_dir(path: Path) -> Path:
    """Create a 0700 directory we own; refuse one that is a link or someone else's."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory owned by uid {os.getuid()}; "
                              f"remove it or set local_dir in config.yaml")
    return path


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
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "ceph", "glusterfs",
                       "fuse.glusterfs", "lustre", "gpfs", "beegfs", "afs")
MOUNTINFO_ENV = "GPUQ_TEST_MOUNTINFO"  # tests stand in a mount table


def mount_of(path: Path) -> tuple[str, str, str] | None:
    """(mount point, file system type, mount options) of the file system holding `path`:
    the longest mount point above it in the mount table."""
    table = Path(os.environ.get(MOUNTINFO_ENV) or "/proc/self/mountinfo")
    try:
        lines = table.read_text().splitlines()
    except OSError:
        return None
    target, found = str(path.resolve()), None
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
