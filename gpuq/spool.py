"""The spool: records as files, atomic writes, claims by rename, transitions, events.

Every write is temp file + fsync + rename, so a reader never sees half a file. A transition
is enforced by `states.check_transition` and written by `transition` only.
"""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .faults import io_fault, wall_time
from .layout import HOST_RE, JOB_ID_RE, Layout
from .states import State, check_transition


def atomic_write(path: Path, data: bytes, mode: int = 0o640, durable: bool = True) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never a mix.
    `durable=False` skips the fsync, for files rewritten every second (heartbeats). Not
    world-readable: records hold specs (the team reads them through the root's group;
    README, Security model). The temp file is created exclusively, never through a link,
    relative to the directory's descriptor."""
    tmp_name = f".{path.name[:100]}.{os.getpid()}.{os.urandom(4).hex()}.tmp"  # within NAME_MAX
    dir_fd = open_dir(path.parent)
    try:
        fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                io_fault(f"write:{path.parent.name}")
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
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


def close_moved_directory(path: Path) -> None:
    """A member's directory that posed as a spec and was moved into the worker's tree: made
    the worker's and closed (0700), so that nobody can add files inside the spool through it."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        if os.geteuid() == 0:
            os.lchown(path, 0, -1)
        os.chmod(path, 0o700)


def create_owned(directory: Path, stem: str, data: bytes, uid: int, gid: int = -1, mode: int = 0o644,
                 mtime: float | None = None) -> Path:
    """A new file in `directory` (one only the worker's account writes) holding `data`,
    owned by `uid` — a spec the worker writes on a user's behalf (retry, edit, sweep members,
    a recreated claim). Created exclusively and never through a link; owner, mode and times
    are set on the descriptor. The caller renames or links it into place."""
    dir_fd = open_dir(directory)
    try:
        name = f".{stem}.{os.urandom(6).hex()}.tmp"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                if os.geteuid() == 0 and uid >= 0:
                    os.fchown(f.fileno(), uid, gid)
                os.fchmod(f.fileno(), mode & 0o755)  # never group- or world-writable: intake refuses those
                if mtime is not None:
                    os.utime(f.fileno(), (mtime, mtime))
        except BaseException:
            os.unlink(name, dir_fd=dir_fd)
            raise
        return directory / name
    finally:
        os.close(dir_fd)


def write_json(path: Path, obj: Any, durable: bool = True) -> None:
    atomic_write(path, json.dumps(obj, separators=(",", ":"), sort_keys=True).encode(), durable=durable)


def read_json(path: Path) -> Any | None:
    """The parsed file, or None when it does not exist (a concurrent transition moved it)."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class Record:
    """A job as gpuq knows it: the spec plus what gpuq learned. Never holds runtime handles."""

    id: str
    state: State
    spec: dict[str, Any]                 # JobSpec.to_json()
    spec_text: str = ""                  # the file as the user wrote it
    user: str = ""
    uid: int = -1
    attempt: int = 1
    queued_at: float = 0.0               # the queue position (kept across requeues)
    host: str | None = None
    boot_id: str | None = None
    gpus: list[int] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    gpu_mem_mib: int | None = None       # memory charged per GPU: declared, or the whole GPU
    claim: str | None = None             # unique name of the claiming attempt
    claimed_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    job_pid: int | None = None
    peak_gpu_mem_mib: int | None = None  # usage.py: what the attempt used
    mean_gpu_mem_mib: int | None = None
    mean_gpu_util_pct: float | None = None
    peak_rss_mib: int | None = None
    peak_cpus: float | None = None
    cpu_s: float | None = None
    preempted: bool = False              # the attempt before this one was preempted
    time_limit_s: float | None = None    # the limits that apply (spec, else config): limits.py
    mem_limit_mib: int | None = None
    cpu_cores: list[int] = field(default_factory=list)
    held_at: float | None = None         # holds.py: when `gpuq hold` took it out of the queue
    restarts: int = 0                    # restarts.py: a service's restarts in this attempt
    slurm_id: str | None = None          # bridge.py: the Slurm job this attempt was handed to

    def to_json(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}  # shallow: JSON copies
        d["state"] = self.state.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Record":
        """Raises RecordError for anything but a record gpuq wrote: ids, hosts and claims are
        names that paths are made of, so they are checked wherever a record is read."""
        if not isinstance(d, dict):
            raise RecordError("not a JSON object")
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        try:
            known["state"] = State(d["state"])
            record = cls(**known)
        except (KeyError, ValueError, TypeError) as e:
            raise RecordError(f"not a record ({e})") from None
        record.check()
        return record

    def check(self) -> None:
        if not isinstance(self.id, str) or not JOB_ID_RE.match(self.id):
            raise RecordError(f"id {self.id!r} is not a job id")
        if self.host is not None and (not isinstance(self.host, str) or not HOST_RE.match(self.host)):
            raise RecordError(f"host {self.host!r} is not a host name")
        if self.claim is not None and (not isinstance(self.claim, str) or parse_claim_name(self.claim) is None
                                       or parse_claim_name(self.claim)[0] != self.id):
            raise RecordError(f"claim {self.claim!r} is not a claim of {self.id}")
        if type(self.uid) is not int or type(self.attempt) is not int or self.attempt < 1:
            raise RecordError("uid and attempt must be integers")
        if not isinstance(self.spec, dict) or not isinstance(self.gpus, list) or \
                not all(type(g) is int and g >= 0 for g in self.gpus):
            raise RecordError("spec must be an object and gpus a list of indices")


