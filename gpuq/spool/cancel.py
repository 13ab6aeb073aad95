"""Cancelling a job, as a worker applies a `gpuq cancel` request (spool/inbox.py). A pending or
held job is taken out of the queue by the same kind of atomic rename a worker claims with,
so exactly one of them wins. A running job gets a stop order in state/control/<host>/ that
its own host's worker carries out (SIGTERM, grace, SIGKILL)."""

from __future__ import annotations

import os
import secrets
import stat
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterable

from gpuq.host.faults import crash_point, wall_time
from gpuq.host.files import read_json, set_aside_directory, write_json
from gpuq.host.owners import Actor, refusal
from gpuq.model.errors import SpecError
from gpuq.model.names import JOB_ID_RE
from gpuq.model.record import Record, RecordError, parse_claim_name
from gpuq.model.spec import parse_spec_text
from gpuq.model.states import State, TransitionError
from gpuq.model.text import safe_text
from gpuq.spool.ids import held_for, reserve
from gpuq.spool.intake import keeper, read_spec_file, user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import (
    StateChange,
    claims_of,
    forget_place,
    found_job,
    pending_specs,
    put_back,
    read_record,
)
from gpuq.spool.teamstate import host_alive

STARTING_WAIT_S = 2.0
CANCELLING = ".cancelling."  # in the name of a spec moved aside by a cancel, in finished/


def cancel_pending(
    layout: Layout, spec_path: Path, job_id: str, host: str, reason: str, actor: Actor | None = None
) -> tuple[bool, str]:
    """Take a pending (or held) spec out of the queue and record it cancelled with `reason`.
    The spec is moved aside first (one winner against a claim) and checked on the moved file;
    it is put back if it is not a plain file the actor may cancel, or the record cannot be
    written: nothing half done. (False, why) when it was not cancelled."""
    display = f"jobs/{spec_path.name}"
    not_a_job = f"{job_id}: {display} is a directory, not a job; nothing was changed"
    try:  # a FIFO or a link is taken out (and recorded cancelled); a directory is nobody's job
        before = os.lstat(spec_path)
    except FileNotFoundError:
        return False, f"{job_id}: a worker started it a moment ago"
    if stat.S_ISDIR(before.st_mode):
        return False, not_a_job
    owner = before.st_uid
    if actor is not None and not actor.may_act_on(owner):
        return False, refusal(job_id, owner)
    # Its record makes the id taken for good: the id is its owner's (spool/ids.py), unless it is
    # another's already (this file is not that job); reserved before the spec leaves jobs/, as
    # a claim's is, so at no moment is the id free.
    if (holder := _reserve(layout, job_id, owner)) not in (owner, None):
        return False, refusal(job_id, holder)
    aside = layout.finished / f".{job_id}{CANCELLING}{secrets.token_hex(4)}.tmp"
    try:
        os.rename(spec_path, aside)
    except FileNotFoundError:
        return False, f"{job_id}: a worker started it a moment ago"
    crash_point("cancel:aside")
    st = os.lstat(aside)
    if stat.S_ISDIR(st.st_mode):  # swapped by its owner since the look: not a job, back to its maker
        set_aside_directory(aside, layout.jobs, "spec")
        return False, not_a_job
    if st.st_uid != owner:  # replaced between the look and the move (only its owner or root can)
        put_back(layout, aside, spec_path, job_id)
        return False, refusal(job_id, st.st_uid)
    try:
        _record_cancelled(layout, aside, spec_path, job_id, host, reason)
    except (OSError, TransitionError):
        put_back(layout, aside, spec_path, job_id)
        raise
    return True, ""


