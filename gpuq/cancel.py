"""`gpuq cancel`: from any host. A pending job is taken out of jobs/ by the same kind of
atomic rename a worker claims with, so exactly one of them wins. A running job gets a
request in state/control/<host>/ that its worker carries out (SIGTERM, grace, SIGKILL)."""
from __future__ import annotations

import getpass
import os
import secrets
import time

from .faults import wall_time
from .layout import Layout
from .owners import may_act_on, refusal
from .spool import (Record, append_event, claims_of, pending_spec_path, read_record, write_json,
                    write_record, transition_event)
from .intake import read_spec_file, user_name
from .spec import SpecError, parse_spec_text
from .states import State, check_transition

STARTING_WAIT_S = 5.0


def cancel_one(layout: Layout, job_id: str, host: str, admins: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Returns (ok, message). Refused for another user's job unless the caller is root or an
    admin (the worker checks again, from the owner of the request file)."""
    by = getpass.getuser()
    me = os.geteuid()
    spec_path = pending_spec_path(layout, job_id)
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
    if spec_path is not None:
        aside = layout.finished / f".{job_id}.cancelling.{secrets.token_hex(4)}"
        try:
            os.rename(spec_path, aside)
        except FileNotFoundError:
            pass  # a worker claimed it just now: cancel it as a running job below
        else:
            check_transition(State.PENDING, State.CANCELLED)
            try:  # opened as the worker would: no links followed, a FIFO never blocks
                raw, st = read_spec_file(aside, f"jobs/{spec_path.name}")
                spec = parse_spec_text(raw, f"jobs/{spec_path.name}").to_json()
            except SpecError:
                raw, st, spec = b"", os.lstat(aside), {}
            record = Record(id=job_id, state=State.CANCELLED, spec=spec,
                            spec_text=raw.decode("utf-8", "replace"), user=user_name(st.st_uid),
                            uid=st.st_uid, queued_at=st.st_mtime, ended_at=wall_time(),
                            reason=f"cancelled by {by} while pending")
            write_record(layout, record)
            append_event(layout, host, transition_event(record, State.PENDING, State.CANCELLED))
            aside.unlink()
            return True, f"{job_id}: cancelled (was pending)"
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