class RecordError(ValueError):
    """A file in a record directory that is not a record gpuq wrote."""


def state_dir(layout: Layout, state: State) -> Path:
    if state is State.RUNNING:
        return layout.running
    if state is State.REJECTED:
        return layout.rejected
    if state is State.HELD:
        return layout.held
    if state.is_final:
        return layout.finished
    raise ValueError(f"{state.value} records live in jobs/ as specs")


def write_record(layout: Layout, record: Record) -> Path:
    path = layout.record(state_dir(layout, record.state), record.id)
    write_json(path, record.to_json())
    return path


def read_record(path: Path) -> Record | None:
    """The record at `path`, None when it does not exist; RecordError when it is not one."""
    data = read_json(path)
    return Record.from_json(data) if data is not None else None


def running_records(layout: Layout) -> list[Record]:
    """Every running record of the root, whichever host runs it (a file that is not a
    record is skipped: one bad file must not hide the others)."""
    records = []
    for path in sorted(layout.running.glob("*.json")):
        try:
            record = read_record(path)
        except (RecordError, ValueError, OSError):
            continue
        # A record also in finished/ is a transition caught halfway: finished wins.
        if record is not None and not layout.record(layout.finished, record.id).exists():
            records.append(record)
    return records


def transition(layout: Layout, record: Record, new: State, event_host: str, **changes: Any) -> Record:
    """Move `record` to state `new` (checked against the table), write it, log the event.

    The new file is written before the old one is removed, so a crash in between leaves a
    duplicate that readers resolve in favour of the later state, never a lost job.
    """
    check_transition(record.state, new)
    updated = replace(record, state=new, **changes)
    write_record(layout, updated)
    old_dir, new_dir = state_dir(layout, record.state), state_dir(layout, new)
    if old_dir != new_dir:
        try:
            os.unlink(layout.record(old_dir, record.id))
        except FileNotFoundError:
            pass
    append_event(layout, event_host, transition_event(updated, record.state, new))
    return updated


def transition_event(record: Record, old: State, new: State, reason: str | None = None) -> dict[str, Any]:
    """What `gpuq report` and `status` read back: the job, its owner and queue time, and
    the attempt's placement, times and result."""
    return {"job": record.id, "from": old.value, "to": new.value, "attempt": record.attempt,
            "user": record.user, "queued_at": record.queued_at, "host": record.host, "gpus": record.gpus, "gpu_mem_mib": record.gpu_mem_mib,
            "exit_code": record.exit_code, "reason": reason or record.reason,
            "started_at": record.started_at, "ended_at": record.ended_at}


def record_start(layout: Layout, record: Record, event_host: str) -> None:
    """pending -> running: the claimed attempt's record, written before its job may start."""
    check_transition(State.PENDING, State.RUNNING)
    write_record(layout, record)
    append_event(layout, event_host, transition_event(record, State.PENDING, State.RUNNING))


def record_requeue(layout: Layout, record: Record, event_host: str, reason: str) -> None:
    """running -> pending, while the spec waits in claims/ under a claim of `event_host`
    (which puts it back in jobs/ next, or, after a crash, as an orphan claim). The attempt's
    record is kept in requeued/ first, so the next attempt is numbered +1; then the running
    record goes, so the id is free again."""
    check_transition(record.state, State.PENDING)
    write_json(layout.record(layout.requeued, record.id), replace(record, reason=reason).to_json())
    try:
        os.unlink(layout.record(state_dir(layout, record.state), record.id))
    except FileNotFoundError:
        pass
    append_event(layout, event_host, transition_event(record, record.state, State.PENDING, reason))


