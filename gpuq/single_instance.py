"""One worker per host and root: the lock test a cron start makes before anything else.

Cron starts `python worker.py` every minute on every box, and a start that finds its worker
running must cost no more than the interpreter itself: this module imports nothing but os,
fcntl and hostinfo (itself os alone), so `worker.py` can ask it before loading argparse,
PyYAML or the rest of gpuq.
"""

from __future__ import annotations

import fcntl
import os
import stat

from gpuq.host.hostinfo import ensure_private_dir
from gpuq.host.privsep import regular_uid

WORKER_LOCK_NAME = "worker.lock"
ANOTHER_WORKER_RUNS = -1


def this_host() -> str:
    """The host name gpuq uses: the short hostname (a worker may override it with --host)."""
    return os.uname().nodename.split(".")[0] or "localhost"  # gethostname(), without loading socket


FAKE_GPUS_ENV = "GPUQ_FAKE_GPUS"  # fake GPUs for a box without any (host/fake_nvml.py)


def fake_gpus_dir(local_dir: str | os.PathLike) -> str:
    """Where a box's fake GPUs live: beside its local dir, which is private (the jobs, which
    run as their owners, read the fake GPUs and register their use there)."""
    return f"{os.fspath(local_dir)}-fake"


def default_local_dir(root: str, host: str, root_started: bool | None = None) -> str:
    """Per-host local directory for locks that must be local (never on NFS). In RAM where
    there is one: its locks and markers mean nothing after a reboot, and creating a file
    there costs microseconds where a disk may take a millisecond.

    A root worker's is in /run, root's own tmpfs where nobody else can create anything: in
    a world-writable /dev/shm, a member who made /dev/shm/gpuq-0 before the worker's first
    start would own the parent of its directory, and could swap it for one of his own (then
    root writes through his links, signals his pids, records his results). Without a /run
    only root can change, /var/lib/gpuq (on disk, as root's alone), and only without that
    /var/tmp/gpuq-0 (its parents are checked, as always; a member who made it first keeps the
    worker from starting: an attack review's). A worker
    run by a user for themselves keeps /dev/shm/gpuq-<uid>. `root_started`: whether the
    worker is root's, run as root or by a root starter as the queue's account (the same
    directory, whoever asks; rootorders.root_started); default: whether this process is root."""
    import hashlib  # here: it loads OpenSSL, which would make every supervisor fork slower

    digest = hashlib.sha1(root.encode()).hexdigest()[:10]
    euid = os.geteuid()
    if euid == 0 if root_started is None else root_started:
        base = next((f"{d}/gpuq" for d in ("/run", "/var/lib") if _only_root_can_change(d)), "/var/tmp/gpuq-0")
    else:
        base = f"{'/dev/shm' if os.path.isdir('/dev/shm') else '/tmp'}/gpuq-{euid}"
    return f"{base}/{host}-{digest}"


def _only_root_can_change(directory: str) -> bool:
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def take_worker_lock(lock_path: str) -> int | None:
    """The worker's single-instance lock: an exclusive flock on a descriptor held for the
    worker's life. Close-on-exec, so no job or helper inherits it; flock (not fcntl locks)
    so it survives the daemonizing forks. None when another process holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def holds_lock_at(fd: int, lock_path: str) -> bool:
    """Whether `fd` is the lock file at `lock_path` (a start handed a lock by the early scan
    checks it is the one its own local_dir has)."""
    try:
        held, there = os.fstat(fd), os.lstat(lock_path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


_VALUED_OPTIONS = ("--root", "--host", "--fake-gpus")
_FLAGS = ("--foreground",)  # --verbose wants the full start's word
_HOST_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_HOST_REST = _HOST_FIRST + "."


def _plain_cron_start(argv: list[str]) -> dict[str, str] | None:
    """The options of a plain cron start, read as argparse reads them; None for anything else
    (an option this scan does not know or that argparse would abbreviate, one given twice, one
    without a value, a stray word): the full start then decides, with argparse's own words."""
    found: dict[str, str] = {}
    rest = iter(argv)
    for arg in rest:
        name, eq, value = arg.partition("=")
        if name in _FLAGS and not eq:
            value = ""
        elif name in _VALUED_OPTIONS:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-"):
                return None
        else:
            return None
        if name in found:
            return None
        found[name] = value
    return found


def _host_name(name: str) -> bool:
    """model/names.HOST_RE, without loading `re`."""
    return 0 < len(name) <= 64 and name[0] in _HOST_FIRST and all(c in _HOST_REST for c in name[1:])


def lock_at_cron_start(argv: list[str], launcher_dir: str | None) -> int | None:
    """Take the worker lock before loading anything else, where that is safe to do without
    the full start's checks. Returns the held lock's descriptor, ANOTHER_WORKER_RUNS, or None
    when this scan cannot tell (a config that may move local_dir, a directory that is not
    ours, options it does not read as argparse would, no root named): then worker_main
    decides, and checks that a lock it is handed is the one its own local_dir has. The root is
    found as spool/layout.resolve_root finds it: --root, $GPUQ_ROOT, then `launcher_dir`."""
    options = _plain_cron_start(argv)
    if options is None:
        return None
    named = options.get("--root") or os.environ.get("GPUQ_ROOT") or launcher_dir
    if not named:
        return None
    root = os.path.realpath(named)
    host = options.get("--host") or this_host()
    if not _host_name(host):
        return None
    if _config_may_set_local_dir(os.path.join(root, "config.yaml")):
        return None
    local_dir = default_local_dir(root, host)
    owner = _queue_uid(root)
    if owner is not None and regular_uid(owner):
        return None  # a person's state/: the full start refuses it (strictmodes.queue_account_problem)
    try:
        # The queue account's, as the full start makes it (worker_main.local_dir_problem); a
        # directory others could swap: the full start says so.
        ensure_private_dir(local_dir, owner=owner)
    except OSError:
        return None
    try:
        fd = take_worker_lock(os.path.join(local_dir, WORKER_LOCK_NAME))
    except OSError:
        return None
    return ANOTHER_WORKER_RUNS if fd is None else fd


def _queue_uid(root: str) -> int | None:
    """Whose the worker's local_dir is: a root start's, the queue account's (the owner of the
    root's state/, host/privsep.Account); None (this process's own) otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        st = os.lstat(os.path.join(root, "state"))
    except OSError:
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else None


def _config_may_set_local_dir(config_path: str) -> bool:
    """False only when config.yaml surely leaves local_dir at its default: absent, commented
    out, or `local_dir:` with nothing after it. YAML is not parsed here (too slow to import);
    whatever this misses, worker_main finds: it checks the lock it is handed (holds_lock_at)."""
    try:
        with open(config_path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    lines = [line.split(b"#", 1)[0].rstrip() for line in text.splitlines()]
    for i, content in enumerate(lines):
        if b"\\" in content:
            return True  # an escape could spell the key (a double-quoted "local\x5fdir")
        if b"local_dir" in content and content.strip() != b"local_dir:":
            return True
        if content.strip() == b"local_dir:" and i + 1 < len(lines) and lines[i + 1][:1] in (b" ", b"\t"):
            return True  # its value on the next line
    return False
