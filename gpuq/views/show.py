"""`gpuq show ID`'s read model: everything known about one job, wherever it is, with what it
sees when it runs (views/preview.py) and the memory its past runs peaked at."""

from __future__ import annotations

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
from gpuq.model.spec import JobSpec, parse_spec_text
from gpuq.model.stops import StopCause
from gpuq.spool.holds import held_jobs, held_spec
from gpuq.spool.intake import read_spec_file
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event, claims_of, pending_spec_path, read_record
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats
from gpuq.views.preview import what_the_job_sees
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
            if preempted := preemptions(layout, job_id):
                out["preemptions"] = preempted
            peaks = _past_peaks(layout, record)
            if (suggested := suggest_gpu_mem(peaks)) is not None:
                out["suggested_gpu_mem"] = {"mib": suggested, "runs": len(peaks), "peak_mib": max(peaks)}
            if record.spec:  # empty when the spec never parsed (cancelled while pending): nothing to preview
                out["sees"] = _sees(layout, config, job_id, JobSpec.from_json(record.spec), record, record.uid)
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
                if preempted := preemptions(layout, job_id):  # waiting again after one
                    out["preemptions"] = preempted
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


def _sees(
    layout: Layout, config: Config, job_id: str, spec: JobSpec, record: Record | None, uid: int | None
) -> dict[str, Any]:
    return what_the_job_sees(layout, config, job_id, spec, record, uid)


def _pending_sees(layout: Layout, config: Config, job_id: str, path: Path) -> dict[str, Any]:
    """What a waiting (pending or held) job asks for and will see, as its record will say once
    it starts (scontrol show job's time limit and resources before the start); nothing when
    its file cannot be read or parsed now."""
    try:  # opened as a worker opens it: a link or a FIFO swapped in since status looked is no spec
        raw, st = read_spec_file(path, f"{path.parent.name}/{path.name}")
        spec = parse_spec_text(raw, path.name)
    except (OSError, SpecError):
        return {}
    asks = {
        "time_limit_s": spec.time_limit_s or config.time_limit_s,
        "mem_limit_mib": spec.mem_mib or config.mem_mib,
        "cpus": spec.cpus or config.cpus,
        "spec": mask_secrets(spec.to_json()),
    }
    return {**asks, "sees": _sees(layout, config, job_id, spec, None, st.st_uid)}


def preemptions(layout: Layout, job_id: str) -> list[dict[str, Any]]:
    """Each time the job was stopped to make way for other work and put back: `[{t, reason}]`,
    oldest first, from the event logs (only lines naming the job are parsed)."""
    needle = f'"job":"{job_id}"'.encode()
    found = []
    for path in sorted(layout.events.glob("*.jsonl")):
        try:
            with open(path, "rb") as f:
                for line in f:
                    if needle in line and b'"to":"pending"' in line:
                        event = checked_event(line)
                        if event and event["job"] == job_id and event.get("cause") == StopCause.PREEMPT.value:
                            found.append({"t": event["t"], "reason": event.get("reason")})
        except OSError:
            continue
    return sorted(found, key=lambda e: e["t"])


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