def keep_place(layout: Layout, job_id: str, uid: int, queued_at: float) -> None:
    """Before a worker puts a job's spec back into jobs/ (released, requeued): the place it
    had, for the spec's owner `uid`. A spec's own place is when its file landed, which a
    put-back file would lose."""
    if not (math.isfinite(queued_at) and queued_at > 0):
        return
    try:  # best effort: on a full disk the job goes back all the same, at the end of the queue
        layout.places.mkdir(exist_ok=True)
        write_json(layout.record(layout.places, job_id), {"uid": uid, "queued_at": queued_at})
    except OSError:
        pass


def kept_place(layout: Layout, job_id: str, uid: int) -> float | None:
    """The place kept for this owner's job, if any (read only from the worker's state/)."""
    try:
        kept = read_json(layout.record(layout.places, job_id))
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("uid") != uid:
        return None
    t = kept.get("queued_at")
    return float(t) if isinstance(t, (int, float)) and math.isfinite(t) and t > 0 else None


def forget_place(layout: Layout, job_id: str) -> None:
    layout.record(layout.places, job_id).unlink(missing_ok=True)


def next_attempt(previous: dict | None) -> int:
    """The attempt after the one kept in requeued/ (`previous`, read by the caller), or 1."""
    return previous["attempt"] + 1 if previous else 1


_event_fds: dict[Path, int] = {}
# A forked supervisor closes what it inherited; it must not write through stale numbers.
os.register_at_fork(after_in_child=_event_fds.clear)


def append_event(layout: Layout, host: str, event: dict[str, Any]) -> None:
    """One JSON line per transition in state/events/<host>.jsonl; only this host appends.
    The file stays open in a long-lived process (the worker appends one line per job)."""
    line = json.dumps({"t": wall_time(), "by": host, **event}, separators=(",", ":")) + "\n"
    path = layout.host_events(host)
    fd = _event_fds.get(path)
    if fd is not None and os.fstat(fd).st_nlink == 0:  # the log was moved away: start a new one
        os.close(fd)
        fd = None
    if fd is None:
        fd = _event_fds[path] = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    os.write(fd, line.encode())


# --- claims ------------------------------------------------------------------------------

def claim_name(job_id: str, host: str, boot_id: str, attempt: int) -> str:
    """A name no other claim can have: job, host, boot, pid, nonce, attempt."""
    return f"{job_id}@{host}@{boot_id[:8]}@{os.getpid()}@{os.urandom(4).hex()}@a{attempt}.yaml"


def parse_claim_name(name: str) -> tuple[str, str] | None:
    """claim file name -> (job id, host), or None if it is not a claim."""
    parts = name.split("@")
    if len(parts) != 6 or not name.endswith(".yaml") or "/" in name or "\0" in name:
        return None
    return (parts[0], parts[1]) if JOB_ID_RE.match(parts[0]) and HOST_RE.match(parts[1]) else None


def claim(layout: Layout, spec_path: Path, name: str) -> Path | None:
    """Take a pending spec by renaming it to a unique claim name. Exactly one claimer wins.

    A missing source means someone else took or cancelled it. Any error from the rename
    (over NFS a lost reply turns success into ENOENT) is settled by looking for our own
    unique destination.
    """
    dest = layout.claims / name
    try:
        os.rename(spec_path, dest)
        io_fault("rename:claim")
        return dest
    except OSError as e:
        if dest.exists():
            return dest
        if e.errno in (errno.ENOENT, errno.ESTALE):
            return None
        raise


def unclaim(claimed: Path, dest: Path) -> bool:
    """Put a claimed spec back into jobs/ without ever overwriting a file that a user put
    there meanwhile (link(2) fails if the name exists). False: the name was taken."""
    try:
        os.link(claimed, dest)
    except FileExistsError:
        return False
    os.unlink(claimed)
    return True


def claims_of(layout: Layout, job_id: str) -> list[Path]:
    return sorted(layout.claims.glob(f"{job_id}@*"))


# --- pending specs -----------------------------------------------------------------------

def pending_specs(layout: Layout, job_id: str) -> list[Path]:
    """Every file in jobs/ for this id (x.yaml and x.yml may both be there for a moment)."""
    return [p for p in (layout.jobs / f"{job_id}.yaml", layout.jobs / f"{job_id}.yml") if os.path.lexists(p)]


def pending_spec_path(layout: Layout, job_id: str) -> Path | None:
    for suffix in (".yaml", ".yml"):
        p = layout.jobs / f"{job_id}{suffix}"
        if os.path.lexists(p):
            return p
    return None


def has_record(layout: Layout, job_id: str) -> bool:
    """Whether an earlier or current attempt of this id has a record (ids are never reused)."""
    return any(layout.record(d, job_id).exists() for d in (layout.finished, layout.running, layout.held))
