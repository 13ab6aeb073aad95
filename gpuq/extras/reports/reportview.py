"""`gpuq report` at the edges: read the event and samples logs and the pending specs, hand
them to report.build, and print the result as text (the HTML page is reporthtml.py)."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Iterator, Sequence

from gpuq.extras.reports.report import FINAL, Pending, Report, build, wait_summary
from gpuq.extras.reports.samples import read_samples
from gpuq.model.moments import MOMENT_EXAMPLES, parse_moment
from gpuq.model.text import safe_text
from gpuq.model.units import MAX_DURATION_S, format_duration
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event

SPARKS = " ▁▂▃▄▅▆▇█"
DEFAULT_SINCE = "7d"


def parse_since(text: str, now: float) -> float:
    """'7d' -> now − 7 days; '2026-11-01', 'yesterday', 'now-2h' (model/moments.py). At most
    100 years back: a window of centuries is a typo, cut into thousands of slices."""
    try:
        since = parse_moment(text, now)
    except ValueError as e:
        raise ValueError(f"--since {e}") from None
    if since < now - MAX_DURATION_S:
        raise ValueError(f"--since {text!r} is more than 100 years back; write it like {MOMENT_EXAMPLES}")
    return since


def read_events(layout: Layout, skipped: dict[str, int] | None = None) -> Iterator[dict]:
    """Every event of every host's log; a line that is not one (torn by a crash, or not
    gpuq's: store.checked_event) is skipped and counted in `skipped`, by log."""
    for path in sorted(layout.events.glob("*.jsonl")):
        with open(path, "rb") as f:
            for raw in f:
                event = checked_event(raw)
                if event is not None:
                    yield event
                elif skipped is not None and raw.strip():
                    skipped[path.name] = skipped.get(path.name, 0) + 1


def pending_now(layout: Layout) -> list[Pending]:
    """The specs in jobs/ now: owner and queue time from the file, nothing parsed."""
    found = []
    with os.scandir(layout.jobs) as it:
        for entry in it:
            stem, dot, suffix = entry.name.rpartition(".")
            if entry.name.startswith(".") or not dot or suffix not in ("yaml", "yml"):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            found.append(Pending(stem, user_name(st.st_uid), st.st_mtime))
    return found


def gather(layout: Layout, since: float, until: float, by: str | None, from_history_start: bool = False) -> Report:
    """The report over [since, until); with `from_history_start`, from the queue's first
    moment instead where that is later."""
    skipped: dict[str, int] = {}
    events = list(read_events(layout, skipped))
    if from_history_start:
        since = history_start(events, since, until)
    report = build(events, read_samples(layout, since), pending_now(layout), since, until, by)
    return dataclasses.replace(report, skipped_events=skipped)


def history_start(events: list[dict], since: float, until: float) -> float:
    """`since`, or the whole second before the queue's first moment (its first event, or the
    first job's queue time, which is earlier) when that is later (and before `until`): the
    window then starts with the queue's history, its first wait included."""
    times = [
        t
        for e in events
        for key in ("t", "queued_at")
        if (type(t := e.get(key)) is int or type(t) is float) and math.isfinite(t)
    ]
    first = math.floor(min(times)) if times else None
    return first if first is not None and since < first < until else since


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def hours(h: float) -> str:
    return f"{h:.3f}" if h < 1 else f"{h:.2f}" if h < 100 else f"{h:.0f}"


def spark(values: Sequence[float | None], top: float) -> str:
    """One character per slice: blank where nothing was sampled, ▁..█ from 0 to `top`."""
    if top <= 0:
        top = 1
    return "".join(" " if v is None else SPARKS[1 + max(0, min(7, int(v / top * 7.999)))] for v in values)


def summary_table(r: Report) -> tuple[list[str], list[list[str]]]:
    """The header and one row per group, then the total: used and idle GPU-hours, waits, ends."""
    head = [r.by or "", "GPU-h used", "held idle", "started", "wait p50", "p90", "p99", "max", *FINAL, "preempted"]
    rows = []
    for name, row in sorted(r.groups.items()) + [("total", r.total)]:
        waits = wait_summary(row.waits)
        rows.append(
            [
                safe_text(name),
                hours(row.gpu_s / 3600),
                hours(row.idle_held_s / 3600),
                str(len(row.waits)),
                *[format_duration(waits[k]) for k in ("p50", "p90", "p99", "max")],
                *[str(row.ended[state]) for state in FINAL],
                str(row.preemptions),
            ]
        )
    return head, rows


def report_text(r: Report) -> str:
    lines = [f"gpuq report  {_when(r.since)} → {_when(r.until)}" + (f"  by {r.by}" if r.by else "")]
    head, rows = summary_table(r)
    rows = [head] + rows
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += [
        "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in rows
    ]
    step = format_duration(r.bucket_s)
    lines.append("")
    if r.gpus:
        lines.append(f"GPU utilization over time (one mark = {step}, from {_when(r.since)}; blank: no samples)")
        keys = {key: safe_text(key) for key in r.gpus}  # host names come from the event logs
        width = max(len(k) for k in keys.values())
        for key, g in r.gpus.items():
            mean = "-" if g["mean_util_pct"] is None else f"{g['mean_util_pct']:.0f}%"
            lines.append(
                f"  {keys[key].ljust(width)}  mean {mean:>4}  held {hours(g['held_hours']):>6}h"
                f"  idle-held {hours(g['idle_held_hours']):>5}h  |{spark(g['util_pct'], 100)}|"
            )
    else:
        lines.append(
            "GPU utilization over time: no samples in this window (workers write them "
            "every sample_every_s to state/samples/)"
        )
    top = max(r.queue_max, default=0)
    lines.append(f"queue length (max per {step}; peak {top})  |{spark(r.queue_max, top)}|")
    if r.idle_offenders:
        lines.append("held GPUs idle longest (`gpuq eff ID` says why):")
        cells = [(safe_text(o["job"]), safe_text(o["user"]), hours(o["idle_held_gpu_hours"])) for o in r.idle_offenders]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        lines += [f"  {j:<{widths[0]}}  {u:<{widths[1]}}  {h:>{widths[2]}} GPU-h idle" for j, u, h in cells]
    if r.pending_now:
        lines.append(f"pending now: {r.pending_now}, the longest waiting {format_duration(r.longest_pending_s)}")
    for log, n in sorted(r.skipped_events.items()):
        lines.append(f"  ! state/events/{safe_text(log)}: {n} line(s) that are not gpuq's events were skipped")
    return "\n".join(lines)
