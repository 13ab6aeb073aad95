"""`gpuq history`: the jobs that ran or ended in a window, as sacct lists them, read from the
event logs (state/events/HOST.jsonl), which keep every change of every job for as long as
the team keeps the logs. `status` shows the latest few; this shows all of them, filtered.

One row per job: its latest start or end (a retried job shows its last attempt, and how many
it had), with how often it was preempted. A row is in the window when the job ran or ended
inside it, as sacct's --starttime/--endtime select.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, BinaryIO

from gpuq.model.names import name_of, named
from gpuq.model.record import Record
from gpuq.model.states import FINAL_STATES
from gpuq.model.stops import StopCause
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event, running_records

HISTORY_VERSION = 1
ROW_STATES = frozenset(s.value for s in FINAL_STATES) | {"running"}


@dataclass(frozen=True)
class HistoryFilter:
    """Which jobs `history` lists: those that ran or ended in [since, until], narrowed by
    owner, state, name (shell patterns) and host; None: any."""

    since: float
    until: float
    users: frozenset[str] | None = None
    states: frozenset[str] | None = None
    names: tuple[str, ...] | None = None
    hosts: frozenset[str] | None = None
    ids: frozenset[str] | None = None  # jobs, or groups standing for their members (sacct -j)

    def keeps(self, row: dict[str, Any]) -> bool:
        began = row["start"] if row["start"] is not None else row["end"]
        return (
            (row["end"] is None or row["end"] >= self.since)
            and (began is None or began <= self.until)
            and (self.states is None or row["state"] in self.states)
            and (self.hosts is None or row["host"] in self.hosts)
            and named(self.names, row["name"], row["id"])
            and (self.ids is None or row["id"] in self.ids or row["id"].rpartition("_")[0] in self.ids)
        )


def history(layout: Layout, wanted: HistoryFilter, now: float) -> dict[str, Any]:
    """The rows `wanted`, oldest first, and the log lines that are not events (by log).
    Ended jobs come from their end events; running ones from their running records (a job
    running since before the window has no event in it)."""
    latest: dict[str, dict[str, Any]] = {}
    preempted: Counter[str] = Counter()
    skipped: dict[str, int] = {}
    # The owner is in every line, as JSON writes it: a line of someone else's is passed over
    # without parsing it (a year of a team's events is millions of lines).
    owners = tuple(f'"user":{json.dumps(u)}'.encode() for u in wanted.users) if wanted.users is not None else None
    for path in sorted(layout.events.glob("*.jsonl")):
        try:
            log = open(path, "rb")
        except OSError:
            continue
        with log:
            _skip_to(log, wanted.since - CLOCK_SLACK_S)
            for line in log:
                if b'"to":"' not in line or b'"to":"running"' in line:
                    continue  # a note, or a start (a running job's row is its record's)
                if owners is not None and not any(o in line for o in owners):
                    continue
                event = checked_event(line)
                if event is None:
                    skipped[path.name] = skipped.get(path.name, 0) + 1
                    continue
                job, to = event["job"], event.get("to")
                if event.get("from") == "running" and to == "pending":
                    if event.get("cause") == StopCause.PREEMPT.value:
                        preempted[job] += 1
                elif to in ROW_STATES and (job not in latest or event["t"] >= latest[job]["t"]):
                    latest[job] = event
    rows = {ev["job"]: _row(ev, preempted[ev["job"]], now) for ev in latest.values()}
    for record in running_records(layout):
        if wanted.users is None or record.user in wanted.users:
            rows[record.id] = _running_row(record, preempted[record.id], now)
    found = sorted(
        (row for row in rows.values() if wanted.keeps(row)), key=lambda r: (r["start"] or r["end"] or 0, r["id"])
    )
    return {
        "version": HISTORY_VERSION,
        "since": wanted.since,
        "until": wanted.until,
        "jobs": found,
        "skipped_events": skipped,
    }


# A host's log is in the order its lines were written, by its clock: a window's start is
# found by bisection, from this long before it (a clock stepped back; a put-back logged late).
CLOCK_SLACK_S = 3600.0
_BISECT_DOWN_TO = 64 * 1024  # bytes: then read on


def _skip_to(log: BinaryIO, since: float) -> None:
    """Leave `log` at the start of a line written at most a bisection step before `since`."""
    lo, hi = 0, os.fstat(log.fileno()).st_size
    while hi - lo > _BISECT_DOWN_TO:
        mid = (lo + hi) // 2
        log.seek(mid)
        log.readline()  # the rest of the line `mid` fell in
        t = _next_time(log)
        if t is None or t >= since:
            hi = mid
        else:
            lo = mid
    log.seek(lo)
    if lo:
        log.readline()


def _next_time(log: BinaryIO) -> float | None:
    """The time of the next event among the next few lines (a torn one is passed over)."""
    for _ in range(16):
        line = log.readline()
        if not line:
            return None
        if (event := checked_event(line)) is not None:
            return float(event["t"])
    return None


def _row(event: dict[str, Any], preemptions: int, now: float) -> dict[str, Any]:
    """An ended job's row from its latest end event."""
    gpus = event.get("gpus")
    name = event.get("name")
    start = _time(event.get("started_at"))
    end = _time(event.get("ended_at")) or event["t"]
    return {
        "id": event["job"],
        "user": event.get("user") if isinstance(event.get("user"), str) else None,
        "name": name if isinstance(name, str) and name else name_of(event["job"]),
        "state": event["to"],
        "exit_code": event.get("exit_code") if type(event.get("exit_code")) is int else None,
        "signal": event.get("signal") if type(event.get("signal")) is int else None,
        "start": start,
        "end": end,
        "elapsed_s": max(0.0, end - start) if start is not None else None,
        "host": event.get("host") if isinstance(event.get("host"), str) else None,
        "gpus": [g for g in gpus if type(g) is int] if isinstance(gpus, list) else [],
        "attempts": event.get("attempt") if type(event.get("attempt")) is int else 1,
        "preemptions": preemptions,
        "reason": event.get("reason") if isinstance(event.get("reason"), str) else None,
    }


def _running_row(record: Record, preemptions: int, now: float) -> dict[str, Any]:
    # A running attempt's record has its start only once it ends: it runs since its claim.
    start = _time(record.started_at) or _time(record.claimed_at)
    name = record.spec.get("name")
    return {
        "id": record.id,
        "user": record.user,
        "name": name if isinstance(name, str) and name else name_of(record.id),
        "state": "running",
        "exit_code": None,
        "signal": None,
        "start": start,
        "end": None,
        "elapsed_s": max(0.0, now - start) if start is not None else None,
        "host": record.host,
        "gpus": list(record.gpus or []),
        "attempts": record.attempt,
        "preemptions": preemptions,
        "reason": None,
    }


def _time(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None  # type: ignore[arg-type]