def _record_cancelled(layout: Layout, aside: Path, spec_path: Path, job_id: str, host: str, reason: str) -> None:
    """The spec moved aside recorded cancelled (its held record, if any, goes with it), then
    the file aside removed."""
    display = f"jobs/{spec_path.name}"
    try:  # opened as the worker would: no links followed, a FIFO never blocks
        raw, st = read_spec_file(aside, display)
        spec = parse_spec_text(raw, display).to_json()
    except (SpecError, OSError):
        raw, spec, st = b"", {}, os.lstat(aside)
    found = replace(
        found_job(layout, job_id, spec_path, st.st_uid, user_name(st.st_uid)),
        spec=spec,
        spec_text=raw.decode("utf-8", "replace"),
        queued_at=st.st_mtime,
    )
    change = StateChange(layout, found, State.CANCELLED, host, ended_at=wall_time(), reason=reason)
    change.write()
    crash_point("cancel:recorded")
    os.unlink(aside)
    forget_place(layout, job_id)  # a retry queues anew
    change.log()


def finish_interrupted_cancel(layout: Layout, aside: Path, host: str) -> None:
    """A cancel whose process was killed after it moved the spec aside (`.ID.cancelling.HEX.tmp`
    in finished/) and before it removed that file, finished as it would have been: recorded
    cancelled, or, where its record was written, the file aside removed. Before, the sweep of
    old temp files deleted it: the job was gone with no record. Only a plain file: the queue's
    account moved it there (members cannot write finished/), its owner is the job's."""
    job_id = aside.name[1:].split(CANCELLING, 1)[0]
    st = os.lstat(aside)
    if not JOB_ID_RE.fullmatch(job_id) or not stat.S_ISREG(st.st_mode):
        return
    if (layout.finished / f"{job_id}.json").exists():
        os.unlink(aside)
        return
    reason = "cancelled (the cancel was cut off; a worker finished it)"
    _record_cancelled(layout, aside, layout.jobs / f"{job_id}.yaml", job_id, host, reason)


def _reserve(layout: Layout, job_id: str, uid: int) -> int | None:
    try:
        return reserve(layout, job_id, uid)
    except OSError:
        return None  # a full disk: the record cannot be written either, and says so


def unread_cancels(layout: Layout, running: Iterable[Record]) -> dict[tuple[str, str], tuple[str, float | None]]:
    """Cancels of running jobs that their box's worker has not read yet (it removes an order
    once obeyed): (host, id) -> (who cancelled, when). One listing per host: most have none.
    A box whose worker is down keeps them: `status` shows the job stopping, and a box that
    takes its jobs over records them cancelled rather than running them again."""
    by_host: dict[str, list[Record]] = {}
    for record in running:
        if record.host:
            by_host.setdefault(record.host, []).append(record)
    found: dict[tuple[str, str], tuple[str, float | None]] = {}
    try:  # an order is a worker's (root's, or the queue's account's: state/'s owner), as obey_controls asks
        writers = {0, os.stat(layout.state).st_uid}
    except OSError:
        return found
    for host, records in by_host.items():
        directory = layout.host_control(host)
        try:
            names = set(os.listdir(directory))
        except OSError:
            continue
        for record in records:
            if f"{record.id}.json" not in names:
                continue
            try:
                if os.lstat(directory / f"{record.id}.json").st_uid not in writers:
                    continue
                order = read_json(directory / f"{record.id}.json")
            except (OSError, ValueError):
                continue
            if isinstance(order, dict) and order.get("attempt", record.attempt) == record.attempt:
                when = order.get("t")
                found[(host, record.id)] = (
                    safe_text(str(order.get("by", "?")))[:64],
                    float(when) if isinstance(when, (int, float)) else None,
                )
    return found


def _says_now(order: Path, attempt: int) -> bool:
    """Whether a cancel order waiting for its worker (a worker wrote it: state/ is theirs)
    says `--now` for this attempt."""
    try:
        earlier = read_json(order)
    except (OSError, ValueError):
        return False
    return isinstance(earlier, dict) and earlier.get("now") is True and earlier.get("attempt") == attempt


