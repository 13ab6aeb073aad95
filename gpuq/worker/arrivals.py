"""What a worker does with specs as they arrive in jobs/: one that stayed invalid, or reuses
an id an earlier job had, goes to state/rejected/ with an .error file beside it that names the
file, the field and the fix; a sweep is expanded into its member jobs (spool/sweeps.py)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from gpuq.model.errors import SpecError
from gpuq.model.groups import GroupError, parse_array
from gpuq.model.strict_yaml import load_yaml
from gpuq.spool.ids import held_for
from gpuq.spool.intake import Entry, user_name
from gpuq.spool.store import all_claims, has_record
from gpuq.spool.sweeps import expand_dropped_sweep, group_file
from gpuq.worker.box import Box
from gpuq.worker.returns import reject

log = logging.getLogger("gpuq.worker")


def _jobs_in(entry: Entry) -> int:
    """How many jobs a spec stands for: a sweep's or an array's members, else 1."""
    spec = entry.job.spec if entry.job is not None else None
    if spec is None:
        return 1
    if spec.array:
        return len(parse_array(spec.array))
    size = 1
    for _, values in spec.sweep:
        size *= max(1, len(values))
    return size


# Sweeps and arrays expanded in one pass stop once this many members were written (one whole
# sweep always goes): 24 arrays of 1,000 dropped at once held a pass, and the heartbeat, 44 s.
MEMBERS_PER_PASS = 1000
# How long one pass may spend refusing and checking what it read (intake.READ_BUDGET_S bounds
# the reading): 60,000 broken links a member made, each read in microseconds, were all refused in
# one pass, 18 s without a heartbeat (an attack review). The rest waits for the next pass.
TAKE_IN_BUDGET_S = 2.0


@dataclass(frozen=True)
class PendingLimits:
    """What one member may have pending (config max_pending_per_user, ..._size_per_user)."""

    specs: int = 10000
    size_mib: int = 64
    exempt: frozenset[str] = frozenset()  # admins' user names

    def refusal(self, user: str, held: tuple[int, int], adding: tuple[int, int]) -> str | None:
        """Why `user`, who has `held` (specs, bytes) pending, may not add `adding`; or None."""
        if user in self.exempt:
            return None
        specs, size = held[0] + adding[0], held[1] + adding[1]
        if specs > self.specs:
            return f"{user} would have {specs} pending specs, over config max_pending_per_user {self.specs}"
        if size > self.size_mib * 2**20:
            return (
                f"{user}'s pending specs would come to {size / 2**20:.1f} MiB, over config "
                f"max_pending_size_per_user {self.size_mib}MiB"
            )
        return None


class Arrivals:
    def __init__(self, box: Box, limits: PendingLimits | None = None) -> None:
        self.box = box
        self.layout, self.host, self.intake = box.layout, box.host, box.intake
        self.limits = limits or PendingLimits()
        self.expand_sweeps = True  # a Slurm bridge hands a sweep over whole, as an array
        self.behind = False  # the last take_in left work to the next pass (TAKE_IN_BUDGET_S)
        self._owner_checked: dict[str, tuple] = {}  # unsettled id -> the file version checked against its id

    def take_in(self, now: float, settle_s: float) -> None:
        """After a scan: reject what stayed invalid and reused ids; expand sweeps. For at most
        TAKE_IN_BUDGET_S: what is left waits for the next pass (`behind`)."""
        deadline = time.monotonic() + TAKE_IN_BUDGET_S
        self.behind = False
        for n, (job_id, entry) in enumerate(self.intake.settled_errors(now, settle_s)):
            if n and self._over(deadline):
                break
            reject(self.box, job_id, entry.path, str(entry.error))
        self._refuse_unsettled_under_held_ids(deadline)
        self._refuse_duplicates()
        claimed: dict[str, list[tuple[str, str]]] | None = None  # listed once, and only if needed
        expanded = 0  # sweep and array members written this pass
        unchecked = self.intake.take_unchecked()
        held = self._pending_by_user({e.name for e in unchecked}) if unchecked else {}
        for n, entry in enumerate(unchecked):
            job_id = entry.job.id  # type: ignore[union-attr]
            user = entry.job.user  # type: ignore[union-attr]
            if n and self._over(deadline):
                self.intake.check_later(job_id)  # checked, and planned, from the next pass on
                continue
            members = _jobs_in(entry)
            adding = (members, entry.key[1] * members)
            if (over := self.limits.refusal(user, held.get(user, (0, 0)), adding)) is not None:
                reject(
                    self.box,
                    job_id,
                    entry.path,
                    str(SpecError(f"jobs/{entry.name}", None, over, "wait for some to start, or cancel some")),
                    retry_mends=False,
                )
                continue
            count, size = held.get(user, (0, 0))
            held[user] = (count + adding[0], size + adding[1])
            sweep = entry.job.spec.array or (entry.job.spec.sweep and self.expand_sweeps)  # type: ignore[union-attr]
            if sweep and expanded >= MEMBERS_PER_PASS:
                self.intake.check_later(job_id)  # the next pass: the heartbeat must not wait on them all
                continue
            if claimed is None:
                claimed = self._claims_by_id()
            taken = self._id_taken(job_id, entry.job.user, entry, claimed.get(job_id, []))  # type: ignore[union-attr]
            if taken:
                reject(
                    self.box,
                    job_id,
                    entry.path,
                    str(
                        SpecError(
                            f"jobs/{entry.name}",
                            None,
                            f"job id '{job_id}' {taken}",
                            f"rename the file (e.g. {job_id}-2.yaml), or use `gpuq submit`, which picks a free id",
                        )
                    ),
                    retry_mends=False,
                )
            elif sweep:
                expanded += self.expand_sweep(job_id, entry)

    def _over(self, deadline: float) -> bool:
        """Past this pass's budget: the rest is the next pass's (each step does one thing first)."""
        if time.monotonic() > deadline:
            self.behind = True
        return self.behind

    def _refuse_unsettled_under_held_ids(self, deadline: float) -> None:
        """A file that is not a spec yet waits to settle, unless its id is held for another
        user's job (spool/ids.py, held_for): it must not keep her job out of jobs/. Each
        version of a file is looked at once (thousands may wait to settle, pass after pass)."""
        unsettled = self.intake.unsettled()
        self._owner_checked = {i: k for i, k in self._owner_checked.items() if i in unsettled}
        looked = 0
        for job_id in list(unsettled):
            entry = self.intake.entries[job_id]
            if self._owner_checked.get(job_id) == entry.key:
                continue
            if looked and self._over(deadline):
                return
            looked += 1
            self._owner_checked[job_id] = entry.key
            holder = held_for(self.layout, job_id)
            try:
                mine = holder is None or os.lstat(entry.path).st_uid == holder
            except OSError:
                continue
            if not mine:
                reject(
                    self.box,
                    job_id,
                    entry.path,
                    f"jobs/{entry.name}: job id '{job_id}' belongs to {user_name(holder)}'s job (and this file is not "
                    f"a valid spec yet). Fix: rename the file (e.g. {job_id}-2.yaml).",
                    retry_mends=False,
                )

    def _refuse_duplicates(self) -> None:
        """A second file of one id (x.yml beside x.yaml): refused, the first stays the job."""
        for name, job_id in self.intake.take_duplicates():
            other = self.intake.entries[job_id].name
            reject(
                self.box,
                job_id,
                self.layout.jobs / name,
                str(
                    SpecError(
                        f"jobs/{name}",
                        None,
                        f"jobs/{other} already has the id '{job_id}'",
                        f"rename the file (e.g. {job_id}-2.yaml)",
                    )
                ),
                forget=False,
                retry_mends=False,
            )

    def _pending_by_user(self, new: set[str]) -> dict[str, tuple[int, int]]:
        """Each user's accepted pending specs: (count, bytes), the files `new` left out."""
        held: dict[str, tuple[int, int]] = {}
        for entry in self.intake.entries.values():
            if entry.job is not None and entry.name not in new:
                count, size = held.get(entry.job.user, (0, 0))
                held[entry.job.user] = (count + 1, size + entry.key[1])
        return held

    def _claims_by_id(self) -> dict[str, list[tuple[str, str]]]:
        """Job id -> (claim file name, host that claimed it), for every claim in state/claims/."""
        by_id: dict[str, list[tuple[str, str]]] = {}
        for job_id, host, name in all_claims(self.layout):
            by_id.setdefault(job_id, []).append((name, host))
        return by_id

    def _id_taken(self, job_id: str, user: str, entry: Entry, claims: list[tuple[str, str]]) -> str | None:
        """Why a new spec may not have this id: an earlier job's, a group's, another spec's
        that a box has claimed (a box that died right after its claim keeps it until it is
        back or forgotten), or another user's (spool/ids.py, held_for: held, on its way back)."""
        if has_record(self.layout, job_id):
            return "is already used by an earlier job"
        for name, host in claims:
            try:
                if os.lstat(self.layout.claims / name).st_ino != entry.key[2]:  # not this very file, claimed since
                    return f"is the id of a job being started on {host}"
            except FileNotFoundError:
                continue
        if group_file(self.layout, job_id).exists():
            return "is the id of a sweep or array"
        owner = held_for(self.layout, job_id)
        if owner is not None and user_name(owner) != user:
            return f"belongs to {user_name(owner)}'s job"
        return None

    def expand_sweep(self, job_id: str, entry: Entry) -> int:
        """Its members into jobs/; how many were written."""
        try:
            members = expand_dropped_sweep(self.layout, entry.path, job_id, load_yaml(entry.text, f"jobs/{entry.name}"))
        except (GroupError, SpecError) as e:
            reject(self.box, job_id, entry.path, f"jobs/{entry.name}: {e}")
            return 0
        self.intake.forget(job_id)
        if members:
            kind = "array" if entry.job is not None and entry.job.spec.array else "sweep"
            log.info("%s %s: %d jobs", kind, job_id, len(members))
        return len(members or ())
