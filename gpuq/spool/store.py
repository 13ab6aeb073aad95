"""The spool: records as files, atomic writes, claims by rename, transitions, events.

Every write is temp file + fsync + rename, so a reader never sees half a file; one record
skips the fsync, a start's, which the job's supervisor syncs (`StateChange`, `durable`). A
transition is checked and written by `StateChange` only (`transition` for one with nothing
else to move).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuq.host import rootorders
from gpuq.host.faults import io_fault, wall_time
from gpuq.host.files import read_json, write_json
from gpuq.model.names import HOST_RE, JOB_ID_RE, KEPT_APART
from gpuq.model.record import Record, RecordError, parse_claim_name
from gpuq.model.states import State, check_transition
from gpuq.model.stops import StopCause, cause_of
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
    """An update of a record within its state (a restart counted, a Slurm id noted); a change
    of state is a `StateChange`."""
    path = layout.record(state_dir(layout, record.state), record.id)
    write_json(path, record.to_json())
    return path


def read_record(path: Path, durable: bool = False) -> Record | None:
    """The record at `path`, None when it does not exist; RecordError when it is not one.
    `durable`: also on the disk once this returns (a start's record is written without)."""
    data = read_json(path, durable=durable)
    return Record.from_json(data) if data is not None else None


def torn_running_record(layout: Layout, job_id: str) -> bool:
    """Whether the job's running record is there but is not a record. A worker writes a
    start's record without an fsync, and the supervisor syncs it before the job starts: a
    power cut that took its data took the record of a job that never started."""
    try:
        read_record(layout.record(layout.running, job_id))
    except ValueError:  # not JSON, or not a record
        return True
    except OSError:
        pass  # unreadable for now (a disk error): no conclusion
    return False


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


class StateChange:
    """One job's change of state: the only way one is made. It is checked against the table
    when it is made, before it writes a record or an event, from the state the spool showed
    (`before`: the record read, or `found_job`: where the job's spec was found). Then `write`
    moves the job's record (all or nothing) and `log` appends the event. A caller that also
    moves the job's spec does so around these in the order its race needs: a cancel or a hold
    renames the spec first (that rename is what a claim races) and puts it back when the change
    is refused or cannot be written; a release or a retry writes first (a spec in jobs/ under a
    recorded id is refused) and `undo`es the write when its own move fails, before `log`.

    The new file is written before the old one is removed, so a crash in between leaves a
    duplicate that readers resolve in favour of the later state, never a lost job.
    """

    def __init__(
        self, layout: Layout, before: Record, new: State, event_host: str, durable: bool = True, **changes: Any
    ) -> None:
        """`durable=False`: the new record is written without an fsync, for a worker's start
        only, whose supervisor syncs it before the job starts (run/supervise.py): the fsync
        was the one disk wait on the worker's path per start. A power cut before that sync
        can leave it empty or torn, and then its job never started: the rebooted worker puts
        its claim back (worker/recovery.py, requeue_orphan_claims)."""
        check_transition(before.id, before.state, new)
        self.layout, self.before, self.host, self.durable = layout, before, event_host, durable
        self.after = replace(before, state=new, **changes)

    def _dir(self, state: State) -> Path | None:
        """Where a job in `state` has its record (none while pending or rejected: its spec says it)."""
        return None if state in (State.PENDING, State.REJECTED) else state_dir(self.layout, state)

    def _kept(self) -> Record | None:
        """Back to the queue after an attempt: that attempt's record, kept in requeued/ (the next
        attempt is numbered from it). A running attempt ends here, so it keeps this change's
        reason and cause; an ended one keeps its own."""
        if self.after.state is not State.PENDING:
            return None
        if self.before.state is State.RUNNING:
            return replace(self.after, state=State.RUNNING)
        return self.before if self._dir(self.before.state) == self.layout.finished else None

    def write(self) -> Record:
        """The job's records as the new state has them; all or nothing (a failed step undoes
        the ones before it, then raises)."""
        old_dir, new_dir = self._dir(self.before.state), self._dir(self.after.state)
        if self.before.state is State.PENDING and self.after.state is State.RUNNING:
            # A start creates the record, never replaces one: a box that froze between its
            # claim and this write, and was forgotten meanwhile (its claim put back and
            # started elsewhere), must not overwrite the other box's record when it wakes.
            path = self.layout.record(self.layout.running, self.after.id)
            write_json(path, self.after.to_json(), durable=self.durable, exclusive=True)
            return self.after  # nothing else moves: a pending job has no record to remove
        try:
            if (kept := self._kept()) is not None:
                write_json(self.layout.record(self.layout.requeued, kept.id), kept.to_json())
            if new_dir is not None:
                path = self.layout.record(new_dir, self.after.id)
                write_json(path, self.after.to_json(), durable=self.durable)
            if old_dir is not None and old_dir != new_dir:
                self.layout.record(old_dir, self.before.id).unlink(missing_ok=True)
        except OSError:
            try:
                self.undo()
            except OSError:
                pass  # a duplicate at worst: readers resolve it in favour of the later state
            raise
        return self.after

    def undo(self) -> None:
        """Put the records back as they were (the caller's own move failed before `log`)."""
        old_dir, new_dir = self._dir(self.before.state), self._dir(self.after.state)
        if old_dir is not None:
            write_json(self.layout.record(old_dir, self.before.id), self.before.to_json())
        if new_dir is not None and new_dir != old_dir:
            self.layout.record(new_dir, self.after.id).unlink(missing_ok=True)
        if self._kept() is not None:
            self.layout.record(self.layout.requeued, self.before.id).unlink(missing_ok=True)

    def log(self, **said: Any) -> None:
        """Append the event; `said`: what else its readers need (a refused spec's kept name)."""
        append_event(self.layout, self.host, {**transition_event(self.after, self.before.state), **said})


def transition(
    layout: Layout,
    before: Record,
    new: State,
    event_host: str,
    durable: bool = True,
    said: dict[str, Any] | None = None,
    **changes: Any,
) -> Record:
    """A `StateChange` with nothing else to move: check, write, log (`said`: as StateChange.log)."""
    change = StateChange(layout, before, new, event_host, durable, **changes)
    updated = change.write()
    change.log(**(said or {}))
    return updated


def found_job(layout: Layout, job_id: str, spec_path: Path, uid: int, user: str) -> Record:
    """A job known by its spec alone (pending, held or refused), as a `StateChange` starts from:
    in the state where its spec was found, at the attempt it waits to run (after a requeue,
    the one after the attempt kept in requeued/)."""
    attempt = next_attempt(kept_attempt(layout, job_id))
    return Record(id=job_id, state=spec_state(layout, spec_path), spec={}, user=user, uid=uid, attempt=attempt)


def kept_attempt(layout: Layout, job_id: str) -> dict | None:
    """The record of the job's last attempt, kept in requeued/ while it waits to run again
    (preempted, retried, lost); None where there is none, or none that can be read as one."""
    try:
        kept = read_json(layout.record(layout.requeued, job_id))
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and type(kept.get("attempt")) is int else None


def spec_state(layout: Layout, spec_path: Path) -> State:
    """The state a job is in whose spec was found at `spec_path` (a claim was taken from jobs/)."""
    parent = spec_path.parent
    if parent == layout.held:
        return State.HELD
    if parent == layout.rejected:
        return State.REJECTED
    if parent in (layout.jobs, layout.claims):
        return State.PENDING
    raise ValueError(f"{spec_path} is not where gpuq keeps specs")


def transition_event(record: Record, old: State) -> dict[str, Any]:
    """What `gpuq report` and `status` read back: the job, its owner and queue time, and
    the attempt's placement, times and result, and why it was stopped."""
    return {
        "job": record.id,
        "from": old.value,
        "to": record.state.value,
        "attempt": record.attempt,
        "user": record.user,
        "name": record.spec.get("name"),  # for `gpuq history --name`
        "queued_at": record.queued_at or None,  # 0: not known (a refused spec's)
        "host": record.host,
        "gpus": record.gpus,
        "gpu_mem_mib": record.gpu_mem_mib,
        "exit_code": record.exit_code,
        "signal": record.signal,  # what ended it where it did not exit: `history` shows sig9, as status does
        "reason": record.reason,
        "cause": record.cause.value if record.cause is not None else None,
        "started_at": record.started_at,
        "ended_at": record.ended_at,
    }


def append_note(layout: Layout, host: str, job_id: str, note: str, reason: str) -> None:
    """An event about a job that is not a change of its state (a warning, a stop asked for, a
    bridge adopting it): `{"note": ...}` instead of `from`/`to`, so the log of changes stays one."""
    append_event(layout, host, {"job": job_id, "note": note, "reason": reason})


def keep_place(layout: Layout, job_id: str, uid: int, queued_at: float) -> None:
    """Before a worker puts a job's spec back into jobs/ (released, requeued): the place it
    had, for the spec's owner `uid`. A spec's own place is when its file landed, which a
    put-back file would lose."""
    if not (math.isfinite(queued_at) and queued_at > 0):
        return
    try:  # best effort: on a full disk the job goes back all the same, at the end of the queue
        layout.make_state_dir(layout.places)
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


def forget_kept(layout: Layout, job_id: str) -> None:
    """A started attempt's record is on the disk: the attempt before it (kept in requeued/ to
    number this one) and the queue place it kept are done with. Only after that sync: a power
    cut that took the record must leave them, or the next attempt would be numbered 1 again,
    with its retries anew, at the end of the queue."""
    layout.record(layout.requeued, job_id).unlink(missing_ok=True)
    forget_place(layout, job_id)


def next_attempt(previous: dict | None) -> int:
    """The attempt after the one kept in requeued/ (`previous`, read by the caller), or 1."""
    return previous["attempt"] + 1 if previous else 1


def resumes_preempted(previous: dict | None) -> bool:
    """Whether the attempt after the one kept in requeued/ (`previous`) follows a preemption:
    its job is told so (GPUQ_PREEMPTED=1: resume from your checkpoint). An attempt requeued
    before its command ran hands on what it was told itself."""
    if previous is None:
        return False
    if previous.get("unstarted") is True:
        return previous.get("preempted") is True
    return cause_of(previous) is StopCause.PREEMPT


_event_fds: dict[Path, int] = {}
# A forked supervisor closes what it inherited; it must not write through stale numbers.
os.register_at_fork(after_in_child=_event_fds.clear)


def close_event_logs() -> None:
    """Close the event logs this process keeps open: for a process that goes on after its
    queues (a test run's, which makes a queue per test)."""
    for fd in _event_fds.values():
        os.close(fd)
    _event_fds.clear()


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


def checked_event(raw: bytes) -> dict[str, Any] | None:
    """An event line as gpuq wrote it, or None: a JSON object whose job is a job id (events
    name paths' parts: `status` and `show` look the job's record up by it), whose host, if
    any, is a host name, and whose time is a number. A line torn by a crash, or written by
    anything else, is not an event; readers skip it (and say how many they skipped)."""
    try:
        event = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    job, host, t = event.get("job"), event.get("by"), event.get("t")
    if not isinstance(job, str) or not JOB_ID_RE.fullmatch(job) or not isinstance(t, (int, float)):
        return None
    if host is not None and (not isinstance(host, str) or not HOST_RE.fullmatch(host)):
        return None
    return event


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


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.renameat2
    except (OSError, AttributeError):
        return None


def move_new(source: Path, dest: Path) -> bool:
    """Rename `source` to `dest` unless `dest` exists (False then), in one step where the file
    system can (renameat2 RENAME_NOREPLACE); elsewhere (NFS) after a look, for a `dest` in a
    directory only the queue's account writes (so only another worker of its could race). A
    rename, unlike a link, moves a member's file the queue's account may not link, and loses
    to a claim of the same spec as a claim loses to it: one of them wins."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        done = renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(dest), _RENAME_NOREPLACE)
        if done == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), str(source))
    if os.path.lexists(dest):
        return False
    os.rename(source, dest)
    return True


def unclaim(claimed: Path, dest: Path) -> bool:
    """Put a claimed spec back into jobs/ without ever overwriting a file that a user put
    there meanwhile (link(2) fails if the name exists). False: the name was taken. A member's
    spec the queue's account may not link (the kernel's protected_hardlinks) is linked by the
    root part."""
    try:
        os.link(claimed, dest)
    except FileExistsError:
        return False
    except PermissionError:
        if not rootorders.place(str(claimed), str(dest)):
            return False
    os.unlink(claimed)
    return True


def put_back(layout: Layout, moved: Path, spec_path: Path, job_id: str) -> None:
    """A spec taken out of jobs/ (a cancel or a hold that could not go on), back where it was;
    if a new file took its name meanwhile, to rejected/ (never lost, and never under another
    id, where someone else's job could take its place)."""
    if not unclaim(moved, spec_path):
        os.rename(moved, layout.rejected / f"{job_id}{KEPT_APART}{os.urandom(4).hex()}{spec_path.suffix}")


def claims_of(layout: Layout, job_id: str) -> list[Path]:
    return sorted(layout.claims.glob(f"{job_id}@*"))


def all_claims(layout: Layout) -> list[tuple[str, str, str]]:
    """(job id, host, file name) of every claim in state/claims/, by name; other names skipped."""
    found = []
    with os.scandir(layout.claims) as entries:
        for name in sorted(e.name for e in entries):
            if (parsed := parse_claim_name(name)) is not None:
                found.append((parsed[0], parsed[1], name))
    return found


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
