"""The per-host samples log that `gpuq report` draws utilization over time from: every
`sample_every_s` the worker (through this extra's publisher, with its heartbeat) appends one
line with, per GPU, its time-weighted mean utilization and memory since the last line, how
long gpuq jobs held it, how much of that at under `alert_idle_util_pct` (held but idle), and
which jobs were on it.

state/samples/<host>-YYYY-MM.jsonl, appended only by that host's worker (docs/design.md: one writer
per file), one file per month so a report over a week reads a month or two, not years.
A line:
  {"t": END, "s": SECONDS COVERED, "host": H,
   "gpus": [{"i": 0, "util": 37.5, "mem": 12000, "total": 81920, "held_s": 60.0,
             "idle_held_s": 12.0, "jobs": ["a", "b"], "idle_by_job": {"a": 10.0, "b": 2.0}}, ...]}
"util" is missing for a GPU whose utilization NVML does not report. A job's time on a GPU
starts at its claim, not at the pass before it (a job claimed just before a pass held the GPU
for that moment, not for the whole gap), and a GPU's idle time goes to the jobs that were on
it then, split evenly among those there at once: `idle_by_job` (a line without it is older,
and a report splits its idle time evenly among its `jobs`)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.record import Record
from gpuq.spool.layout import Layout
from gpuq.worker.publishing import Publish, Published


@dataclass
class _GpuSums:
    util_s: float = 0.0  # utilization percent × seconds
    util_seen_s: float = 0.0
    mem_s: float = 0.0  # MiB × seconds
    total_mib: int = 0
    held_s: float = 0.0
    idle_held_s: float = 0.0
    jobs: set[str] = field(default_factory=set)
    idle_by_job: dict[str, float] = field(default_factory=dict)


def shares_since(starts: dict[str, float], now: float) -> dict[str, float]:
    """Each job's share of the time up to `now`, for jobs on one GPU from their own start:
    every moment is split evenly among the jobs there then. The shares sum to the time
    since the earliest start."""
    shares = dict.fromkeys(starts, 0.0)
    order = sorted(starts.items(), key=lambda kv: kv[1])
    for n, (_, begin) in enumerate(order):
        end = order[n + 1][1] if n + 1 < len(order) else now
        for job_id, _ in order[: n + 1]:  # the jobs already there share this stretch
            shares[job_id] += (end - begin) / (n + 1)
    return shares


def month_file(layout: Layout, host: str, t: float) -> Path:
    return layout.samples / f"{host}-{time.strftime('%Y-%m', time.gmtime(t))}.jsonl"


def start(layout: Layout, config: Config, host: str) -> Publish:
    """A hooks.BoxPublisher's start (worker.publishing.StartPublisher): each publication of the
    box's state (at most once per poll interval) is observed, and the worker's last one ends
    the line with the time observed so far (not observed again: a `--once` worker's single
    pass covers no time, and leaves no line)."""
    samples = SampleLog(
        layout, host, config.sample_every_s, config.alert_idle_util_pct, max_gap_s=2 * config.poll_interval + 1
    )

    def publish(published: Published) -> None:
        if published.last:
            samples.flush(published.wall)
        else:
            samples.observe(published.state.gpus, published.state.running, published.wall)

    return publish


class SampleLog:
    """Worker side. `observe` is called with each publication; each snapshot counts for the
    time since the previous one, at most `max_gap_s` (a worker that was stopped or down
    has no figures for that time, and a report must not invent them)."""

    def __init__(self, layout: Layout, host: str, every_s: float, idle_util_pct: int, max_gap_s: float) -> None:
        self.layout, self.host = layout, host
        self.every_s, self.idle_util_pct, self.max_gap_s = every_s, idle_util_pct, max_gap_s
        self.sums: dict[int, _GpuSums] = {}
        self.covered_s = 0.0
        self.last_t: float | None = None

    def observe(self, gpus: list[GpuSnapshot], running: list[Record], now: float) -> None:
        dt = 0.0 if self.last_t is None else min(max(now - self.last_t, 0.0), self.max_gap_s)
        self.last_t = now
        self.covered_s += dt
        for g in gpus:
            s = self.sums.setdefault(g.index, _GpuSums())
            s.total_mib = g.mem_total_mib
            s.mem_s += g.mem_used_mib * dt
            if g.util_pct is not None:
                s.util_s += g.util_pct * dt
                s.util_seen_s += dt
            # each job from the start of this reading or its claim, whichever is later
            starts = {r.id: max(now - dt, min(r.claimed_at or 0.0, now)) for r in running if g.index in r.gpus}
            if starts:
                s.jobs.update(starts)
                held = now - min(starts.values())
                s.held_s += held
                if g.util_pct is not None and g.util_pct < self.idle_util_pct:
                    s.idle_held_s += held
                    for job_id, share in shares_since(starts, now).items():
                        s.idle_by_job[job_id] = s.idle_by_job.get(job_id, 0.0) + share
        if self.covered_s >= self.every_s:
            self.flush(now)

    def flush(self, now: float) -> None:
        """Append the line for the time covered since the last one (the worker's last
        publication asks for it too, so a short run still leaves its figures)."""
        if self.covered_s <= 0:
            return
        line = {
            "t": round(now, 3),
            "s": round(self.covered_s, 3),
            "host": self.host,
            "gpus": [_gpu_line(i, s, self.covered_s) for i, s in sorted(self.sums.items())],
        }
        self.sums, self.covered_s = {}, 0.0
        path = month_file(self.layout, self.host, now)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(line, separators=(",", ":")) + "\n").encode())
        finally:
            os.close(fd)


def _gpu_line(index: int, s: _GpuSums, covered_s: float) -> dict:
    line: dict = {"i": index}
    if s.util_seen_s > 0:
        line["util"] = round(s.util_s / s.util_seen_s, 2)
    line.update(
        mem=round(s.mem_s / covered_s),
        total=s.total_mib,
        held_s=round(s.held_s, 3),
        idle_held_s=round(s.idle_held_s, 3),
        jobs=sorted(s.jobs),
        idle_by_job={j: round(v, 3) for j, v in sorted(s.idle_by_job.items())},
    )
    return line


def read_samples(layout: Layout, since: float) -> Iterator[dict]:
    """Every host's sample lines that end after `since` (a month file that ended before
    `since` is not opened). Torn or foreign lines are skipped."""
    if not layout.samples.is_dir():
        return
    first_month = time.strftime("%Y-%m", time.gmtime(since))
    for path in sorted(layout.samples.glob("*.jsonl")):
        if path.stem.rsplit("-", 2)[-2:] < first_month.split("-"):
            continue
        with open(path, "rb") as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except (ValueError, RecursionError):  # torn, or nested past what json can read
                    continue
                t = line.get("t") if isinstance(line, dict) else None
                if (type(t) is int or type(t) is float) and t > since:  # (a torn line's "t" may be anything)
                    yield line
