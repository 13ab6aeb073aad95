"""The whole team as one plan sees it: every live box's latest published heartbeat (its GPUs,
idleness, container runtimes, CPU slots, the memory its jobs use and which are yielding)
and every running record. Each worker plans over this picture and acts on its own box's part
of the plan; `gpuq status` explains the same plan from the same picture.

A box whose heartbeat is stale, or that is drained, is left out: nothing new goes there.
Its running jobs still count (caps, fair share), since they hold GPUs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .config import Config
from .drain import drained_hosts
from .layout import HOST_RE, Layout
from .plan import HostView, RunningJob
from .probe import GpuSnapshot
from .spool import Record, read_json

POKE_SUFFIX = ".poke"


def heartbeat_alive(hb: dict[str, Any], now: float) -> bool:
    """A box seen within a few poll intervals (by the heartbeat's own wall-clock stamp: the
    boxes' clocks are assumed in step, as NTP keeps them). Taking over a dead box's jobs
    never uses this: the workers judge that on their own clocks (recovery.py)."""
    t, poll = hb.get("t", 0), hb.get("poll_interval", 1.0)
    if not isinstance(t, (int, float)) or not isinstance(poll, (int, float)):
        return False
    return now - t <= max(10.0, 5 * poll)


def load_heartbeats(layout: Layout) -> list[dict[str, Any]]:
    """Every box's heartbeat that reads as one (the worker's account alone writes them)."""
    beats = []
    for path in sorted(layout.workers.glob("*.json")):
        if path.name.endswith(".specs.json"):
            continue
        try:
            hb = read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(hb, dict) and isinstance(hb.get("host"), str) and HOST_RE.match(hb["host"]):
            beats.append(hb)
    return beats


def observed_memory(beats: Iterable[dict[str, Any]]) -> dict[str, dict[int, int]]:
    """Job id -> GPU index -> MiB its processes use, as each box last measured."""
    out: dict[str, dict[int, int]] = {}
    for hb in beats:
        for job_id, per in (hb.get("observed") or {}).items():
            try:
                out[job_id] = {int(i): int(m) for i, m in per.items()}
            except (AttributeError, TypeError, ValueError):
                continue
    return out


def yielding(beats: Iterable[dict[str, Any]]) -> set[str]:
    return {j for hb in beats for j in (hb.get("stopping") or ()) if isinstance(j, str)}


def host_view(hb: dict[str, Any], config: Config) -> HostView:
    """A box as its heartbeat publishes it. Raises ValueError/TypeError/KeyError on garbage."""
    runtimes = hb.get("runtimes")
    return HostView(hb["host"], tuple(GpuSnapshot.from_json(g) for g in hb.get("gpus") or ()),
                    int(hb.get("cpu_slots", config.cpu_slots)),
                    {int(i): (None if t is None else float(t)) for i, t in (hb.get("others_idle_since") or {}).items()},
                    frozenset(runtimes) if isinstance(runtimes, (dict, list)) else None)


def running_elsewhere(beats: Sequence[dict[str, Any]], records: Sequence[Record],
                      mine: str | None) -> list[RunningJob]:
    """The running jobs of every box but `mine`, with the memory and yielding their boxes
    last published."""
    others = [hb for hb in beats if hb["host"] != mine]
    observed, stopping = observed_memory(others), yielding(others)
    return [RunningJob.of(r, observed.get(r.id, {}), r.id in stopping) for r in records if r.host != mine]


@dataclass
class TeamPicture:
    hosts: list[HostView]                       # live boxes that take new work
    running: list[RunningJob]                   # every running job, on any box
    drains: dict[str, Any] = field(default_factory=dict)   # box -> its drain order
    skipped: list[str] = field(default_factory=list)       # boxes whose heartbeat did not read

    def fingerprint(self, now: float, idle_after_s: float) -> tuple:
        """What the plan reads of the team, as a value that changes when any of it does (a
        GPU that became idle long enough included)."""
        return (tuple((h.name, h.cpu_slots, h.runtimes,
                       tuple((g.index, g.mem_used_mib, g.mem_total_mib, g.processes) for g in h.gpus),
                       tuple((i, t is None, t is not None and now - t >= idle_after_s)
                             for i, t in sorted(h.others_idle_since.items())))
                      for h in self.hosts),
                tuple(sorted((j.id, j.stopping, tuple(sorted(j.observed_mib.items()))) for j in self.running)))


def picture(layout: Layout, config: Config, beats: Sequence[dict[str, Any]], records: Sequence[Record],
            now: float, own: HostView | None = None, own_running: Sequence[RunningJob] = (),
            alive: Callable[[dict[str, Any]], bool] | None = None) -> TeamPicture:
    """The team from published heartbeats and running records. A worker passes its own box
    (`own`, `own_running`) measured this instant, which replace what it last published, and
    `alive`: its own judgement of another box's heartbeat (by when it last changed on this
    box's clock, as clocks may differ); without it, the heartbeat's wall-clock stamp."""
    alive = alive or (lambda hb: heartbeat_alive(hb, now))
    mine = own.name if own is not None else None
    others = [hb for hb in beats if hb["host"] != mine]
    running = list(own_running) + running_elsewhere(beats, records, mine)
    drains = drained_hosts(layout)
    hosts, skipped = [], []
    if own is not None and own.name not in drains:
        hosts.append(own)
    for hb in others:
        if hb["host"] in drains or not alive(hb):
            continue
        try:
            hosts.append(host_view(hb, config))
        except (KeyError, TypeError, ValueError, AttributeError):
            skipped.append(hb["host"])
    hosts.sort(key=lambda h: h.name)
    return TeamPicture(hosts, running, drains, skipped)


def poke_path(layout: Layout, host: str) -> Path:
    return layout.workers / f"{host}{POKE_SUFFIX}"


def poke_box(layout: Layout, host: str) -> None:
    """Wake another box's worker: its sleep watches this file's mtime (its wake FIFO is on
    its own machine). Best effort: a box that misses it plans at its next poll."""
    try:
        os.utime(poke_path(layout, host))
    except OSError:
        pass
