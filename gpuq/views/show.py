"""`gpuq show ID`: everything known about one job, wherever it is, with what it sees when it
runs (views/preview.py) and the memory its past runs peaked at; and that as text."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from gpuq.host.faults import wall_time
from gpuq.host.usage import suggest_gpu_mem
from gpuq.model.config import Config
from gpuq.model.errors import SpecError
from gpuq.model.record import Record, parse_claim_name
from gpuq.model.secrets import mask_secrets
from gpuq.model.spec import JobSpec, command_shown, parse_spec_text
from gpuq.model.states import State
from gpuq.model.stops import StopCause
from gpuq.model.text import safe_text, safe_tree
from gpuq.model.units import format_clock, format_duration, format_mib
from gpuq.sched.estimate import (
    AFTER_BEGIN,
    AFTER_DEPENDENCIES,
    ARRAY_LIMIT,
    LATER,
    NO_ROOM,
    NOT_ESTIMATED,
    UNKNOWN,
    WHEN_IDLE,
)
from gpuq.spool.holds import held_jobs, held_spec
from gpuq.spool.intake import read_spec_file
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event, claims_of, kept_attempt, next_attempt, pending_spec_path, read_record
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats
from gpuq.views.preview import preview_lines, what_the_job_sees
from gpuq.views.render import stamp
from gpuq.views.status import status


def find_job(layout: Layout, config: Config, job_id: str) -> dict[str, Any] | None:
    """Everything known about one job, wherever it is."""
    damaged: dict[str, Any] | None = None
    for d in (layout.finished, layout.running):
        try:
            record = read_record(layout.record(d, job_id))
        except ValueError as e:  # empty or torn (a power cut): said, not a traceback
            damaged = damaged or {
                "id": job_id,
                "state": "unknown",
                "reason": f"state/{d.name}/{job_id}.json is not a record ({e}); after a power cut the box's "
                "worker removes such a file when it starts again: run `gpuq doctor`, or ask your admin",
            }
            continue
        if record is not None:
            out = mask_secrets(record.to_json())
            out["log"] = str(layout.job_log(job_id))
            if record.state is State.RUNNING and record.claimed_at:  # its record's started_at comes at its end
                out["elapsed_s"] = round(wall_time() - record.claimed_at, 1)
            out |= requeues(layout, job_id)
            peaks = _past_peaks(layout, record)
            if (suggested := suggest_gpu_mem(peaks)) is not None:
                out["suggested_gpu_mem"] = {"mib": suggested, "runs": len(peaks), "peak_mib": max(peaks)}
            if record.spec:  # empty when the spec never parsed (cancelled while pending): nothing to preview
                out["sees"] = what_the_job_sees(
                    layout, config, job_id, JobSpec.from_json(record.spec), record, record.uid
                )
            else:
                out["spec_note"] = "not known: its spec did not parse (nothing to run, nothing kept)"
            return out
    if damaged is not None:
        return damaged
    # Before jobs/: a spec a box has claimed is the job, whatever file took its name since.
    if claims := claims_of(layout, job_id):
        return {"id": job_id, "state": "running", "reason": _being_started(layout, claims[0])}
    if (path := pending_spec_path(layout, job_id)) is not None:
        view = status(layout, config)
        for p in view["pending"]:
            if p["id"] == job_id:
                out = {"id": job_id, "state": "pending", **p, **_pending_sees(layout, config, job_id, path)}
                out |= requeues(layout, job_id)  # waiting again after a preemption or a retry
                return out
        for p in view["invalid"]:
            if p["id"] == job_id:
                return {"id": job_id, "state": "pending", "reason": "not valid yet: " + p["error"]}
    for held in held_jobs(layout):
        if held["id"] == job_id:
            return {**held, "state": "held", **_pending_sees(layout, config, job_id, held_spec(layout, job_id))}
    err = layout.rejected / f"{job_id}.error"  # the first rejection under this id
    if err.exists():
        return {"id": job_id, "state": "rejected", "error": err.read_text().strip(), "spec_dir": str(layout.rejected)}
    return None


def _being_started(layout: Layout, claim: Path) -> str:
    """A claim with no record yet: a start under way, or one its box died in the middle of
    (it waits for that box: spool/decommission.py)."""
    parsed = parse_claim_name(claim.name)
    if parsed is None:
        return "being started"
    host = parsed[1]
    beat = next((hb for hb in load_heartbeats(layout) if hb.get("host") == host), None)
    if beat is not None and heartbeat_alive(beat, wall_time()):
        return f"being started on {host}"
    return (
        f"claimed by {host}, whose worker stopped before starting it: it starts when {host}'s worker "
        f"is back, or goes back to the queue with an admin's `gpuq forget {host}` if {host} is gone for good"
    )


def _pending_sees(layout: Layout, config: Config, job_id: str, path: Path) -> dict[str, Any]:
    """What a waiting (pending or held) job asks for and will see, as its record will say once
    it starts (scontrol show job's time limit and resources before the start); nothing when
    its file cannot be read or parsed now."""
    try:  # opened as a worker opens it: a link or a FIFO swapped in since status looked is no spec
        raw, st = read_spec_file(path, f"{path.parent.name}/{path.name}")
        spec = parse_spec_text(raw, path.name)
    except (OSError, SpecError):
        return {}
    previous = kept_attempt(layout, job_id)  # the attempt before the one it waits to run
    asks = {
        "attempt": next_attempt(previous),
        "time_limit_s": spec.time_limit_s or config.time_limit_s,
        "mem_limit_mib": spec.mem_mib or config.mem_mib,
        "cpus": spec.cpus or config.cpus,
        "spec": mask_secrets(spec.to_json()),
    }
    return {**asks, "sees": what_the_job_sees(layout, config, job_id, spec, None, st.st_uid, previous)}


def _requeue_line(requeue: dict[str, Any]) -> str:
    """One requeue under `preemptions:` or `retries:`: when (told to yield, where known, then
    back in the queue) and why."""
    when = stamp(requeue.get("t"))
    if isinstance(told := requeue.get("told"), (int, float)):
        when = f"{stamp(told)} told, {stamp(requeue.get('t'), '%H:%M:%S')} back in the queue:"
    return f"{'':<18}{when}  {requeue.get('reason') or ''}"


def requeues(layout: Layout, job_id: str) -> dict[str, list[dict[str, Any]]]:
    """Each time the job was put back into the queue for another attempt: `preemptions`
    (stopped to make way for other work) and `retries` (it failed, and a retry rule sent it
    back changed: run/retry.py), each `[{t, reason}]` (a preemption's with `told`: when its
    worker told it to yield), oldest first, and only where there were some; from the event
    logs (only lines naming the job are parsed)."""
    needle = f'"job":"{job_id}"'.encode()
    found: dict[str, list[dict[str, Any]]] = {}
    told: list[float] = []  # when its worker told it to yield (the "preempting" notes)
    for path in sorted(layout.events.glob("*.jsonl")):
        try:
            with open(path, "rb") as f:
                for line in f:
                    if needle in line and b'"note":"preempting"' in line:
                        if (note := checked_event(line)) and note["job"] == job_id:
                            told.append(note["t"])
                    if needle in line and b'"to":"pending"' in line:
                        event = checked_event(line)
                        if not event or event["job"] != job_id:
                            continue
                        kind = (
                            "preemptions"
                            if event.get("cause") == StopCause.PREEMPT.value
                            else "retries"
                            if event.get("retry") is True
                            else None
                        )
                        if kind is not None:
                            found.setdefault(kind, []).append({"t": event["t"], "reason": event.get("reason")})
        except OSError:
            continue
    for requeue in found.get("preemptions", ()):
        # A member read the requeue's time, a grace after the job was told, as the preemption's.
        before = [t for t in told if t <= requeue["t"]]
        if before:
            requeue["told"] = max(before)
    return {kind: sorted(events, key=lambda e: e["t"]) for kind, events in found.items()}


def _past_peaks(layout: Layout, record: Record) -> list[int]:
    """Peak GPU memory of finished jobs of the same name (`--name train` makes train-1,
    train-2, ...: their files share the stem, so only those are read)."""
    name = record.spec.get("name")
    stem = re.sub(r"-\d+$", "", record.id)
    peaks = []
    with os.scandir(layout.finished) as it:
        for entry in it:
            if not (entry.name.startswith(stem) and entry.name.endswith(".json")):
                continue
            try:
                past = read_record(Path(entry.path))
            except (ValueError, OSError):  # a torn or foreign file: no past run to learn from
                continue
            if (
                past is not None
                and past.peak_gpu_mem_mib
                and past.spec.get("name") == name
                and re.sub(r"-\d+$", "", past.id) == stem
            ):
                peaks.append(past.peak_gpu_mem_mib)
    return peaks


SHOW_ORDER = (
    "id",
    "state",
    "user",
    "attempt",
    "host",
    "gpus",
    "gpu_uuids",
    "gpu_mem_mib",
    "mps_pipe",  # an MPS client: its daemon, and its compute share there
    "mps_compute_pct",
    "position",
    "reason",
    "likely_start",
    "expected_start",
    "no_estimate",
    "error",
    "exit_code",
    "signal",
    "claimed_at",
    "started_at",
    "elapsed_s",  # a running job's: since its claim, as status's ELAPSED
    "ended_at",
    "time_limit_s",
    "mem_limit_mib",
    "cpus",  # a waiting job's: how many it will be pinned to (a started one's: which, cpu_cores)
    "cpu_cores",
    "peak_gpu_mem_mib",
    "mean_gpu_mem_mib",
    "mean_gpu_util_pct",
    "peak_rss_mib",
    "peak_cpus",
    "cpu_s",
    "log",
    "spec_dir",
)


# Why a pending job has no expected start (sched/estimate.py's words), for `gpuq show`.
NO_ESTIMATE_SAYS = {
    UNKNOWN: "unknown: a job it waits behind has no time limit (nor past runs of its kind to learn one from)",
    NO_ROOM: "none: no GPU has room for it even once the jobs ahead have ended (its reason says why)",
    LATER: "more than 90 days ahead, if the jobs ahead keep to their time limits",
    AFTER_DEPENDENCIES: "after its dependencies have ended",
    AFTER_BEGIN: "not before its begin time (--begin)",
    ARRAY_LIMIT: "as its array's running members end (its %N limit)",
    WHEN_IDLE: "when GPUs sit idle (an opportunistic job starts where ordinary work leaves room)",
    NOT_ESTIMATED: "not estimated (only the first pending jobs are)",
}


def show_text(job: dict[str, Any], whole_env: bool = False) -> str:
    spec = job.get("spec")
    command = safe_text(command_shown(spec.get("command"))) if isinstance(spec, dict) else ""  # before escaping
    job = safe_tree(job)
    lines = []
    for key in SHOW_ORDER:
        value = job.get(key)
        if value in (None, "", []):
            continue
        label = key  # the unit goes into the value, so the label says what it is
        if key == "likely_start" and isinstance(value, (int, float)):
            value = f"{stamp(value, '%Y-%m-%d %H:%M:%S')}, if the jobs ahead run as long as their kinds usually do"
        elif key == "expected_start" and isinstance(value, (int, float)):
            due = stamp(math.ceil(value), "%Y-%m-%d %H:%M:%S")  # rounded up: it is a latest start
            value = f"by {due} at the latest, if the jobs ahead keep to their time limits"
        elif key == "no_estimate":
            label, value = "expected_start", NO_ESTIMATE_SAYS.get(str(value), str(value))
        elif key.endswith("_at") and isinstance(value, (int, float)):
            value = stamp(value)
        elif key.endswith("_mib"):
            label, value = key.removesuffix("_mib"), format_mib(value)
        elif key.endswith("_pct"):
            label, value = key.removesuffix("_pct"), f"{value}%"
        elif key == "time_limit_s" and isinstance(value, (int, float)):  # exactly, as Slurm shows one
            label, value = "time_limit", format_clock(value)
        elif key.endswith("_s") and isinstance(value, (int, float)):
            label, value = "cpu_time" if key == "cpu_s" else key.removesuffix("_s"), format_duration(value)
        elif key == "gpus" and isinstance(value, list):  # a started job's: which ones, not how many
            value = f"{len(value)} (index {','.join(map(str, value))})"
        elif isinstance(value, list):
            value = ",".join(map(str, value))
        lines.append(f"{label + ':':<17} {value}" if len(label) >= 17 else f"{label + ':':<18}{value}")
    for kind in ("preemptions", "retries"):
        if isinstance(requeued := job.get(kind), list) and requeued:
            lines.append(f"{kind + ':':<18}{len(requeued)}")
            lines += [_requeue_line(p) for p in requeued if isinstance(p, dict)]
    if isinstance(job.get("started_at"), (int, float)) and isinstance(job.get("ended_at"), (int, float)):
        lines.append(f"{'duration:':<18}{format_duration(job['ended_at'] - job['started_at'])}")
    if suggested := job.get("suggested_gpu_mem"):
        lines.append(
            f"suggested gpu_mem: {format_mib(suggested['mib'])} (peak {format_mib(suggested['peak_mib'])} "
            f"over {suggested['runs']} finished run{'s' if suggested['runs'] != 1 else ''} of this name, +10%)"
        )
    spec = job.get("spec")
    if spec:
        lines.append(f"{'command:':<18}{command}")
        if spec.get("workdir"):
            lines.append(f"{'workdir:':<18}{spec['workdir']}")
        if spec.get("env"):
            lines.append(
                f"{'env:':<18}{len(spec['env'])} variables from the spec"
                + ("" if whole_env else f" (gpuq show {job.get('id')} --env lists the whole environment)")
            )
    elif job.get("command"):
        lines.append(f"{'command:':<18}{job['command']}")
    elif job.get("spec_note"):
        lines.append(f"{'spec:':<18}{job['spec_note']}")
    if job.get("sees"):
        lines += preview_lines(job["sees"], job["id"], whole_env)
    return "\n".join(lines)
