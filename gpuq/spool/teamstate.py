"""The whole team as one plan sees it: every live box's latest published heartbeat (its GPUs,
idleness, container runtimes, CPU slots, the memory its jobs use and which are told to stop)
and every running record. Each worker plans over this picture and acts on its own box's part
of the plan; `gpuq status` explains the same plan from the same picture.

A box whose heartbeat is stale, that said it stopped, or that is drained, is left out:
nothing new goes there. Its running jobs still count (caps, fair share): they hold GPUs.
A heartbeat file that is not one a worker wrote is skipped whole (heartbeat_problem).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from gpuq.host.files import read_json
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, RunningJob
from gpuq.model.record import Record
from gpuq.model.stops import StopOrder
from gpuq.spool.drain import drained_hosts
from gpuq.spool.layout import Layout

POKE_SUFFIX = ".poke"


def live_window_s(hb: dict[str, Any]) -> float:
    """How long a box may stay silent and still count as live: a few of its poll intervals."""
    return max(10.0, 5 * hb.get("poll_interval", 1.0))


def heartbeat_alive(hb: dict[str, Any], now: float) -> bool:
    """A box whose heartbeat file changed within its live window, by the file's mtime (the
    shared disk's clock, not the box's own, which may run ahead or behind), and that did not
    say it stopped. The workers judge boxes they have watched by when the heartbeat last
    changed on their own clock (Worker.start_jobs), which agrees with this but for clocks."""
    return not hb.get("stopped") and now - hb["_mtime"] <= live_window_s(hb)


def host_alive(layout: Layout, host: str, now: float) -> bool:
    """Whether `host`'s worker writes its heartbeat, read alone (a cancel asks of the job's box)."""
    path = layout.workers / f"{host}.json"
    try:
        beat = read_json(path)
        mtime = os.stat(path).st_mtime
    except (OSError, ValueError):
        return False
    return (
        isinstance(beat, dict)
        and heartbeat_problem(beat, host) is None
        and heartbeat_alive({**beat, "_mtime": mtime}, now)
    )


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def heartbeat_problem(hb: Any, host: str) -> str | None:
    """Why a heartbeat file is not one a worker wrote for `host` (None: it is). Everything
    the planner and `gpuq status` read is checked here, once, so a bad file is skipped
    whole rather than crashing whoever reads it."""
    if not isinstance(hb, dict):
        return "not a JSON object"
    if hb.get("host") != host:
        return f"names host {str(hb.get('host'))[:64]!r}, not the file's {host!r}"
    if not _number(hb.get("t")) or not _number(hb.get("poll_interval", 1.0)) or hb.get("poll_interval", 1.0) <= 0:
        return "'t' or 'poll_interval' is not a number"
    gpus = hb.get("gpus", [])
    if not isinstance(gpus, list) or not all(
        isinstance(g, dict)
        and _int(g.get("index"))
        and _int(g.get("mem_total_mib"))
        and _int(g.get("mem_used_mib"))
        and isinstance(g.get("uuid"), str)
        and isinstance(g.get("name"), str)
        and all(g.get(k) is None or _number(g.get(k)) for k in ("util_pct", "temp_c", "power_w"))
        and isinstance(g.get("processes", []), list)
        and all(isinstance(p, list) and len(p) == 2 and _int(p[0]) and _int(p[1]) for p in g.get("processes", []))
        for g in gpus
    ):
        return "'gpus' is not a list of GPU snapshots"
    if not _int(hb.get("cpu_slots", 0)):
        return "'cpu_slots' is not a count"
    observed = hb.get("observed", {})
    if not isinstance(observed, dict) or not all(
        isinstance(per, dict) and all(isinstance(i, str) and i.isdigit() and _int(m) for i, m in per.items())
        for per in observed.values()
    ):
        return "'observed' is not job -> GPU -> MiB"
    idle = hb.get("others_idle_since", {})
    if not isinstance(idle, dict) or not all(
        isinstance(i, str) and i.isdigit() and (t is None or _number(t)) for i, t in idle.items()
    ):
        return "'others_idle_since' is not GPU -> time"
    if not isinstance(hb.get("stopping", []), list) or not all(isinstance(j, str) for j in hb.get("stopping", [])):
        return "'stopping' is not a list of job ids"
    stops = hb.get("stops", {})
    if not isinstance(stops, dict) or not all(
        isinstance(o, dict)
        and (o.get("since") is None or _number(o["since"]))
        and (o.get("cause") is None or isinstance(o["cause"], str))
        for o in stops.values()
    ):
        return "'stops' is not job -> {since, cause}"
    if not isinstance(hb.get("runtimes", {}), (dict, list)) or not isinstance(hb.get("warnings", {}), dict):
        return "'runtimes' or 'warnings' is not a mapping"
    return None


def load_heartbeats(
    layout: Layout, problems: dict[str, str] | None = None, cache: dict[str, tuple[tuple, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every box's heartbeat that is one (heartbeat_problem), with its file's mtime under
    "_mtime". A file that is not is skipped, and why goes to `problems` (host -> why).
    `cache` (a worker's, kept between passes): a file whose inode, size and mtime are as
    last time is not read again (heartbeats are rewritten by replacing the file)."""
    beats = []
    for path in sorted(layout.workers.glob("*.json")):
        if path.name.endswith(".specs.json"):
            continue
        host = path.name[: -len(".json")]
        try:
            st = os.stat(path)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            mtime = st.st_mtime
            if cache is not None and (hit := cache.get(host)) is not None and hit[0] == key:
                hb = hit[1]
            else:
                hb = read_json(path)
                if cache is not None:
                    cache[host] = (key, hb)
        except (OSError, ValueError) as e:
            hb, mtime = e, 0.0
        why = f"does not read ({hb})" if isinstance(hb, Exception) else heartbeat_problem(hb, host)
        if why is not None:
            if problems is not None:
                problems[host] = why
        elif isinstance(hb, dict):  # always: heartbeat_problem finds none only in a dict
            beats.append({**hb, "_mtime": mtime})
    return beats


