"""hold / release / edit / retry: moving a job between the queue and the places beside it.

- hold: the pending spec is renamed from jobs/ into state/held/ (the same atomic rename a
  claim is: if a worker claimed it first, the hold is refused — it is running). A record
  beside it says who held it and when.
- release: the record goes first, then the spec is linked back into jobs/ (never over a
  file a user put there meanwhile). A rename keeps the file's mtime: its old place in the
  queue. A crash in between leaves the spec in held/, still held, and release works again.
- edit: hold, $EDITOR on a copy, validate, then release with the new text and the old
  mtime. An invalid edit is offered again (at a terminal) or dropped, the original kept.
- retry: a finished job's record is kept in requeued/ (so the next attempt is numbered +1),
  the finished record goes, and its spec text goes back into jobs/ as a new submission,
  owned by the job's owner. A crash after the record went and before the spec was placed
  is finished by running retry again.
"""
from __future__ import annotations

import getpass
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from .faults import wall_time
from .intake import read_spec_file, user_name
from .layout import Layout
from .owners import may_act_on, refusal
from .spec import SpecError, parse_spec_text
from .spool import (Record, append_event, pending_spec_path, read_json, read_record, transition_event,
                    unclaim, write_json, write_record)
from .states import State, check_transition


class HoldError(Exception):
    pass


def held_spec(layout: Layout, job_id: str) -> Path:
    return layout.held / f"{job_id}.yaml"


def _check_owner(job_id: str, owner: int, admins: tuple[str, ...]) -> None:
    if not may_act_on(os.geteuid(), owner, admins):
        raise HoldError(refusal(job_id, owner).replace("cancel", "change"))


def hold(layout: Layout, job_id: str, host: str, admins: tuple[str, ...] = (), why: str = "") -> Path:
    spec_path = pending_spec_path(layout, job_id)
    if spec_path is None:
        if held_spec(layout, job_id).exists():
            raise HoldError(f"{job_id}: already held; `gpuq release {job_id}` puts it back")
        raise HoldError(f"{job_id}: not pending (only a job waiting in the queue can be held)")
    _check_owner(job_id, os.lstat(spec_path).st_uid, admins)
    dest = held_spec(layout, job_id)
    try:
        os.rename(spec_path, dest)
    except FileNotFoundError:
        raise HoldError(f"{job_id}: a worker started it a moment ago; it is running") from None
    st = os.lstat(dest)
    check_transition(State.PENDING, State.HELD)
    record = Record(id=job_id, state=State.HELD, spec={}, user=user_name(st.st_uid), uid=st.st_uid,
                    queued_at=st.st_mtime, reason=why or f"held by {getpass.getuser()}", held_at=wall_time())
    write_record(layout, record)
    append_event(layout, host, transition_event(record, State.PENDING, State.HELD))
    return dest


def release(layout: Layout, job_id: str, host: str, admins: tuple[str, ...] = (), text: bytes | None = None) -> None:
    """Back into the queue at its old place; with `text`, as that new text (edit)."""
    src = held_spec(layout, job_id)
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        raise HoldError(f"{job_id}: not held") from None
    _check_owner(job_id, st.st_uid, admins)
    if text is not None:  # the new text, with the owner and the queue place of the old file
        tmp = src.with_name(f".{src.name}.edit")
        tmp.write_bytes(text)
        if os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, st.st_mode & 0o777)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(tmp, src)
    record = read_record(layout.record(layout.held, job_id)) or Record(id=job_id, state=State.HELD, spec={})
    layout.record(layout.held, job_id).unlink(missing_ok=True)
    if not unclaim(src, layout.jobs / f"{job_id}.yaml"):
        raise HoldError(f"{job_id}: jobs/{job_id}.yaml exists (a new file?); the held spec stays in "
                        f"{src}. Fix: move that file away and run `gpuq release {job_id}` again")
    check_transition(State.HELD, State.PENDING)
    append_event(layout, host, transition_event(record, State.HELD, State.PENDING, "released"))


def held_jobs(layout: Layout) -> list[dict]:
    """For `gpuq status`: each held spec, with who held it and since when."""
    out = []
    for path in sorted(layout.held.glob("*.yaml")):
        job_id = path.stem
        record = read_json(layout.record(layout.held, job_id)) or {}
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        out.append({"id": job_id, "user": user_name(st.st_uid), "since": record.get("held_at"),
                    "reason": record.get("reason") or "held"})
    return out


def edit(layout: Layout, job_id: str, host: str, admins: tuple[str, ...] = ()) -> str:
    """$EDITOR (else $VISUAL, else vi) on a pending spec, taken out of the queue meanwhile."""
    was_held = held_spec(layout, job_id).exists()
    path = held_spec(layout, job_id) if was_held else hold(layout, job_id, host, admins, why="being edited")
    original, _ = read_spec_file(path, f"jobs/{job_id}.yaml")
    editor = os.environ.get("EDITOR") or os.environ.get("VISUAL") or "vi"
    with tempfile.TemporaryDirectory(prefix="gpuq-edit-") as tmp:
        copy = Path(tmp) / f"{job_id}.yaml"
        copy.write_bytes(original)
        while True:
            subprocess.run([*shlex.split(editor), str(copy)], check=False)
            text = copy.read_bytes()
            try:
                parse_spec_text(text, f"jobs/{job_id}.yaml")
                break
            except SpecError as e:
                print(f"gpuq edit: {e}", file=sys.stderr)
                if not (sys.stdin.isatty() and input("edit again? [Y/n] ").strip().lower() in ("", "y", "yes")):
                    if not was_held:
                        release(layout, job_id, host, admins)
                    raise HoldError(f"{job_id}: the edit was not valid; the spec is unchanged") from None
    if was_held:  # edited while held: stays held, with the new text
        path.write_bytes(text)
        return f"{job_id}: edited (still held)"
    release(layout, job_id, host, admins, text=None if text == original else text)
    return f"{job_id}: {'edited' if text != original else 'unchanged'}, back at its place in the queue"


def retry(layout: Layout, job_id: str, host: str, admins: tuple[str, ...] = ()) -> str:
    finished = layout.record(layout.finished, job_id)
    record = read_record(finished)
    kept = layout.record(layout.requeued, job_id)
    if record is None:
        earlier = read_json(kept)
        if earlier is None or pending_spec_path(layout, job_id) or layout.record(layout.running, job_id).exists():
            raise HoldError(f"{job_id}: no finished job by that id (retry puts an ended job back)")
        record = Record.from_json(earlier)  # an interrupted retry: finish it
    elif record.state is State.REJECTED or not record.spec_text:
        raise HoldError(f"{job_id}: was rejected (its spec is invalid); fix it and submit it again")
    _check_owner(job_id, record.uid, admins)
    check_transition(record.state, State.PENDING)
    write_json(kept, record.to_json())
    finished.unlink(missing_ok=True)
    tmp = layout.jobs / f".{job_id}.retry.tmp"
    tmp.write_text(record.spec_text)
    if os.geteuid() == 0 and record.uid >= 0:
        os.chown(tmp, record.uid, -1)
    if not unclaim(tmp, layout.jobs / f"{job_id}.yaml"):
        tmp.unlink()
        raise HoldError(f"{job_id}: jobs/{job_id}.yaml exists already")
    append_event(layout, host, transition_event(record, record.state, State.PENDING,
                                                f"retry by {getpass.getuser()}"))
    return f"{job_id}: back in the queue as attempt {record.attempt + 1}"
