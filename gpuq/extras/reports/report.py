"""`gpuq report`: who used what, what waited, what sat idle, over a time window. Pure: fed the
event log (every transition, with owner, queue time, placement and times; notes are not
transitions), the samples log
(per-GPU utilization and held-but-idle time, samples.py) and the specs pending now.

Definitions (docs/reports.md):
- GPU-hours used: per attempt, its GPUs × the part of its run inside the window (a running
  one counts up to now). Two jobs sharing a GPU each count it.
- GPU-hours held but idle: from the samples, time a GPU had gpuq jobs on it at under
  `alert_idle_util_pct` utilization; for --by user each job's own part of it (samples.py).
- Waits: each job whose first start lies in the window, first start − queued time;
  percentiles by nearest rank.
- Ended: jobs that reached a final state in the window, by state; preemptions: requeues
  whose cause is a preemption (model/stops.py).
- Over time: the window cut into `bucket_s` slices; per GPU the time-weighted mean
  utilization, and the queue length (jobs waiting to start) as mean and maximum per slice.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from gpuq.model.stops import StopCause, cause_of

BUCKETS_S = (1, 5, 10, 30, 60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 60
PERCENTILES = (50, 90, 99)
FINAL = ("done", "failed", "timeout", "lost", "cancelled", "rejected")
OFFENDERS = 5  # the jobs that held GPUs idle longest, as Princeton's job reports list them


@dataclass
class Pending:
    job: str
    user: str
    queued_at: float


@dataclass
class _Row:
    gpu_s: float = 0.0
    idle_held_s: float = 0.0
    waits: list[float] = field(default_factory=list)
    ended: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINAL, 0))
    preemptions: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu_hours": round(self.gpu_s / 3600, 4),
            "idle_held_gpu_hours": round(self.idle_held_s / 3600, 4),
            "jobs_started": len(self.waits),
            "wait_s": wait_summary(self.waits),
            "ended": dict(self.ended),
            "preemptions": self.preemptions,
        }


@dataclass
class Report:
    since: float
    until: float
    by: str | None
    bucket_s: int
    total: _Row
    groups: dict[str, _Row]
    gpus: dict[str, dict[str, Any]]  # "host:index" -> held/idle hours, mean util, series
    queue_mean: list[float]
    queue_max: list[int]
    pending_now: int
    longest_pending_s: float | None
    idle_offenders: list[dict[str, Any]] = field(default_factory=list)  # the jobs that held GPUs idle longest
    skipped_events: dict[str, int] = field(default_factory=dict)  # event log -> lines that are not events

    def to_json(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "by": self.by,
            "bucket_s": self.bucket_s,
            "total": self.total.to_json(),
            "groups": {k: row.to_json() for k, row in sorted(self.groups.items())},
            "gpus": self.gpus,
            "queue_length": {"mean": self.queue_mean, "max": self.queue_max},
            "pending_now": self.pending_now,
            "longest_pending_s": self.longest_pending_s,
            "idle_offenders": self.idle_offenders,
        }


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p% of the values at or below it."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def wait_summary(waits: list[float]) -> dict[str, float | None]:
    ordered = sorted(waits)
    summary = {f"p{p}": _round(percentile(ordered, p)) for p in PERCENTILES}
    summary["max"] = _round(ordered[-1]) if ordered else None
    return summary


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def bucket_for(window_s: float) -> int:
    return next((b for b in BUCKETS_S if window_s / b <= MAX_BUCKETS), BUCKETS_S[-1])


class _Tally:
    """The total row and, with --by, the group rows an item counts toward."""

    def __init__(self, by: str | None) -> None:
        self.by, self.total = by, _Row()
        self.groups: defaultdict[str, _Row] = defaultdict(_Row)
        self.idle_by_job: defaultdict[str, float] = defaultdict(float)

    def keys(self, user: str, host: str | None, gpus: list[int]) -> list[str]:
        if self.by == "user":
            return [user]
        if host is None:  # never placed (cancelled or refused while pending): no host's, no GPU's
            return []
        if self.by == "host":
            return [host]
        if self.by == "gpu":
            return [f"{host}:{i}" for i in gpus] or [f"{host}:cpu"]
        return []

    def rows(self, user: str, host: str | None, gpus: list[int]) -> list[_Row]:
        return [self.total] + [self.groups[k] for k in self.keys(user, host, gpus)]

    def add_run(self, e: dict, user: str, host: str, since: float, until: float, open_end: float | None = None) -> None:
        start = e.get("started_at") or (e["t"] if open_end is not None else None)  # a start event: its time
        end = open_end if open_end is not None else (e.get("ended_at") or e["t"])
        gpus = e.get("gpus") or []
        if start is None or not gpus:
            return
        seconds = max(0.0, min(end, until) - max(start, since))
        self.total.gpu_s += seconds * len(gpus)
        for key in self.keys(user, host, gpus):  # --by gpu: each GPU's row gets its own time
            self.groups[key].gpu_s += seconds * (1 if self.by == "gpu" else len(gpus))


def build(
    events: Iterable[dict],
    samples: Iterable[dict],
    pending: list[Pending],
    since: float,
    until: float,
    by: str | None = None,
) -> Report:
    by_job: dict[str, list[dict]] = defaultdict(list)
    for e in events:
        if isinstance(e.get("job"), str) and isinstance(e.get("t"), (int, float)):
            by_job[e["job"]].append(e)
    bucket_s = bucket_for(until - since)
    n_buckets = max(1, math.ceil((until - since) / bucket_s))
    tally = _Tally(by)
    users: dict[str, str] = {}
    queue_intervals: list[tuple[float, float]] = []
    waiting_ids: set[str] = set()
    for job, evs in by_job.items():
        users[job], still_waiting = _replay_job(evs, tally, since, until, queue_intervals)
        if still_waiting:
            waiting_ids.add(job)
    for p in pending:
        if p.job not in waiting_ids:
            queue_intervals.append((p.queued_at, until))
    gpus = _gpu_series(samples, since, until, bucket_s, n_buckets, users, tally)
    queue_mean, queue_max = _queue_series(queue_intervals, since, bucket_s, n_buckets, until)
    oldest = min((p.queued_at for p in pending), default=None)
    groups = {k: row for k, row in tally.groups.items() if row.to_json() != _Row().to_json()}  # met, not used
    return Report(
        since,
        until,
        by,
        bucket_s,
        tally.total,
        groups,
        gpus,
        queue_mean,
        queue_max,
        pending_now=len(pending),
        longest_pending_s=None if oldest is None else _round(until - oldest),
        idle_offenders=[
            {"job": job, "user": users.get(job, "?"), "idle_held_gpu_hours": round(s / 3600, 4)}
            for job, s in sorted(tally.idle_by_job.items(), key=lambda kv: -kv[1])[:OFFENDERS]
            if round(s / 3600, 4) > 0  # what the report would show as 0.000 GPU-h is nobody's offence
        ],
    )


def _replay_job(
    evs: list[dict], tally: _Tally, since: float, until: float, queue_intervals: list[tuple[float, float]]
) -> tuple[str, bool]:
    """One job's events in time order, counted into `tally` (its wait before its first start,
    its runs, preemptions and end) and its spells in the queue added to `queue_intervals`.
    Returns its user, and whether it still waits at `until`."""
    evs.sort(key=lambda e: e["t"])
    user = next((e["user"] for e in evs if e.get("user")), "?")
    queued_at = next((e["queued_at"] for e in evs if e.get("queued_at")), None)
    waiting_from, first_start, run_start = queued_at, None, None
    for e in evs:
        frm, to, t = e.get("from"), e.get("to"), e["t"]
        host = e.get("host")
        rows = tally.rows(user, host, e.get("gpus") or [])
        if frm == "pending" and to == "running":
            start = run_start = e.get("started_at") or t
            if waiting_from is not None:
                queue_intervals.append((waiting_from, start))
            waiting_from = None
            if first_start is None:
                first_start = start
                if since <= start < until and queued_at is not None:
                    for row in rows:
                        row.waits.append(max(0.0, start - queued_at))
        elif frm == "running" and to != "running":
            # A preempted attempt's event may not say when it started: its start event does.
            ran = e if e.get("started_at") or run_start is None else {**e, "started_at": run_start}
            tally.add_run(ran, user, host or e.get("by") or "?", since, until)
            if to == "pending":
                waiting_from = t
                if since <= t < until and cause_of(e) is StopCause.PREEMPT:
                    for row in rows:
                        row.preemptions += 1
        elif frm == "pending" and to != "pending" and waiting_from is not None:
            queue_intervals.append((waiting_from, t))  # held, cancelled or rejected while waiting
            waiting_from = None
        elif to == "pending" and frm != "pending":
            waiting_from = t  # released from hold, or put back by `gpuq retry`
        if to in FINAL and since <= t < until:
            for row in rows:
                row.ended[to] += 1
    still_running = _open_run(evs)
    if still_running is not None:
        tally.add_run(still_running, user, still_running.get("host") or "?", since, until, open_end=until)
    if waiting_from is not None:
        queue_intervals.append((waiting_from, until))
    return user, waiting_from is not None


def _open_run(evs: list[dict]) -> dict | None:
    """The start event of an attempt still running (no later event moved it off running). Notes
    are not changes; neither are the running -> running notes of gpuq before notes had a kind."""
    changes = (e for e in reversed(evs) if "note" not in e and (e.get("from"), e.get("to")) != ("running", "running"))
    last = next(changes, None)
    return last if last and last.get("to") == "running" else None


def _gpu_series(
    samples: Iterable[dict],
    since: float,
    until: float,
    bucket_s: int,
    n_buckets: int,
    users: dict[str, str],
    tally: _Tally,
) -> dict[str, dict[str, Any]]:
    sums: dict[str, dict[str, Any]] = {}
    for line in samples:
        t, s, host = line.get("t"), line.get("s"), line.get("host", "?")
        if not isinstance(t, (int, float)) or not isinstance(s, (int, float)) or s <= 0:
            continue
        mid = t - s / 2
        if not since <= mid < until:
            continue
        b = min(n_buckets - 1, int((mid - since) // bucket_s))
        gpus = line.get("gpus")
        for g in gpus if isinstance(gpus, list) else []:
            if not isinstance(g, dict) or type(g.get("i")) is not int:
                continue  # a torn or foreign line: its figures are not counted
            acc = sums.setdefault(
                f"{host}:{g.get('i')}",
                {
                    "held_s": 0.0,
                    "idle_held_s": 0.0,
                    "util_s": 0.0,
                    "seen_s": 0.0,
                    "b_util": [0.0] * n_buckets,
                    "b_seen": [0.0] * n_buckets,
                },
            )
            idle = g["idle_held_s"] if _finite_nonnegative(g.get("idle_held_s")) else 0.0
            acc["held_s"] += g["held_s"] if _finite_nonnegative(g.get("held_s")) else 0.0
            acc["idle_held_s"] += idle
            if _finite_nonnegative(g.get("util")):
                acc["util_s"] += g["util"] * s
                acc["seen_s"] += s
                acc["b_util"][b] += g["util"] * s
                acc["b_seen"][b] += s
            tally.total.idle_held_s += idle
            for job, share in idle_shares(g, idle).items():
                tally.idle_by_job[job] += share
                for key in tally.keys(users.get(job, "?"), host, [g["i"]]):
                    tally.groups[key].idle_held_s += share
    return {
        key: {
            "held_hours": round(a["held_s"] / 3600, 4),
            "idle_held_hours": round(a["idle_held_s"] / 3600, 4),
            "mean_util_pct": round(a["util_s"] / a["seen_s"], 1) if a["seen_s"] else None,
            "util_pct": [round(u / n, 1) if n else None for u, n in zip(a["b_util"], a["b_seen"])],
        }
        for key, a in sorted(sums.items())
    }


def idle_shares(gpu_line: dict, idle: float) -> dict[str, float]:
    """Each job's part of a GPU line's idle time: its own (`idle_by_job`), or, in a line
    written before workers kept it (or one whose parts are not finite, non-negative numbers
    that add up to at most its idle time), an equal part for every job seen on the GPU. The
    parts then always sum to the line's idle time or less: the users add up to the total."""
    by_job = gpu_line.get("idle_by_job")
    if (
        isinstance(by_job, dict)
        and all(_finite_nonnegative(v) for v in by_job.values())
        and sum(by_job.values()) <= idle + 0.01
    ):
        return {str(j): float(v) for j, v in by_job.items()}
    jobs = gpu_line.get("jobs")
    if not isinstance(jobs, list):
        jobs = []
    return {str(j): idle / len(jobs) for j in jobs}