def cancel_one(layout: Layout, job_id: str, host: str, actor: Actor, now: bool = False) -> tuple[bool, str]:
    """Apply one id of a cancel request from `actor`. Returns (ok, message). What the spool
    records about the id (ended, running, held) comes first: a file someone drops into jobs/
    under that id is not that job. `now`: a running job is killed without its grace."""
    deadline = time.monotonic() + STARTING_WAIT_S
    while True:
        try:
            finished = read_record(layout.record(layout.finished, job_id))
            running = read_record(layout.record(layout.running, job_id))
        except (RecordError, ValueError):
            return False, f"{job_id}: its record is damaged; an admin should look at state/"
        if finished is not None:
            return False, f"{job_id}: already ended ({finished.state.value})"
        if running is not None and running.host:
            if not actor.may_act_on(running.uid):
                return False, refusal(job_id, running.uid)
            control = layout.host_control(running.host)
            layout.make_state_dir(control)
            order = control / f"{job_id}.json"
            # An order the worker has not read yet may say `--now`: a plain cancel after it
            # keeps it (it replaced the order, and the job took its whole grace).
            now = now or _says_now(order, running.attempt)
            write_json(
                order, {"action": "cancel", "by": actor.name, "t": wall_time(), "attempt": running.attempt, "now": now}
            )
            how = "kills it at once" if now else "stops it"
            if not host_alive(
                layout, running.host, wall_time()
            ):  # a member read "cancelling" while it ran on, unstopped
                return True, (
                    f"{job_id}: cancelling (running on {running.host}, whose worker is not running); its worker "
                    f"{how} when it runs again, or the job is recorded cancelled when another box takes "
                    f"{running.host}'s jobs over"
                )
            return True, f"{job_id}: cancelling (running on {running.host}); its worker {how}"
        held = layout.held / f"{job_id}.yaml"
        refused = None
        if os.path.lexists(held):
            candidates = [(held, "held")]
        else:
            files = pending_specs(layout, job_id)
            # Of files under the id in jobs/, only the one that is the job: a member's file
            # dropped under another's id, waiting for a pass to refuse it, is nobody's to cancel.
            job = keeper(layout, job_id, files)
            candidates = [(job, "pending")] if job is not None else []
            if files and job is None and (holder := held_for(layout, job_id)) is not None:
                refused = refusal(job_id, holder)
        for spec_path, was in candidates:
            try:
                if not actor.may_act_on(os.lstat(spec_path).st_uid):
                    refused = refused or refusal(job_id, os.lstat(spec_path).st_uid)
                    continue
            except FileNotFoundError:
                continue
            done, why = cancel_pending(layout, spec_path, job_id, host, f"cancelled by {actor.name} while {was}", actor)
            if done:
                return True, f"{job_id}: cancelled (was {was})"
            if not why.endswith("a moment ago"):
                return False, why
        claims = claims_of(layout, job_id)
        if refused and not claims:
            return False, refused
        if not claims and not candidates:
            return False, refused or f"{job_id}: no such job"
        if time.monotonic() > deadline:
            return False, refused or _claimed_not_started(layout, job_id, claims, actor)
        time.sleep(0.05)  # claimed a moment ago (here or on another host): its record is being written


def _claimed_not_started(layout: Layout, job_id: str, claims: list[Path], actor: Actor) -> str:
    """A claim that stayed without a record: the box that claimed the job stopped (or froze)
    before starting it. The job is its owner's all the same."""
    holder = held_for(layout, job_id)
    if holder is not None and not actor.may_act_on(holder):
        return refusal(job_id, holder)
    hosts = sorted({parsed[1] for c in claims if (parsed := parse_claim_name(c.name)) is not None})
    return (
        f"{job_id}: claimed by {', '.join(hosts) or 'a box'} but not started. If that box is down, "
        f"`gpuq forget {hosts[0] if hosts else 'HOST'}` puts the job back in the queue; cancel it then."
    )
