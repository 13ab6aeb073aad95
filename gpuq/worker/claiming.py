"""Claiming a spec the plan chose: the one step between a pending spec in jobs/ and its
record, shared by a worker's starts and the Slurm bridge's hand-overs. The spec is renamed
into claims/ under its next attempt's claim name (exactly one claimer wins), and its owner is
read from the claimed file itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from gpuq.host.faults import crash_point
from gpuq.host.files import read_json
from gpuq.model.errors import SpecError
from gpuq.model.record import claim_name
from gpuq.spool.ids import reserve
from gpuq.spool.intake import Entry, read_spec_file, user_name
from gpuq.spool.store import claim, keep_place, next_attempt
from gpuq.worker.box import Box
from gpuq.worker.returns import put_back, reject


class Claimed(NamedTuple):
    """A planned spec, claimed: its intake entry, the claim file, its owner and its attempt
    (and the record of the attempt before, kept in requeued/, if any)."""

    entry: Entry
    path: Path
    uid: int
    attempt: int
    previous: Any


class Claimer:
    def __init__(self, box: Box) -> None:
        self.box = box
        self.layout, self.host, self.boot_id, self.intake = box.layout, box.host, box.boot_id, box.intake

    def claim(self, job_id: str, crash_prefix: str = "worker") -> Claimed | None:
        """Claim a spec the plan chose, as its next attempt. None: there is none to start (gone
        from the intake, taken by another worker, cancelled, or put back or refused by
        owner_of_claimed)."""
        entry = self.intake.entries.get(job_id)
        if entry is None or entry.job is None:
            return None
        crash_point(f"{crash_prefix}:planned")
        # The id is the job's owner's before the claim is made (spool/ids.py): a box that dies
        # right after its claim leaves her job's id hers. Not synced, as the start's record is
        # not: the job's supervisor syncs both.
        try:
            holder = reserve(self.layout, job_id, entry.uid, durable=False)
        except OSError:
            return None  # a full disk: the job waits in jobs/ (its record could not be written either)
        if holder not in (entry.uid, None):
            self.not_that_job(job_id, entry.path, holder)
            return None
        previous = read_json(self.layout.record(self.layout.requeued, job_id))
        attempt = next_attempt(previous)
        claimed = claim(self.layout, entry.path, claim_name(job_id, self.host, self.boot_id, attempt))
        self.intake.forget(job_id)
        if claimed is None:
            return None  # another worker took it, or it was cancelled
        crash_point(f"{crash_prefix}:claimed")
        uid = self.owner_of_claimed(job_id, entry, claimed)
        if uid is not None and holder is not None and uid != holder:  # replaced since the scan by another's file
            self.not_that_job(job_id, claimed, holder)
            return None
        return None if uid is None else Claimed(entry, claimed, uid, attempt, previous)

    def not_that_job(self, job_id: str, path: Path, holder: int) -> None:
        """A file under the id of another user's job: refused (a new name is the only fix)."""
        reject(
            self.box,
            job_id,
            path,
            f"jobs/{job_id}.yaml: job id '{job_id}' belongs to {user_name(holder)}'s job. "
            f"Fix: rename the file (e.g. {job_id}-2.yaml).",
            retry_mends=False,
        )

    def owner_of_claimed(self, job_id: str, entry: Entry, claimed: Path) -> int | None:
        """The owner of the spec just claimed, from fstat of the claimed file itself (opened
        without following a link): a plain file with one link, the very bytes read at intake,
        and an owner this worker may submit for. Between the scan and the rename, its owner
        could have replaced jobs/<id>.yaml by a link to anyone's file (the rename takes the
        link) or edited it. None: the claim was put back (edited: read again next pass) or
        rejected (the file itself is wrong: that does not mend)."""
        display = f"jobs/{entry.name}"
        try:
            raw, st = read_spec_file(claimed, display)
            if self.intake.policy is not None:
                self.intake.policy.check(st, display)
        except SpecError as e:
            reject(self.box, job_id, claimed, str(e))
            return None
        except OSError as e:
            reject(
                self.box,
                job_id,
                claimed,
                f"{display}: cannot be read ({e.strerror}). Fix: make it a plain file readable by the worker",
            )
            return None
        if raw != entry.text:  # edited in place since the scan: read again, at its place
            keep_place(self.layout, job_id, st.st_uid, entry.job.queued_at)  # type: ignore[union-attr]
            put_back(self.box, job_id, claimed)
            return None
        return st.st_uid