def _finite_nonnegative(value: object) -> bool:
    return (type(value) is int or type(value) is float) and math.isfinite(value) and value >= 0


def _queue_series(
    intervals: list[tuple[float, float]], since: float, bucket_s: int, n_buckets: int, until: float
) -> tuple[list[float], list[int]]:
    """Jobs waiting to start, per slice: time-weighted mean and maximum."""
    changes: list[tuple[float, int]] = []
    level = 0
    for start, end in intervals:
        start, end = max(start, since), min(end, until)
        if start >= end:
            continue
        changes += [(start, 1), (end, -1)]
    changes.sort(key=lambda c: (c[0], c[1]))  # at one instant, ends before starts
    area, peak = [0.0] * n_buckets, [0] * n_buckets
    t, i = since, 0
    for b in range(n_buckets):
        b_end = min(until, since + (b + 1) * bucket_s)
        peak[b] = level
        while i < len(changes) and changes[i][0] < b_end:
            ct, delta = changes[i]
            area[b] += level * (ct - t)
            t, level = ct, level + delta
            peak[b] = max(peak[b], level)
            i += 1
        area[b] += level * (b_end - t)
        t = b_end
    widths = [min(until, since + (b + 1) * bucket_s) - (since + b * bucket_s) for b in range(n_buckets)]
    return [round(a / w, 3) if w > 0 else 0.0 for a, w in zip(area, widths)], peak
