"""The spool: records as files, atomic writes, claims by rename, transitions, events.

Every write is temp file + fsync + rename, so a reader never sees half a file. A transition
is enforced by `states.check_transition` and written by `transition` only.
"""

from __future__ import annotations

import errno
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuq.host.faults import io_fault, wall_time
from gpuq.host.files import read_json, write_json
from gpuq.model.record import Record, RecordError
from gpuq.model.states import State, check_transition
from gpuq.spool.layout import Layout


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
    return {
        "job": record.id,
        "from": old.value,
        "to": new.value,
        "attempt": record.attempt,
        "user": record.user,
        "queued_at": record.queued_at,
        "host": record.host,
        "gpus": record.gpus,
        "gpu_mem_mib": record.gpu_mem_mib,
        "exit_code": record.exit_code,
        "reason": reason or record.reason,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
    }


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
