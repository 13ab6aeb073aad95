"""`gpuq cancel`: from any host. A pending job is taken out of jobs/ by the same kind of
atomic rename a worker claims with, so exactly one of them wins. A running job gets a
request in state/control/<host>/ that its worker carries out (SIGTERM, grace, SIGKILL)."""
from __future__ import annotations

import getpass
import os
import secrets
import time
from pathlib import Path

from .faults import wall_time
from .layout import Layout
from .owners import may_act_on, refusal
from .spool import (Record, append_event, claims_of, pending_spec_path, read_record, write_json,
                    write_record, transition_event)
from .intake import read_spec_file, user_name
from .spec import SpecError, parse_spec_text
from .states import State, check_transition

STARTING_WAIT_S = 5.0


def cancel_pending(layout: Layout, spec_path: Path, job_id: str, host: str, reason: str) -> bool:
    """Take a pending spec out of jobs/ (the same atomic rename a claim is) and record it
    cancelled with `reason`. False: a worker claimed it first (it is running now)."""
    aside = layout.finished / f".{job_id}.cancelling.{secrets.token_hex(4)}"
    try:
        os.rename(spec_path, aside)
    except FileNotFoundError:
        return False
    check_transition(State.PENDING, State.CANCELLED)
    try:  # opened as the worker would: no links followed, a FIFO never blocks
        raw, st = read_spec_file(aside, f"jobs/{spec_path.name}")
        spec = parse_spec_text(raw, f"jobs/{spec_path.name}").to_json()
    except SpecError:
        raw, st, spec = b"", os.lstat(aside), {}
    record = Record(id=job_id, state=State.CANCELLED, spec=spec, spec_text=raw.decode("utf-8", "replace"),
                    user=user_name(st.st_uid), uid=st.st_uid, queued_at=st.st_mtime, ended_at=wall_time(),
                    reason=reason)
    write_record(layout, record)
    append_event(layout, host, transition_event(record, State.PENDING, State.CANCELLED))
    aside.unlink()
    return True


def cancel_one(layout: Layout, job_id: str, host: str, admins: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Returns (ok, message). Refused for another user's job unless the caller is root or an
    admin (the worker checks again, from the owner of the request file)."""
    by = getpass.getuser()
    me = os.geteuid()
    spec_path = pending_spec_path(layout, job_id)
    held = layout.held / f"{job_id}.yaml"
    if spec_path is None and held.exists():
        spec_path = held
    if spec_path is not None:
        try:
            owner = os.lstat(spec_path).st_uid
        except FileNotFoundError:
            owner = me
        if not may_act_on(me, owner, admins):
            return False, refusal(job_id, owner)
    if spec_path is not None and layout.record(layout.finished, job_id).exists():
        return False, (f"{job_id}: that id belongs to a job that already ended; the new file "
                       f"jobs/{spec_path.name} reusing it will be rejected by the worker")
    was = "held" if spec_path == held else "pending"
    if spec_path is not None and cancel_pending(layout, spec_path, job_id, host, f"cancelled by {by} while {was}"):
        layout.record(layout.held, job_id).unlink(missing_ok=True)
        return True, f"{job_id}: cancelled (was {was})"
    deadline = time.monotonic() + STARTING_WAIT_S
    while True:
        finished = read_record(layout.record(layout.finished, job_id))
        if finished is not None:
            return False, f"{job_id}: already ended ({finished.state.value})"
        running = read_record(layout.record(layout.running, job_id))
        if running is not None:
            if not may_act_on(me, running.uid, admins):
                return False, refusal(job_id, running.uid)
            control = layout.host_control(running.host or "")
            control.mkdir(parents=True, exist_ok=True)
            write_json(control / f"{job_id}.json", {"action": "cancel", "by": by, "t": wall_time(),
                                                    "attempt": running.attempt})
            return True, f"{job_id}: cancelling (running on {running.host}); its worker stops it"
        if not claims_of(layout, job_id) or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # claimed a moment ago: its record is being written
    return False, f"{job_id}: no such job"
