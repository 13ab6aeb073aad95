"""`gpuq wait ID...`: block until jobs have ended, as `pueue wait` and `sbatch --wait` do, and
exit by how they ended: 0 when every one is done, 1 when one failed, was cancelled, lost,
timed out, rejected or does not exist, 3 when --timeout passed first.

Where a job is, is read from the spool the way a job moves through it (jobs/, claims/,
running/, finished/), in that order: a job that moves on while we look is found further
along, never missed. A retried job is pending again before its old record is looked at.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from gpuq.cli.common import open_layout
from gpuq.cli.workflow import checked_ids, with_group_members
from gpuq.model.record import RecordError
from gpuq.model.states import State
from gpuq.model.text import safe_text
from gpuq.model.units import parse_duration_s
from gpuq.spool.layout import Layout
from gpuq.spool.store import claims_of, pending_spec_path, read_record
from gpuq.spool.sweeps import read_group

POLL_S = 0.5
GONE_AFTER_POLLS = 3  # found nowhere this many times in a row (held, edited, requeued: it moves)


@dataclass(frozen=True)
class Seen:
    state: str  # a State's value, or "gone"
    line: str = ""  # for a final state: what to print


def where(layout: Layout, job_id: str) -> Seen:
    """Where the job is now (one look)."""
    if pending_spec_path(layout, job_id) is not None:
        return Seen(State.PENDING.value)
    if claims_of(layout, job_id):
        return Seen(State.RUNNING.value)
    for directory in (layout.running, layout.finished):
        try:
            record = read_record(layout.record(directory, job_id))
        except (OSError, RecordError, ValueError):
            record = None  # being replaced, or not gpuq's: look again at the next poll
        if record is not None:
            return Seen(record.state.value, _ended(record) if record.state.is_final else "")
    if os.path.lexists(layout.held / f"{job_id}.yaml"):
        return Seen(State.HELD.value)
    try:  # refused: its spec moved to rejected/, with an .error beside it saying why
        why = (layout.rejected / f"{job_id}.error").read_text(errors="replace").strip()
        return Seen(State.REJECTED.value, f"{job_id}: rejected ({safe_text(why)})")
    except OSError:
        return Seen("gone")


def _ended(record) -> str:
    # No exit status: it never ran (its reason says why it could not start), or a signal ended it.
    ended_itself = record.state in (State.DONE, State.FAILED) and record.exit_code is not None
    how = f"exit {record.exit_code}" if ended_itself else None
    if how is None and record.signal:
        how = f"signal {record.signal}"
    detail = ", ".join(x for x in (how, safe_text(record.reason or "")) if x)
    return f"{record.id}: {record.state.value}" + (f" ({detail})" if detail else "")


def wait(layout: Layout, ids: list[str], timeout_s: float | None) -> int:
    """Print one line per job as it ends; the exit status as the module says."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    waiting = dict.fromkeys(ids, 0)  # id -> consecutive polls it was found nowhere
    ok = True
    while waiting:
        for job_id in list(waiting):
            seen = where(layout, job_id)
            if seen.state == "gone" and (group := read_group(layout, job_id)) is not None:
                # A sweep or array dropped as one spec, expanded by a worker since: its members.
                del waiting[job_id]
                waiting.update(dict.fromkeys((m for m in group["members"] if m not in waiting), 0))
            elif seen.line:
                print(seen.line, flush=True)
                ok &= seen.state == State.DONE.value
                del waiting[job_id]
            elif seen.state == "gone":
                waiting[job_id] += 1
                if waiting[job_id] >= GONE_AFTER_POLLS:
                    print(f"gpuq wait: {job_id}: no such job", file=sys.stderr, flush=True)
                    ok = False
                    del waiting[job_id]
            else:
                waiting[job_id] = 0
        if waiting and deadline is not None and time.monotonic() >= deadline:
            for job_id in waiting:
                print(f"{job_id}: still {where(layout, job_id).state} after {timeout_s:g} s", flush=True)
            return 3
        if waiting:
            time.sleep(POLL_S)
    return 0 if ok else 1


def cmd_wait(args: argparse.Namespace) -> int:
    ids = checked_ids("wait", args.ids)
    if ids is None:
        return 1
    try:
        timeout_s = None if args.timeout is None else parse_duration_s(args.timeout)
    except ValueError as e:
        print(f"gpuq wait: --timeout: {e}", file=sys.stderr)
        return 2
    layout = open_layout(args)
    return wait(layout, list(dict.fromkeys(with_group_members(layout, ids))), timeout_s)
