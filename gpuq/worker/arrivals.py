"""What a worker does with specs as they arrive in jobs/: one that stayed invalid, or reuses
an id an earlier job had, goes to state/rejected/ with an .error file beside it that names the
file, the field and the fix; a sweep is expanded into its member jobs (spool/sweeps.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuq.host.faults import wall_time
from gpuq.host.files import atomic_write, set_aside_directory
from gpuq.host.owners import others_may_write
from gpuq.model.errors import SpecError
from gpuq.model.groups import GroupError, parse_array
from gpuq.model.names import JOB_ID_RE
from gpuq.model.states import State
from gpuq.model.strict_yaml import load_yaml
from gpuq.model.text import safe_text
from gpuq.spool.ids import held_for
from gpuq.spool.intake import Entry, Intake, user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import StateChange, all_claims, found_job, has_record
from gpuq.spool.sweeps import expand_dropped_sweep, group_file

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
    def __init__(self, layout: Layout, host: str, intake: Intake, limits: PendingLimits | None = None) -> None:
        self.layout, self.host, self.intake = layout, host, intake
        self.limits = limits or PendingLimits()
        self.unmovable: set[str] = set()  # refused specs this worker may not move
        self.expand_sweeps = True  # a Slurm bridge hands a sweep over whole, as an array

    def take_in(self, now: float, settle_s: float) -> None:
        """After a scan: reject what stayed invalid and reused ids; expand sweeps."""
        for job_id, entry in self.intake.settled_errors(now, settle_s):
            self.reject(job_id, entry.path, str(entry.error))
        claimed: dict[str, list[tuple[str, str]]] | None = None  # listed once, and only if needed
        # A file that is not a spec yet waits to settle, unless its id is held for another
        # user's job (spool/ids.py, held_for): it must not keep her job out of jobs/.
        for job_id in list(self.intake.unsettled()):
            entry = self.intake.entries[job_id]
            holder = held_for(self.layout, job_id)
            try:
                mine = holder is None or os.lstat(entry.path).st_uid == holder
            except OSError:
                continue
            if not mine:
                self.reject(
                    job_id,
                    entry.path,
                    f"jobs/{entry.name}: job id '{job_id}' belongs to {user_name(holder)}'s job (and this file is not "
                    f"a valid spec yet). Fix: rename the file (e.g. {job_id}-2.yaml).",
                    retry_mends=False,
                )
        for name, job_id in self.intake.take_duplicates():
            other = self.intake.entries[job_id].name
            self.reject(
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
        expanded = 0  # sweep and array members written this pass
        unchecked = self.intake.take_unchecked()
        held = self._pending_by_user({e.name for e in unchecked}) if unchecked else {}
        for entry in unchecked:
            job_id = entry.job.id  # type: ignore[union-attr]
            user = entry.job.user  # type: ignore[union-attr]
            members = _jobs_in(entry)
            adding = (members, entry.key[1] * members)
            if (over := self.limits.refusal(user, held.get(user, (0, 0)), adding)) is not None:
                self.reject(
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
                self.reject(
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
            self.reject(job_id, entry.path, f"jobs/{entry.name}: {e}")
            return 0
        self.intake.forget(job_id)
        if members:
            log.info("sweep %s: %d jobs", job_id, len(members))
        return len(members or ())

    def _set_aside(self, path: Path, message: str) -> Path | None:
        """A member's directory posing as a spec: renamed aside in jobs/ (set_aside_directory)."""
        try:
            return set_aside_directory(path, self.layout.jobs, "spec")
        except OSError:
            self._unmovable(path, message)
            return None

    def _others_may_have_written(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and others_may_write(st.st_mode, os.stat(self.layout.jobs).st_mode)

    def _unmovable(self, path: Path, message: str) -> None:
        if path.name not in self.unmovable:
            self.unmovable.add(path.name)
            log.warning("cannot move %s to rejected/ (%s)", safe_text(path.name), safe_text(message))

    def reject(self, job_id: str, path: Path, message: str, forget: bool = True, retry_mends: bool = True) -> None:
        """`retry_mends`: whether `gpuq retry` could ever put this spec back (never for an id that
        is another job's: under that id, retry is that job's, and only a new name is a fix)."""
        suffix = ".yml" if path.name.endswith(".yml") else ".yaml"
        # A name that is not a job id (250 characters, a line break) is kept under one of gpuq's:
        # its event names it, and every reader of events takes only ids (store.checked_event).
        fits = JOB_ID_RE.fullmatch(job_id) is not None
        stem = (
            job_id if fits else f"bad-name-{hashlib.sha1(job_id.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"
        )
        dest = self.layout.rejected / f"{stem}{suffix}"
        # The .error is named by the stem alone: x.yml refused beside x.yaml must not take its.
        # And rejected/<id>.yaml is the id's own refused spec, which `gpuq retry <id>` puts
        # back: a file refused for an id that is another job's never takes that name, nor one
        # others could write (a handle opened then outlives any chmod: its text may be theirs).
        unsafe = self._others_may_have_written(path)
        if (
            not retry_mends
            or unsafe
            or any(os.path.lexists(self.layout.rejected / f"{stem}{s}") for s in (".yaml", ".yml", ".error"))
        ):
            dest = self.layout.rejected / f"{stem}.{int(wall_time())}.{os.urandom(3).hex()}{suffix}"
        error = dest.parent / f"{dest.name.rsplit('.', 1)[0]}.error"
        if unsafe and retry_mends and not os.path.lexists(self.layout.rejected / f"{stem}.error"):
            error = self.layout.rejected / f"{stem}.error"  # its owner's: status shows it, retry finds no spec
        try:
            os.rename(path, dest)
        except FileNotFoundError:
            return  # taken or removed meanwhile
        except PermissionError:  # a member's directory cannot leave jobs/ (its `..` is theirs)
            dest = self._set_aside(path, message) or dest
            if dest.parent != self.layout.jobs:
                return
        except OSError:  # another user's file in a sticky jobs/ (or a name it cannot take): it stays
            return self._unmovable(path, message)
        if dest.parent != self.layout.jobs and (aside := self._set_aside(dest, message)) is not None:
            dest = aside  # a directory, moved: back to its maker
        if dest.parent == self.layout.jobs:  # a member's directory, set aside where they can remove it
            message = safe_text(f"{message} The directory is left as jobs/{dest.name}: remove it.")
        else:
            # The fix a message names is for the file as it was in jobs/: say where it is now, and
            # name that path, whole, in the fix itself (a `chmod go-w jobs/x.yaml` would miss it).
            what, fix_word, fix = message.partition("Fix: ")
            message = what + fix_word + fix.replace(f"jobs/{path.name}", str(dest))
            kept = f" The spec is kept as state/rejected/{dest.name}"
            message = safe_text(
                message
                + (
                    f"{kept}: fix it there (or drop a fixed one), then `gpuq retry {stem}`."
                    if retry_mends and retryable(dest, job_id, self.layout)
                    else f"{kept}."
                )
            )  # one line, never more
        atomic_write(error, (message + "\n").encode(), mode=0o644)
        try:  # whose spec it was: the moved file's owner (reports count it for them, not "?")
            st = os.lstat(dest)
            owner, uid = user_name(st.st_uid), st.st_uid
        except OSError:
            owner, uid = "", -1
        found = found_job(self.layout, stem, path, uid, owner)
        StateChange(self.layout, found, State.REJECTED, self.host, reason=message).log()  # its spec is its record
        if forget:
            self.intake.forget(job_id)
        log.warning("rejected %s", message)


def retryable(kept: Path, job_id: str, layout: Layout) -> bool:
    """Whether `gpuq retry` can put a refused spec back (spool/holds.py): kept under its own id,
    a plain file with one link that no other member may have written. Else the fix is a new spec."""
    try:
        st = os.lstat(kept)
    except OSError:
        return False
    return (
        kept.name.rsplit(".", 1)[0] == job_id
        and JOB_ID_RE.match(job_id) is not None
        and stat.S_ISREG(st.st_mode)
        and st.st_nlink == 1
        and not others_may_write(st.st_mode, os.stat(layout.jobs).st_mode)
    )
