"""A running job's local files and what others learn from them: where they live (Runtime),
the job's liveness lock, the `started` marker kept in it, stop requests, the keeper's exit
file, the box's lease, and their cleanup.

All of them live in the host's local directory (never on NFS, where flock does not exclude)
and mean nothing after a reboot. The supervisor (run/supervise.py) writes the markers; the
keeper (host/keeper.py) writes the exit status through the descriptor it was handed; the
worker and the spawner read them.

The worker signals the supervisor a lock file names and records the result it holds, so the
directory is private to the queue's account (hostinfo.ensure_private_dir), no job holds a
descriptor on anything in it, and, in depth, what is read back counts only as a plain file of
that account (fstat of an O_NOFOLLOW open), and what is written goes through a fresh temp
file renamed into place, never through a link (but the lease, rewritten in place: the keepers
read it through descriptors of their own).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, TypeGuard

from gpuq.host import wire
from gpuq.host.files import atomic_write
from gpuq.host.hostinfo import process_start_ticks, read_owned
from gpuq.model.markers import OVER, Marker, parse_marker
from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.model.stops import Stop, StopOrder, cause_of
from gpuq.spool.layout import Layout


@dataclass(frozen=True)
class Runtime:
    """What a supervisor needs from its worker: all plain data."""

    layout: Layout
    host: str
    boot_id: str
    local_dir: Path
    grace_s: float
    lost_after_s: float
    extra_env: dict[str, str]  # e.g. GPUQ_FAKE_GPUS for fake GPUs
    allow_root_jobs: bool = False  # config allow_root_jobs: whether a root worker runs uid 0's jobs
    # The config keys only extras read (model/config.py KEYS_OF_EXTRAS), by Config attribute:
    # the extras' launch wrappers find theirs here (container_runtime, container_clients, ...).
    settings: dict[str, Any] = field(default_factory=dict)

    def lock_path(self, job_id: str) -> Path:
        return self.local_dir / "jobs" / f"{job_id}.lock"

    def stop_path(self, job_id: str) -> Path:
        return self.local_dir / "jobs" / f"{job_id}.stop"

    def outside_path(self, job_id: str) -> Path:
        """A process of the job's outside its process tree (the main process of its docker or
        podman container, which the runtime's daemon started), so that its GPU memory counts
        as the job's. The name is the one it had when only containers wrote it."""
        return self.local_dir / "jobs" / f"{job_id}.container"

    def exit_path(self, job_id: str) -> Path:
        """Where the keeper of the job's attempt writes its exit status (host/keeper.py), for a
        worker that settles the attempt after its supervisor died."""
        return self.local_dir / "jobs" / f"{job_id}.exit"

    def usage_path(self, job_id: str) -> Path:
        """GPU usage sampled by the worker (host/usage.py), read by the supervisor at the end."""
        return self.local_dir / "jobs" / f"{job_id}.usage"

    @property
    def lease_path(self) -> Path:
        """When this host's heartbeat was last written, on the host's monotonic clock."""
        return self.local_dir / "lease"

    def to_json(self) -> dict:
        return {
            "root": str(self.layout.root),
            "host": self.host,
            "boot_id": self.boot_id,
            "local_dir": str(self.local_dir),
            "grace_s": self.grace_s,
            "lost_after_s": self.lost_after_s,
            "extra_env": self.extra_env,
            "allow_root_jobs": self.allow_root_jobs,
            "settings": self.settings,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Runtime":
        return cls(
            Layout(Path(d["root"])),
            d["host"],
            d["boot_id"],
            Path(d["local_dir"]),
            d["grace_s"],
            d["lost_after_s"],
            d["extra_env"],
            d.get("allow_root_jobs", False),
            dict(d.get("settings") or {}),
        )


MAX_LOCAL_FILE = 1 << 20  # a marker, a lease or a stop reason is a few hundred bytes
# The box's own files (a lease, a stop order, a container's pid): its account's alone, and
# written whole over whatever is there (a link or someone else's file is replaced, never
# written through); local and meaningful for this boot only, so never synced.
LOCAL_MODE = 0o600


def read_own(path: Path) -> bytes | None:
    """The bytes of `path` when it is a plain file (one link) of this process's account, as
    the worker and its supervisors write them; None otherwise (missing, a link, a FIFO, a
    device, someone else's): never trusted to name a pid to signal or a result to record."""
    return read_owned(path, {os.geteuid()}, MAX_LOCAL_FILE)


def open_lease(rt: Runtime, write: bool = False) -> int:
    """The box's lease file, opened (and made, to write) never through a link; only a plain
    file of this account's. Raises OSError."""
    flags = (os.O_RDWR | os.O_CREAT if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(rt.lease_path, flags, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(errno.EPERM, "the lease is not a plain file of this account's", str(rt.lease_path))
    return fd


def write_lease(rt: Runtime, now_mono: float) -> None:
    """Renew the box's lease in place: keepers hold descriptors on this very file. A link or
    anything not a plain file of this account's found there is replaced, never written through."""
    try:
        fd = open_lease(rt, write=True)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EPERM):
            raise
        atomic_write(rt.lease_path, b"", LOCAL_MODE, durable=False)
        fd = open_lease(rt, write=True)
    try:
        wire.write_lease(fd, now_mono)
    finally:
        os.close(fd)


def lease_age(rt: Runtime) -> float | None:
    """Seconds since this host's heartbeat was last written (None: no worker wrote one yet).
    CLOCK_MONOTONIC is one clock for every process of the host, and never jumps."""
    try:
        fd = open_lease(rt)
    except OSError:
        return None
    try:
        return wire.lease_age(fd)
    finally:
        os.close(fd)


def read_exit(rt: Runtime, record: Record) -> dict | None:
    """What the keeper of this attempt wrote when its job ended ({"status", "fenced",
    "ended_at"}), or None. The supervisor removes any exit file before it writes the `started`
    marker, and every settling removes it, so one found beside this attempt's marker is this
    attempt's."""
    data = read_own(rt.exit_path(record.id))
    if not data:
        return None
    try:
        found = json.loads(data.rstrip(b"\0 "))
    except ValueError:
        return None
    return found if isinstance(found, dict) and type(found.get("status")) is int else None


def try_lock(fd: int) -> bool:
    """Take the job lock on `fd` without waiting. The primitive filelock's `lock_descriptor`
    uses on Unix (a whole-file flock), called directly: importing filelock 4 registers fork
    hooks that double the cost of every fork, and the spawner forks once per job."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def settle_lock(rt: Runtime, job_id: str) -> Iterator[bool]:
    """Take the job's lock for as long as a dead attempt is being settled. Yields False when
    the lock is held: the job's supervisor or process is alive (the kernel drops the lock
    when both are gone, and a recycled pid cannot hold it)."""
    try:
        fd = os.open(rt.lock_path(job_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield True  # no lock directory: nothing could be holding it
        return
    try:
        if not try_lock(fd):
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_marker(rt: Runtime, record: Record) -> Marker:
    """How far this attempt got (model/markers.py), as its supervisor marked it in the job's
    lock file: UNSTARTED for none of this attempt, or a lock file the worker's account did
    not write."""
    return parse_marker(read_own(rt.lock_path(record.id)), record.claim)


RESULT_KEYS = frozenset(
    {
        "started_at",
        "ended_at",
        "exit_code",
        "signal",
        "reason",
        "cause",
        "job_pid",
        "peak_gpu_mem_mib",
        "mean_gpu_mem_mib",
        "mean_gpu_util_pct",
        "peak_rss_mib",
        "peak_cpus",
        "cpu_s",
    }
)


def checked_result(result: object) -> tuple[State, dict]:
    """A result the supervisor kept in the lock file because the shared disk refused it:
    only the fields a result has (never an id, an owner, a spec, a claim), and an end state.
    Raises ValueError for anything else."""
    if not isinstance(result, dict):
        raise ValueError("a result is an object")
    state = State(result.get("state"))
    if not state.is_final or state is State.REJECTED:  # a timeout is an end too
        raise ValueError(f"{state.value} is not how a job ends")
    fields = {k: v for k, v in result.items() if k in RESULT_KEYS}
    fields["cause"] = cause_of(fields)
    return state, fields


def stop_ordered(rt: Runtime, job_id: str) -> Stop | None:
    """The stop the worker ordered for this job, if any (the stop file, run/joblocal.request_stop)."""
    data = read_own(rt.stop_path(job_id))
    return Stop.decode(data) if data is not None else None


def stop_order(rt: Runtime, job_id: str) -> StopOrder | None:
    """The stop ordered for this job as its box publishes it: why, and when (the stop file's
    mtime, on this box's clock)."""
    stop = stop_ordered(rt, job_id)
    if stop is None:
        return None
    try:
        since: float | None = os.stat(rt.stop_path(job_id), follow_symlinks=False).st_mtime
    except OSError:
        since = None
    return StopOrder(since, stop.cause)


def has_ended(rt: Runtime, record: Record) -> bool:
    """Whether this attempt's job is over for good (its supervisor marked it so once the job
    and its leftovers were gone) while its supervisor still records the result: the job's
    GPUs and CPU slot are free, though its record still says running for a moment."""
    return read_marker(rt, record).phase in OVER


def _live(pid: object, ticks: object) -> TypeGuard[int]:
    """Whether `pid` is a process (never 0 or -1, which signal a group or every process)
    that started at `ticks`: with them it names one process for the life of the boot."""
    return type(pid) is int and pid > 1 and type(ticks) is int and process_start_ticks(pid) == ticks


def supervisor_pid(rt: Runtime, record: Record) -> int | None:
    """The live supervisor of a local job, from its `started` marker (None if it is gone)."""
    marker = read_marker(rt, record)
    return marker.supervisor_pid if _live(marker.supervisor_pid, marker.ticks) else None


def write_outside_pid(rt: Runtime, record: Record, pid: int) -> None:
    data = {"claim": record.claim, "pid": pid, "ticks": process_start_ticks(pid)}
    try:
        atomic_write(rt.outside_path(record.id), json.dumps(data).encode(), LOCAL_MODE, durable=False)
    except OSError:
        pass  # its GPU memory counts as someone else's meanwhile: stricter, never overcommitted


def job_roots(rt: Runtime, record: Record) -> list[int]:
    """The processes whose descendants are the job: its live keeper, and the main process of
    the process outside its tree a launch wrapper reported (its container's, which a runtime's
    daemon started: supervise._note_outside)."""
    marker = read_marker(rt, record)
    pid = marker.keeper_pid
    if not _live(pid, marker.keeper_ticks):
        return []
    try:
        outside = json.loads(read_own(rt.outside_path(record.id)) or b"")
    except ValueError:
        return [pid]
    if not isinstance(outside, dict) or outside.get("claim") != record.claim:
        return [pid]
    opid = outside.get("pid")
    return [pid, opid] if _live(opid, outside.get("ticks")) else [pid]


def finish_local(rt: Runtime, record: Record) -> None:
    """Remove the attempt's local files and its claim; the record now holds the spec."""
    paths = [
        rt.stop_path(record.id),
        rt.usage_path(record.id),
        rt.outside_path(record.id),
        rt.exit_path(record.id),
        rt.lock_path(record.id),
    ]
    if record.claim:
        paths.append(rt.layout.claims / record.claim)
    for path in paths:
        path.unlink(missing_ok=True)


def request_stop(rt: Runtime, record: Record, stop: Stop) -> bool:
    """Ask the supervisor of a local running job to stop it (TERM, grace, KILL).
    Returns False when no live supervisor of this attempt could be found."""
    pid = supervisor_pid(rt, record)
    if pid is None:
        return False
    atomic_write(rt.stop_path(record.id), stop.encode(), LOCAL_MODE, durable=False)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True
