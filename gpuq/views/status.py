"""Read models for `gpuq status` and `gpuq show`: plain JSON-able dicts built from the spool,
the workers' heartbeats and the same `plan` the workers run. Rendering lives in `render`.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from gpuq import hooks
from gpuq.host.faults import wall_time
from gpuq.host.files import read_json
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, PendingJob, Plan, RunningJob
from gpuq.model.names import name_of, named
from gpuq.model.record import Record
from gpuq.model.spec import command_shown, extras_in
from gpuq.model.stops import StopCause, StopOrder
from gpuq.sched.estimate import NOT_ESTIMATED, Estimate, learned_runs, replay_starts, typical_runs
from gpuq.sched.fairshare import effective_usage, gpu_use_by_user, shares
from gpuq.sched.placement import build_slots, usable_mib
from gpuq.sched.plan import plan
from gpuq.spool.cancel import unread_cancels
from gpuq.spool.deps import DependencyStates, gates
from gpuq.spool.holds import held_jobs
from gpuq.spool.intake import load_pending_for_view, user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import (
    all_claims,
    has_record,
    running_records,
)
from gpuq.spool.sweeps import read_group
from gpuq.spool.teamstate import (
    TeamPicture,
    heartbeat_alive,
    load_heartbeats,
    observed_memory,
    picture,
    told_to_stop,
)
from gpuq.views.ended import ended_part

STATUS_VERSION = 1
ESTIMATED_ROWS = 50  # pending jobs (in queue order) given an expected start


def status(
    layout: Layout,
    config: Config,
    now: float | None = None,
    pending_rows: int | None = None,
    ended: frozenset[str] | None = None,
    ended_user: str | None = None,
) -> dict[str, Any]:
    """The whole team on one screen, as data. Documented in docs/reference.md ("status --json").
    `pending_rows` limits the pending rows built (the screen shows a few of 10,000);
    `pending_total` always counts them all. The latest `recent_finished` ended jobs are those
    in `ended` (default: every final state) of `ended_user` (default: anyone's): a narrowed
    screen (`--state failed`, `--me`) shows the latest of those, not those of the latest."""
    now = wall_time() if now is None else now
    view = _status(layout, config, now, pending_rows, ended, ended_user)
    # A sweep's or array's size, for the rows the screen folds (pending, held and finished alike).
    view["group_sizes"] = _group_sizes(layout, view["pending"] + view["held"] + view["finished"])
    return view


def _status(
    layout: Layout,
    config: Config,
    now: float,
    pending_rows: int | None,
    ended: frozenset[str] | None,
    ended_user: str | None,
) -> dict[str, Any]:
    beats = load_heartbeats(layout)
    observed = observed_memory(beats)
    running = running_records(layout)
    live = [hb for hb in beats if heartbeat_alive(hb, now)]
    live_hosts = {hb["host"] for hb in live}
    stops = told_to_stop(beats)
    for key, (_, when) in unread_cancels(layout, running).items():  # its worker has not read it yet (or is down)
        stops.setdefault(key, StopOrder(when, StopCause.CANCEL))
    warnings = {j: why for hb in live for j, why in hb.get("warnings", {}).items()}
    team = picture(layout, config, beats, running, now)  # what every worker plans over
    queue = _plan_queue(layout, config, beats, team, now, pending_rows)
    jobs_by_host: dict[str, list[RunningJob]] = {}  # per host: 50 boxes x 400 jobs is no scan per GPU
    for j in team.running:
        jobs_by_host.setdefault(j.host, []).append(j)
    return {
        "version": STATUS_VERSION,
        "root": str(layout.root),
        "now": now,
        "hosts": [
            {
                **_host(hb, jobs_by_host.get(hb["host"], []), config, now, heartbeat_alive(hb, now)),
                "drain": team.drains.get(hb["host"]),
            }
            for hb in beats
        ],
        "running": [
            {
                **_running(r, observed.get(r.id, {}), now, stops.get((r.host or "", r.id)), warnings.get(r.id)),
                # A fenced job read plain running until another box took its host's jobs over.
                "host_silent": r.host not in live_hosts and not r.slurm_id,
            }
            for r in running
        ],
        **_pending_part(queue, team, running, config, now, pending_rows),
        "held": held_jobs(layout),
        "not_specs": not_specs(layout, now),
        "stranded": _stranded(layout, {hb["host"] for hb in live}),
        # The extras' sections, handed the live boxes this view already judged (the alerts extra's).
        **{
            section.name: hooks.load(section.read)(layout, now, frozenset(hb["host"] for hb in live))
            for section in hooks.registry().views
        },
        **ended_part(layout, config, ended, ended_user),
    }


class _Queue(NamedTuple):
    """The pending jobs as every worker plans them, and what the plan was given."""

    pending: list[PendingJob]
    problems: dict[str, str]  # specs not valid yet: id -> why
    usage: dict[str, float]  # each user's decayed usage; empty without fair share
    decided: Plan
    expected: Estimate  # when the rows shown are expected to start at the latest, or why not
    likely: Estimate  # ... and when, if the jobs ahead run as long as their kinds usually do


def _plan_queue(
    layout: Layout, config: Config, beats: list[dict], team: TeamPicture, now: float, pending_rows: int | None
) -> _Queue:
    """The same `plan` the workers run, with every reason explained, and the expected starts
    of the rows shown."""
    # Every worker caches the same specs: the freshest cache is enough.
    cache_files = freshest_spec_cache(layout, [hb["host"] for hb in beats])
    pending, problems = load_pending_for_view(layout, cache_files)
    waiting, doomed = gates(pending, DependencyStates(layout), now, (j.id for j in team.running))
    blocked = {**waiting, **{j: f"{why}: its worker cancels it" for j, why in doomed.items()}}
    booked = hooks.set_aside(layout, now)  # the extras' placement rules (bookings), read now
    needs = hooks.needs_of(config)
    config = hooks.sharing_of(config)  # gpu_sharing as the extras here run it, as the workers plan
    usage, durations = _usage(layout, [hb["host"] for hb in beats], config, now)
    usage = usage if config.fair_share else {}
    estimates, planned_running = learned_runs(pending, team.running, config, durations, now)
    decided = plan(
        pending,
        team.hosts,
        planned_running,
        config,
        now,
        explain=True,
        blocked=blocked,
        set_aside=booked,
        usage=usage,
        estimates=estimates,
        needs=needs,
        drained=team.drains,
    )
    by_id = {j.id: j for j in pending}
    # Expected starts for the rows shown and the jobs ahead of them (those behind could only
    # backfill, which never delays the head): a bounded replay, not one of 10,000 jobs.
    ahead = [by_id[i] for i in decided.order[: max(ESTIMATED_ROWS, pending_rows or 0)]]
    expected = replay_starts(ahead, team.hosts, planned_running, config, now, usage, blocked, booked, estimates, needs)
    usual = typical_runs(ahead, planned_running, durations, now)
    likely = (
        replay_starts(ahead, team.hosts, planned_running, config, now, usage, blocked, booked, estimates, needs, usual)
        if usual
        else Estimate()
    )
    return _Queue(pending, problems, usage, decided, expected, likely)


def _pending_part(
    queue: _Queue, team: TeamPicture, running: list[Record], config: Config, now: float, pending_rows: int | None
) -> dict[str, Any]:
    """The pending rows in queue order with each one's reason, and what is said of them all."""
    starting = {s.job_id: s for s in queue.decided.starts}
    by_id = {j.id: j for j in queue.pending}
    decided = queue.decided
    pending = queue.pending
    return {
        "pending": [
            _pending(by_id[i], pos, decided.reasons.get(i) or _starting(starting.get(i)), now, queue)
            for pos, i in enumerate(decided.order[:pending_rows], 1)
        ],
        "pending_total": len(decided.order),
        "fair_share": (
            _fair_share(queue.usage, pending, team.running, team.hosts, config, now) if config.fair_share else []
        ),
        "fair_share_on": config.fair_share,
        # What hosts offer (container runtimes) matters to a host line only while some job's
        # extras' fields (a container) ask for something.
        "containers_asked": any(j.spec.extras for j in pending) or any(extras_in(r.spec) for r in running),
        "pending_by_reason": _by_reason(decided.reasons.get(i) or _starting(starting.get(i)) for i in decided.order),
        "invalid": [{"id": i, "error": msg} for i, msg in sorted(queue.problems.items())],
    }


def _usage(layout: Layout, hosts: list[str], config: Config, now: float) -> tuple[dict[str, float], dict]:
    """Each user's decayed usage of ended jobs, as the freshest worker counted it (worker/loop.py
    writes it now and then), brought forward to `now`, and the durations of each kind of job's
    latest runs; empty while no worker has counted them."""
    latest: tuple[float, dict, object] | None = None
    for host in hosts:
        try:
            data = read_json(layout.usage_cache(host))
        except (OSError, ValueError):  # torn or not gpuq's: status goes on without it
            continue
        if isinstance(data, dict) and isinstance(data.get("t"), (int, float)) and isinstance(data.get("users"), dict):
            if latest is None or data["t"] > latest[0]:
                latest = (float(data["t"]), data["users"], data.get("durations"))
    if latest is None:
        return {}, {}
    factor = 2.0 ** (-max(0.0, now - latest[0]) / config.fair_share_half_life_s)
    usage = {u: float(v) * factor for u, v in latest[1].items() if isinstance(u, str) and isinstance(v, (int, float))}
    durations = {
        kind: [float(d) for d in runs if isinstance(d, (int, float))]
        for kind, runs in (latest[2] if isinstance(latest[2], dict) else {}).items()
        if isinstance(kind, str) and isinstance(runs, list)
    }
    return usage, durations


def _fair_share(
    usage: dict[str, float],
    pending: list[PendingJob],
    running: list[RunningJob],
    hosts: list[HostView],
    config: Config,
    now: float,
) -> list[dict[str, Any]]:
    """Each user's part in the queue's order (sprio's view): their decayed usage (ended jobs,
    running ones so far, and what they hold now and keep as age_step_s each), and the fair-share factor
    it gives; the users with jobs pending or running, and those with usage."""
    slots = build_slots(hosts, running, config.gpu_mem_reserve_mib, now, config.idle_after_s)
    effective = effective_usage(usage, running, slots, config, now)
    waiting = {j.user for j in pending}
    factors = shares(effective, waiting)
    held = gpu_use_by_user(running, slots)
    rows = [
        {
            "user": u,
            "usage_gpu_h": round(effective.get(u, 0.0) / 3600, 2),
            "holds_gpus": round(held.get(u, 0.0), 2),
            "pending": sum(1 for j in pending if j.user == u),
            "factor": round(factors[u], 4),
        }
        for u in factors
        if u in waiting or held.get(u) or effective.get(u, 0.0) >= 36  # a hundredth of a GPU-hour
    ]
    return sorted(rows, key=lambda r: (-r["factor"], r["user"]))


NOT_SPECS_SHOWN = 20
HIDDEN_SETTLE_S = 60.0  # a dotfile younger than this may be a spec being written (editor, submit)


def not_specs(layout: Layout, now: float) -> dict[str, Any]:
    """The files in jobs/ gpuq never reads, which would otherwise wait there unseen: a name
    not ending in .yaml or .yml (`notes.txt`, an editor's `x.yml~`), and a hidden file older
    than a minute (a spec left half-written, a `.x.yaml.swp`). At most NOT_SPECS_SHOWN, with
    how many there are; each with its owner, age and what to do."""
    strays: list[tuple[str, os.stat_result]] = []
    try:
        entries = list(os.scandir(layout.jobs))
    except OSError:
        entries = []
    for entry in entries:
        hidden = entry.name.startswith(".")
        if not hidden and entry.name.endswith((".yaml", ".yml")):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not hidden or now - st.st_mtime >= HIDDEN_SETTLE_S:
            strays.append((entry.name, st))
    found = [
        {
            "name": name,
            "user": user_name(st.st_uid),
            "age_s": now - st.st_mtime,
            "fix": "remove it"
            if name.startswith(".") or name.endswith("~")
            else "rename it to end in .yaml to run it, or remove it",
        }
        for name, st in sorted(strays, key=lambda stray: stray[0])[:NOT_SPECS_SHOWN]
    ]
    return {"files": found, "total": len(strays)}


def _stranded(layout: Layout, live_hosts: set[str]) -> list[dict[str, Any]]:
    """Specs a box claimed and stopped before starting (no record of them): they wait for
    that box's worker, or `gpuq forget HOST` (spool/decommission.py). A claim of a live box
    is a start under way."""
    out = []
    for job_id, host, name in all_claims(layout):
        if host in live_hosts or has_record(layout, job_id):
            continue
        try:
            user = user_name(os.lstat(layout.claims / name).st_uid)
        except OSError:
            continue
        out.append({"id": job_id, "user": user, "host": host})
    return out


def _group_sizes(layout: Layout, rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many members each sweep or array among `rows` has (`<group>_<member>` ids): a
    screen that folds the group's latest rows says of how many."""
    sizes = {}
    for group in {r["id"].rpartition("_")[0] for r in rows} - {""}:
        if (data := read_group(layout, group)) is not None:
            sizes[group] = len(data["members"])
    return sizes


def freshest_spec_cache(layout: Layout, hosts: list[str]) -> list[Path]:
    """Every worker caches the same specs: the most recently written cache is enough (a box
    without a worker of its own, a Slurm bridge's, say, may have none)."""
    found = []
    for host in hosts:
        try:
            found.append((os.stat(layout.spec_cache(host)).st_mtime_ns, layout.spec_cache(host)))
        except OSError:
            continue
    return [max(found)[1]] if found else []


def _starting(start: Any) -> str:
    if start is None:
        return "waiting"
    where = f"{start.host}:{','.join(map(str, start.gpus))}" if start.gpus else start.host
    return f"starting on {where} at the next worker pass"


def _host(
    hb: dict[str, Any], running_here: list[RunningJob], config: Config, now: float, alive: bool
) -> dict[str, Any]:
    gpus = []
    for g in hb.get("gpus", []):
        snap = GpuSnapshot.from_json(g)
        on_gpu = [j for j in running_here if snap.index in j.gpus]
        gpus.append(
            {
                "index": snap.index,
                "name": snap.name,
                "uuid": snap.uuid,
                "mem_total_mib": snap.mem_total_mib,
                "mem_used_mib": snap.mem_used_mib,
                "usable_mib": max(0, usable_mib(snap, on_gpu, config.gpu_mem_reserve_mib)),
                "util_pct": snap.util_pct,
                "temp_c": snap.temp_c,
                "jobs": [j.id for j in on_gpu],
            }
        )
    return {
        "host": hb["host"],
        "alive": alive,
        "stopped": bool(hb.get("stopped")) and not alive,
        "last_seen_s": round(now - hb["_mtime"], 1),
        "pid": hb.get("pid"),
        "version": hb.get("version"),
        "probe_error": hb.get("probe_error"),
        "cpu_slots": hb.get("cpu_slots"),
        "gpus": gpus,
        "runtimes": hb.get("runtimes", {}),
        "runtime_problems": hb.get("runtime_problems", {}),
    }


def _running(
    r: Record, observed: dict[int, int], now: float, stop: StopOrder | None, warning: str | None
) -> dict[str, Any]:
    preemptible = bool(r.spec.get("preemptible"))
    return {
        "id": r.id,
        # The spec's label (free text, one line), else the stem of its id: `status -n` matches it.
        "name": _name(r.spec.get("name"), r.id),
        "user": r.user,
        "host": r.host,
        "gpus": r.gpus,
        "attempt": r.attempt,
        "preemptible": preemptible,
        "stopping": stop is not None,  # told to stop: cancelled, preempted or over its memory, in its grace
        # Told to yield: preempted (an older worker's heartbeat does not say why: a low job's stop).
        "yielding": stop is not None and (stop.cause is StopCause.PREEMPT or (stop.cause is None and preemptible)),
        "warning": warning,
        "restarts": r.restarts,
        "slurm_id": r.slurm_id,
        "time_limit_s": r.time_limit_s,
        "mem_limit_mib": r.mem_limit_mib,
        "cpu_cores": r.cpu_cores,
        "elapsed_s": round(now - (r.claimed_at or now), 1),
        "gpu_mem_mib": r.gpu_mem_mib,
        "declared_gpu_mem_mib": r.spec.get("gpu_mem_mib"),
        "observed_gpu_mem_mib": max(observed.values()) if observed else None,
        "command": command_shown(r.spec.get("command")),
    }


def _name(label: object, job_id: str) -> str:
    """A job's name as history shows it: the spec's `name`, else its id without the counter."""
    return label if isinstance(label, str) and label else name_of(job_id)


def _by_reason(reasons: Iterable[str]) -> dict[str, int]:
    """How many pending jobs wait for each reason (without their "behind N" part), most first."""
    counts = Counter(reason.split("; behind ")[0] for reason in reasons)
    return dict(counts.most_common())


SECTIONS = ("running", "pending", "held", "stranded", "finished", "rejected")


def narrowed(
    view: dict[str, Any],
    user: str | None = None,
    states: frozenset[str] | None = None,
    ids: tuple[str, ...] | None = None,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The status view with only `user`'s jobs, those of `ids` (a group's id: its members) and
    those `names` match (model/names.py's `named`), and with `states` only those sections
    (a final state such as `failed` narrows the finished ones to it). Built from a view with
    every pending row, so that the pending count and reasons are the narrowed ones."""
    out = dict(view)

    def kept(row: dict[str, Any]) -> bool:
        job = str(row.get("id"))
        return (
            (user is None or row.get("user") == user)
            and (ids is None or job in ids or job.rpartition("_")[0] in ids)
            and named(names, str(row.get("name") or name_of(job)), job)
        )

    for section in ("running", "pending", "held", "stranded", "finished", "rejected"):
        out[section] = [r for r in view[section] if kept(r)]
    if states is not None:
        final = states - set(SECTIONS)
        for section in SECTIONS:
            if section not in states and not (section == "finished" and final):
                out[section] = []
        if final and "finished" not in states:
            out["finished"] = [r for r in out["finished"] if r["state"] in final]
    out["pending_total"] = len(out["pending"])
    out["pending_by_reason"] = _by_reason(r["reason"] for r in out["pending"])
    return out


def _pending(job: PendingJob, position: int, reason: str, now: float, queue: _Queue) -> dict[str, Any]:
    s = job.spec
    expected = queue.expected
    start = expected.starts.get(job.id)
    likely = queue.likely.starts.get(job.id)
    return {
        "id": job.id,
        "name": _name(s.name, job.id),
        "user": job.user,
        "position": position,
        "gpus": s.gpus,
        "gpu_mem_mib": s.gpu_mem_mib,
        "priority": s.priority_class if not s.priority else s.priority,
        "waiting_s": round(now - job.queued_at, 1),
        "reason": reason,
        "expected_start": start,  # by then at the latest, if the jobs ahead keep to their limits
        # Sooner, if the jobs ahead run as long as their kinds usually do (the same replay).
        "likely_start": likely if start is not None and likely is not None and likely < start else None,
        # Without one, why (sched/estimate.py): "unknown", "no room", "later", "after deps", "when idle", "-".
        "no_estimate": None if start is not None else expected.why_none.get(job.id, NOT_ESTIMATED),
        "command": command_shown(s.command),
    }