def observed_memory(beats: Iterable[dict[str, Any]]) -> dict[str, dict[int, int]]:
    """Job id -> GPU index -> MiB its processes use, as each box last measured."""
    return {
        job_id: {int(i): m for i, m in per.items()} for hb in beats for job_id, per in hb.get("observed", {}).items()
    }


def told_to_stop(beats: Iterable[dict[str, Any]]) -> dict[tuple[str, str], StopOrder]:
    """(host, job id) -> the order to stop it, as each box published its own jobs' (a box
    matches only its own records: a job retried elsewhere is not the one its last box stopped)."""
    return {
        (hb["host"], j): StopOrder.from_json(hb.get("stops", {}).get(j)) for hb in beats for j in hb.get("stopping", ())
    }


def host_view(hb: dict[str, Any], config: Config) -> HostView:
    """A box as its (checked) heartbeat publishes it."""
    return HostView(
        hb["host"],
        tuple(GpuSnapshot.from_json(g) for g in hb.get("gpus", ())),
        hb.get("cpu_slots", config.cpu_slots),
        {int(i): t for i, t in hb.get("others_idle_since", {}).items()},
        frozenset(hb["runtimes"]) if "runtimes" in hb else None,
        hb["cores"] if type(hb.get("cores")) is int else None,
        hb["mem_mib"] if type(hb.get("mem_mib")) is int else None,
    )


def running_elsewhere(beats: Sequence[dict[str, Any]], records: Sequence[Record], mine: str | None) -> list[RunningJob]:
    """The running jobs of every box but `mine`, with the memory and stops their boxes
    last published."""
    others = [hb for hb in beats if hb["host"] != mine]
    observed, stops = observed_memory(others), told_to_stop(others)
    return [
        RunningJob.of(r, observed.get(r.id, {}), stops.get((r.host or "", r.id))) for r in records if r.host != mine
    ]


@dataclass
class TeamPicture:
    hosts: list[HostView]  # live boxes that take new work
    running: list[RunningJob]  # every running job, on any box
    drains: dict[str, Any] = field(default_factory=dict)  # box -> its drain order

    def fingerprint(self, now: float, idle_after_s: float, grace_s: float) -> tuple:
        """What the plan reads of the team, as a value that changes when any of it does (a
        GPU that became idle long enough included, and a job whose stop is a grace late: the
        plan gives up on it, sched/plan.py _gone_by)."""
        return (
            tuple(
                (
                    h.name,
                    h.cpu_slots,
                    h.runtimes,
                    tuple((g.index, g.mem_used_mib, g.mem_total_mib, g.processes) for g in h.gpus),
                    tuple(
                        (i, t is None, t is not None and now - t >= idle_after_s)
                        for i, t in sorted(h.others_idle_since.items())
                    ),
                )
                for h in self.hosts
            ),
            tuple(
                sorted(
                    (
                        j.id,
                        j.stopping,
                        j.stuck(now, grace_s),
                        tuple(sorted(j.observed_mib.items())),
                    )
                    for j in self.running
                )
            ),
        )


def picture(
    layout: Layout,
    config: Config,
    beats: Sequence[dict[str, Any]],
    records: Sequence[Record],
    now: float,
    own: HostView | None = None,
    own_running: Sequence[RunningJob] = (),
    alive: Callable[[dict[str, Any]], bool] | None = None,
) -> TeamPicture:
    """The team from published heartbeats and running records. A worker passes its own box
    (`own`, `own_running`) measured this instant, which replace what it last published, and
    `alive`: its own judgement of another box's heartbeat (by when it last changed on this
    box's clock); without it, `heartbeat_alive`."""
    alive = alive or (lambda hb: heartbeat_alive(hb, now))
    mine = own.name if own is not None else None
    others = [hb for hb in beats if hb["host"] != mine]
    running = list(own_running) + running_elsewhere(beats, records, mine)
    drains = drained_hosts(layout)
    hosts = [own] if own is not None and own.name not in drains else []
    hosts += [host_view(hb, config) for hb in others if hb["host"] not in drains and alive(hb)]
    hosts.sort(key=lambda h: h.name)
    return TeamPicture(hosts, running, drains)


def poke_path(layout: Layout, host: str) -> Path:
    return layout.workers / f"{host}{POKE_SUFFIX}"


def poke_box(layout: Layout, host: str) -> None:
    """Wake another box's worker: its sleep watches this file's mtime (its wake FIFO is on
    its own machine). Best effort: a box that misses it plans at its next poll."""
    try:
        os.utime(poke_path(layout, host))
    except OSError:
        pass
