"""What a worker does with specs as they arrive in jobs/: one that stayed invalid, or reuses
an id an earlier job had, goes to state/rejected/ with an .error file beside it that names the
file, the field and the fix; a sweep is expanded into its member jobs (sweeps.py)."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .faults import wall_time
from .intake import Entry, Intake
from .layout import Layout
from .spec import SpecError
from .render import safe_text
from .spool import append_event, atomic_write, has_record
from .strict_yaml import load_yaml
from .sweeps import GroupError, expand_dropped_sweep

log = logging.getLogger("gpuq.worker")


class Arrivals:
    def __init__(self, layout: Layout, host: str, intake: Intake) -> None:
        self.layout, self.host, self.intake = layout, host, intake
        self.unmovable: set[str] = set()  # refused specs this worker may not move
        self.expand_sweeps = True         # a Slurm bridge hands a sweep over whole, as an array

    def take_in(self, now: float, settle_s: float) -> None:
        """After a scan: reject what stayed invalid and reused ids; expand sweeps."""
        for job_id, entry in self.intake.settled_errors(now, settle_s):
            self.reject(job_id, entry.path, str(entry.error))
        for entry in self.intake.take_unchecked():
            job_id = entry.job.id  # type: ignore[union-attr]
            if has_record(self.layout, job_id):
                self.reject(job_id, entry.path, str(SpecError(
                    f"jobs/{entry.name}", None, f"job id '{job_id}' is already used by an earlier job",
                    f"rename the file (e.g. {job_id}-2.yaml), or use `gpuq submit`, which picks a free id")))
            elif entry.job.spec.array or (entry.job.spec.sweep and self.expand_sweeps):  # type: ignore[union-attr]
                self.expand_sweep(job_id, entry)

    def expand_sweep(self, job_id: str, entry: Entry) -> None:
        try:
            members = expand_dropped_sweep(self.layout, entry.path, job_id,
                                           load_yaml(entry.text, f"jobs/{entry.name}"))
        except (GroupError, SpecError) as e:
            self.reject(job_id, entry.path, f"jobs/{entry.name}: {e}")
            return
        self.intake.forget(job_id)
        if members:
            log.info("sweep %s: %d jobs", job_id, len(members))

    def reject(self, job_id: str, path: Path, message: str) -> None:
        suffix = ".yml" if path.name.endswith(".yml") else ".yaml"
        dest = self.layout.rejected / f"{job_id}{suffix}"
        if dest.exists() or dest.is_symlink():
            dest = self.layout.rejected / f"{job_id}.{int(wall_time())}{suffix}"
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return  # taken or removed meanwhile
        except PermissionError:  # another user's file in a sticky jobs/: it stays, and status shows why
            if path.name not in self.unmovable:
                self.unmovable.add(path.name)
                log.warning("cannot move %s to rejected/ (%s)", path.name, message)
            return
        message = safe_text(message)  # a field name may hold a newline: one line, never more
        atomic_write(dest.parent / f"{dest.name.rsplit('.', 1)[0]}.error", (message + "\n").encode(), mode=0o644)
        append_event(self.layout, self.host, {"job": job_id, "from": "pending", "to": "rejected",
                                              "reason": message})
        self.intake.forget(job_id)
        log.warning("rejected %s", message)
