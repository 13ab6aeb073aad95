"""Whether a job id is taken: ids become file names in every part of the spool, and are
never reused (a record and a log always name one job), so a new job's id must be free in
all of them. Asked by `gpuq submit` and by the worker creating a held submission."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuq.spool.layout import Layout
from gpuq.spool.store import claims_of, has_record, pending_spec_path
from gpuq.spool.sweeps import group_file, kept_spec


def _rejected_name(job_id: str) -> re.Pattern[str]:
    """The names a job's rejected files have in state/rejected/: <id>.yaml|.yml|.error, a
    later rejection's <id>.<time>.<6 hex><suffix>, a set-aside <id>.<8 hex><suffix> or
    .not-a-spec. Ids hold dots, so a glob `data.*` would also take the rejected `data.v2.yaml`."""
    return re.compile(re.escape(job_id) + r"(\.\d+\.[0-9a-f]{6}|\.[0-9a-f]{8})?\.(yaml|yml|error|not-a-spec)")


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def id_taken(layout: Layout, job_id: str) -> bool:
    """Whether any job, group, claim, rejected or held spec has `job_id`, or a job on its way
    back to the queue (a place or an attempt kept for it: the worker would refuse a new spec
    under that id). A group is its record (groups/<id>.json) or, while a worker expands it, its
    spec kept as groups/<id>.yaml (moved out of jobs/ before the record is written)."""
    return (
        pending_spec_path(layout, job_id) is not None
        or has_record(layout, job_id)
        or layout.record(layout.places, job_id).exists()
        or layout.record(layout.requeued, job_id).exists()
        or bool(claims_of(layout, job_id))
        or any(map(_rejected_name(job_id).fullmatch, _names(layout.rejected)))
        or group_file(layout, job_id).exists()
        or kept_spec(layout, job_id).exists()
        or (layout.held / f"{job_id}.yaml").exists()
    )
