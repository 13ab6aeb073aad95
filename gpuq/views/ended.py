"""The latest ended jobs for `gpuq status`: FINISHED and REJECTED rows, read backwards from the
end of every host's event log (status stays fast with 100,000 finished jobs), each completed
from its record or its kept file, and left out once the job is back in the queue."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpuq.model.config import Config
from gpuq.model.names import KEPT_APART_RE
from gpuq.model.states import FINAL_STATES
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event, claims_of, pending_spec_path, read_record

EVENT_CHUNK_BYTES = 64 * 1024
EVENT_TAIL_MAX_BYTES = 1024 * 1024


def ended_part(layout: Layout, config: Config, ended: frozenset[str] | None, ended_user: str | None) -> dict[str, Any]:
    """The latest finished and rejected jobs, and the event log lines that are not gpuq's."""
    final_names = frozenset(s.value for s in FINAL_STATES)
    skipped: dict[str, int] = {}
    return {
        "finished": [
            _finished(layout, ev)
            for ev in recent_events(
                layout, (ended or final_names) - {"rejected"}, config.recent_finished, ended_user, skipped
            )
            if not _retried(layout, ev["job"])
        ],
        "rejected": [
            _rejected(layout, ev)
            for ev in recent_events(layout, frozenset({"rejected"}), config.recent_finished, ended_user, skipped)
            if not _lived_on(layout, ev)
        ],
        "skipped_events": skipped,  # lines of the event logs that are not gpuq's events
    }


def recent_events(
    layout: Layout,
    states: frozenset[str],
    limit: int,
    user: str | None = None,
    skipped: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The latest events into `states` (of `user`'s jobs, if given), newest first, read
    backwards from the end of every host's log until `limit` are found (so status stays fast
    with 100,000 finished jobs). Lines that are not events are counted in `skipped`, by log."""
    needles = tuple(f'"to":"{s}"'.encode() for s in states)
    found = []
    for path in layout.events.glob("*.jsonl"):
        found += _tail_events(path, needles, limit, user, skipped if skipped is not None else {})
    found.sort(key=lambda e: e.get("t", 0), reverse=True)
    seen, out = set(), []
    for ev in found:
        if ev["job"] not in seen:
            seen.add(ev["job"])
            out.append(ev)
    return out[:limit]


def _tail_events(
    path: Path, needles: tuple[bytes, ...], limit: int, user: str | None, skipped: dict[str, int]
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    jobs: set[str] = set()
    try:
        with open(path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            carry = b""
            floor = max(0, end - EVENT_TAIL_MAX_BYTES)  # older than that is not "recent"
            while end > floor and len(jobs) < limit:
                start = max(floor, end - EVENT_CHUNK_BYTES)
                f.seek(start)
                chunk = f.read(end - start) + carry
                lines = chunk.split(b"\n")
                carry = lines.pop(0) if start > 0 else b""  # a line cut by the chunk edge
                for line in reversed(lines):
                    if any(n in line for n in needles):
                        ev = checked_event(line)
                        if ev is None:
                            skipped[path.name] = skipped.get(path.name, 0) + 1
                            continue
                        if user is not None and ev.get("user") != user:
                            continue
                        found.append(ev)
                        jobs.add(ev["job"])
                end = start
    except OSError:
        pass
    return found


def _finished(layout: Layout, ev: dict[str, Any]) -> dict[str, Any]:
    try:
        record = read_record(layout.record(layout.finished, ev["job"]))
    except (ValueError, OSError):  # a torn or foreign file: its event says enough, status goes on
        record = None
    if record is None:
        return {
            "id": ev["job"],
            "state": ev["to"],
            "exit_code": ev.get("exit_code"),
            "user": None,
            "ended_at": ev.get("t"),
            "duration_s": None,
            "host": ev.get("host"),
            "reason": ev.get("reason"),
        }
    duration = (record.ended_at - record.started_at) if record.ended_at and record.started_at else None
    return {
        "id": record.id,
        "state": record.state.value,
        "exit_code": record.exit_code,
        "user": record.user,
        "signal": record.signal,
        "ended_at": record.ended_at,
        "duration_s": round(duration, 2) if duration is not None else None,
        "host": record.host,
        "gpus": record.gpus,
        "reason": record.reason,
    }


def _retried(layout: Layout, job_id: str) -> bool:
    """Whether an ended job is back in the queue (`gpuq retry` took its finished record away):
    its old ending is no longer news, and it shows where it is now."""
    if layout.record(layout.finished, job_id).exists():
        return False
    return bool(
        pending_spec_path(layout, job_id)
        or claims_of(layout, job_id)
        or layout.record(layout.running, job_id).exists()
        or layout.record(layout.held, job_id).exists()
    )


def _lived_on(layout: Layout, ev: dict[str, Any]) -> bool:
    """Whether the id of a rejection has been queued again since (its spec retried, or a fixed
    one dropped under the same name): then its REJECTED line has served its purpose."""
    job_id = ev["job"]
    if (kept := _kept_name(ev)) is not None:  # refused under an id that is another job's: kept apart
        return not os.path.lexists(layout.rejected / kept)
    if not any(os.path.lexists(layout.rejected / f"{job_id}{s}") for s in (".yaml", ".yml", ".error")):
        return True  # retried: moved back out of rejected/ (a directory never went there: its .error did)
    if pending_spec_path(layout, job_id) or claims_of(layout, job_id) or layout.record(layout.running, job_id).exists():
        return True
    try:
        record = read_record(layout.record(layout.finished, job_id))
    except (ValueError, OSError):  # torn or foreign: not a later run of it
        return False
    return record is not None and (record.claimed_at or record.ended_at or 0) > (ev.get("t") or 0)


def _kept_name(ev: dict[str, Any]) -> str | None:
    """The name a refused spec was kept under in rejected/, where it is not its id's own
    (`<id>.<time>.<hex>.yaml`: the id was another job's); None otherwise."""
    kept = ev.get("kept")
    ok = isinstance(kept, str) and re.fullmatch(rf"{re.escape(ev['job'])}{KEPT_APART_RE}\.ya?ml", kept)
    return kept if ok else None


def _rejected(layout: Layout, ev: dict[str, Any]) -> dict[str, Any]:
    owner = None  # a refused spec is moved to rejected/ as it was: its owner is the file's
    kept = _kept_name(ev)
    for name in [kept] if kept else [f"{ev['job']}{suffix}" for suffix in (".yaml", ".yml")]:
        try:
            owner = user_name(os.lstat(layout.rejected / name).st_uid)
            break
        except (OSError, ValueError):
            continue
    return {"id": ev["job"], "user": owner, "error": ev.get("reason"), "at": ev.get("t")}
