"""hold / release / edit / retry, as a worker applies them (requests from spool/inbox.py): moving a
job between the queue and the places beside it. Each checks the actor (the request file's
owner) against the job's owner on the file the worker moved or on the worker's own record.

- hold: the pending spec is renamed from jobs/ into state/held/ (the same atomic rename a
  claim is: if a worker claimed it first, the hold is refused — it is running). A record
  beside it says who held it and when.
- release: the record goes first, then the spec is linked back into jobs/ (never over a
  file a user put there meanwhile). A rename keeps the file's mtime: its old place in the
  queue. A crash in between leaves the spec in held/, still held, and release works again.
- edit: the CLI holds the job, runs $EDITOR on a copy and validates it; the request carries
  the new text, which replaces the held spec (the owner's, with its old mtime) and, unless
  the job was held before, releases it.
- retry: a finished job's record is kept in requeued/ (so the next attempt is numbered +1),
  the finished record goes, and its spec text goes back into jobs/ as a new submission,
  owned by the job's owner. A crash after the record went and before the spec was placed
  is finished by running retry again. A rejected spec (moved to rejected/ as it was) is
  moved back into jobs/, to be checked again.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from gpuq.host.faults import wall_time
from gpuq.host.files import atomic_write, create_owned, read_json
from gpuq.host.owners import Actor, others_may_write, refusal
from gpuq.model.errors import SpecError
from gpuq.model.names import JOB_ID_RE, KEPT_APART, KEPT_APART_RE, natural_order
from gpuq.model.record import Record
from gpuq.model.spec import parse_spec_text
from gpuq.model.states import State, TransitionError
from gpuq.spool.deps import FINAL, DependencyStates
from gpuq.spool.ids import held_for, id_taken, reserve, reserve_new
from gpuq.spool.intake import keeper, read_spec_file, user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import (
    StateChange,
    claims_of,
    forget_place,
    found_job,
    has_record,
    keep_place,
    kept_place,
    move_new,
    pending_spec_path,
    pending_specs,
    put_back,
    read_record,
    unclaim,
)
from gpuq.spool.sweeps import group_file


class HoldError(Exception):
    pass


def held_spec(layout: Layout, job_id: str) -> Path:
    return layout.held / f"{job_id}.yaml"


def _check_owner(job_id: str, owner: int, actor: Actor) -> None:
    if not actor.may_act_on(owner):
        raise HoldError(refusal(job_id, owner))


def _check_recorded_owner(layout: Layout, job_id: str, actor: Actor) -> None:
    """Refused unless `actor` may change the job its record (the worker wrote it) belongs to."""
    for directory in (layout.running, layout.finished, layout.held):
        try:
            record = read_record(layout.record(directory, job_id))
        except (ValueError, OSError):  # RecordError too
            raise HoldError(f"{job_id}: its record is damaged; an admin should look at state/") from None
        if record is not None:
            _check_owner(job_id, record.uid, actor)
            return


def _held(layout: Layout, job_id: str, actor: Actor, missing: str) -> tuple[Path, os.stat_result]:
    """The held spec and its stat, once `actor` may change it (state/held/ is the worker's:
    its files are what the worker moved there)."""
    src = held_spec(layout, job_id)
    try:
        st = os.lstat(src)
    except FileNotFoundError:
        raise HoldError(missing) from None
    _check_owner(job_id, st.st_uid, actor)
    return src, st


def hold(layout: Layout, job_id: str, host: str, actor: Actor, why: str = "") -> str:
    # Whose it is, before what it is: another's held or running job is refused as another's.
    held = held_spec(layout, job_id)
    if os.path.lexists(held):
        _check_owner(job_id, os.lstat(held).st_uid, actor)
        raise HoldError(f"{job_id}: already held; `gpuq release {job_id}` puts it back")
    if has_record(layout, job_id):  # a file in jobs/ under a running or ended job's id is not that job
        _check_recorded_owner(layout, job_id, actor)
        raise HoldError(f"{job_id}: not pending (only a job waiting in the queue can be held or edited)")
    files = pending_specs(layout, job_id)
    spec_path = keeper(layout, job_id, files)  # a member's file under another's id is not that job
    if spec_path is None:
        if files and (holder := held_for(layout, job_id)) is not None:
            raise HoldError(refusal(job_id, holder))
        raise HoldError(f"{job_id}: not pending (only a job waiting in the queue can be held or edited)")
    _check_owner(job_id, os.lstat(spec_path).st_uid, actor)
    dest = held_spec(layout, job_id)
    before = os.lstat(spec_path)
    if not stat.S_ISREG(before.st_mode):
        raise HoldError(f"{job_id}: jobs/{spec_path.name} is not a plain file, so not a job")
    place = kept_place(layout, job_id, before.st_uid) or before.st_ctime  # as intake reads it
    # The job is the worker's to keep from the move on: its id is its owner's before the spec
    # leaves jobs/ (spool/ids.py), as a claim's is, so at no moment is the id free.
    if (holder := reserve(layout, job_id, before.st_uid)) not in (before.st_uid, None):
        raise HoldError(refusal(job_id, holder))  # another's id: this file is not that job
    # moved (as a claim moves it: one of the two wins), never over a held spec there already
    try:
        if not move_new(spec_path, dest):
            raise HoldError(f"{job_id}: already held; `gpuq release {job_id}` puts it back")
    except FileNotFoundError:
        raise HoldError(f"{job_id}: a worker started it a moment ago; it is running") from None
    st = os.lstat(dest)  # the moved file, in a directory only the worker's account writes
    if st.st_uid != before.st_uid or not actor.may_act_on(st.st_uid):  # replaced between the look and the move
        put_back(layout, dest, spec_path, job_id)
        raise HoldError(refusal(job_id, st.st_uid))
    found = found_job(layout, job_id, spec_path, st.st_uid, user_name(st.st_uid))
    try:
        change = StateChange(
            layout, found, State.HELD, host, queued_at=place, reason=why or f"held by {actor.name}", held_at=wall_time()
        )
        change.write()
    except (OSError, TransitionError):
        put_back(layout, dest, spec_path, job_id)
        raise
    change.log()
    return f"{job_id}: held (gpuq release {job_id} puts it back at its place)"


def submit_held(layout: Layout, job_id: str, host: str, actor: Actor, text: bytes) -> str:
    """`gpuq submit --hold`: a new spec, held from the start, owned by the request's sender.
    Its text comes in the request, never through jobs/: there, another member could take its
    id between the file's arrival and the hold. Checked as a worker checks a spec."""
    if not JOB_ID_RE.match(job_id):
        raise HoldError(f"{job_id!r}: not a job id; nothing was submitted")
    try:
        parse_spec_text(text, f"jobs/{job_id}.yaml", new=True)
    except SpecError as e:
        raise HoldError(f"{e}; nothing was submitted") from None
    if id_taken(layout, job_id) or not reserve_new(layout, job_id, actor.uid):
        raise HoldError(
            f"{job_id}: the id is used by another job; nothing was submitted. "
            "Fix: submit it again (gpuq submit picks a free id)"
        )
    now = wall_time()
    tmp = create_owned(layout.held, job_id, text, actor.uid, mode=0o640)  # it may hold secrets
    if not unclaim(tmp, held_spec(layout, job_id)):
        os.unlink(tmp)
        raise HoldError(f"{job_id}: the id is used by another job; nothing was submitted")
    new = Record(id=job_id, state=State.PENDING, spec={}, user=actor.name, uid=actor.uid, queued_at=now)  # a new job
    try:
        change = StateChange(layout, new, State.HELD, host, reason="held at submission", held_at=now)
        change.write()
    except OSError:
        held_spec(layout, job_id).unlink(missing_ok=True)
        raise
    change.log()
    return f"{job_id}: submitted, held (gpuq release {job_id} puts it in the queue)"


def release(layout: Layout, job_id: str, host: str, actor: Actor) -> str:
    """Back into the queue at its old place."""
    src, st = _held(layout, job_id, actor, f"{job_id}: not held")
    try:
        record = read_record(layout.record(layout.held, job_id))
    except ValueError:
        record = None
    record = record or found_job(layout, job_id, src, st.st_uid, user_name(st.st_uid))
    change = StateChange(layout, record, State.PENDING, host, reason="released")
    keep_place(layout, job_id, st.st_uid, record.queued_at)
    change.write()  # the held record goes first: a spec in jobs/ under a recorded id is refused
    if not _unclaim_past_intruders(layout, src, layout.jobs / f"{job_id}.yaml", st.st_uid):
        change.undo()
        raise HoldError(
            f"{job_id}: jobs/{job_id}.yaml exists (a new file?); the held spec stays held. "
            f"Fix: move that file away and run `gpuq release {job_id}` again"
        )
    change.log()
    return f"{job_id}: released, back at its place in the queue"


def edit(layout: Layout, job_id: str, host: str, actor: Actor, text: bytes, release_after: bool) -> str:
    """Replace a held spec's text with `text` (validated here again: the request is the
    sender's bytes), keeping its owner, mode and queue place; then release it unless it
    was held before the edit began."""
    src, st = _held(
        layout, job_id, actor, f"{job_id}: not held any more (released or cancelled meanwhile); nothing changed"
    )
    try:
        parse_spec_text(text, f"jobs/{job_id}.yaml", new=True)
    except SpecError as e:
        raise HoldError(f"{e}; the spec is unchanged") from None
    original, _ = read_spec_file(src, f"jobs/{job_id}.yaml")
    if text != original:
        tmp = create_owned(
            layout.held, job_id, text, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), mtime_ns=st.st_mtime_ns
        )
        os.rename(tmp, src)
    changed = "edited" if text != original else "unchanged"
    if not release_after:
        return f"{job_id}: {changed} (still held)"
    release(layout, job_id, host, actor)
    return f"{job_id}: {changed}, back at its place in the queue"


def held_jobs(layout: Layout) -> list[dict]:
    """For `gpuq status`: each held spec, with who held it and since when."""
    out = []
    for path in sorted(layout.held.glob("*.yaml"), key=lambda p: natural_order(p.stem)):
        job_id = path.stem
        try:
            record = read_json(layout.record(layout.held, job_id)) or {}
            st = os.lstat(path)
        except (FileNotFoundError, ValueError):
            continue
        if not isinstance(record, dict):
            record = {}
        out.append(
            {
                "id": job_id,
                "user": user_name(st.st_uid),
                "since": record.get("held_at"),
                "reason": record.get("reason") or "held",
            }
        )
    return out


def retry(layout: Layout, job_id: str, host: str, actor: Actor) -> str:
    finished = layout.record(layout.finished, job_id)
    record = read_record(finished)
    kept = layout.record(layout.requeued, job_id)
    if record is None:
        earlier = read_json(kept)
        if earlier is None and not has_record(layout, job_id) and (refused := _rejected_spec(layout, job_id)):
            return _retry_rejected(layout, refused, job_id, host, actor)  # (a running job's id: not this)
        # An interrupted retry left the ended attempt kept and its spec not yet back: finish it.
        # A requeue keeps a running attempt there too, while its spec waits in a claim: not ended.
        record = _kept_ended(earlier)
        running = layout.record(layout.running, job_id).exists()
        waiting_or_running = bool(pending_spec_path(layout, job_id) or running or claims_of(layout, job_id))
        if record is None or waiting_or_running:
            _check_recorded_owner(layout, job_id, actor)  # another's running job is refused as another's
            if record is None and os.path.lexists(layout.rejected / f"{job_id}.error"):
                raise HoldError(  # refused for a reason only a new file mends (others could write it)
                    f"{job_id}: its refused spec cannot be put back (`gpuq status` says why); "
                    "write a fresh copy yourself into jobs/"
                )
            if waiting_or_running:
                raise HoldError(f"{job_id}: has not ended yet (retry puts an ended job back; cancel it first)")
            raise HoldError(f"{job_id}: no finished job by that id (retry puts an ended job back)")
    elif record.state is State.REJECTED or not record.spec_text:
        raise HoldError(f"{job_id}: was rejected (its spec is invalid); fix it and submit it again")
    _check_owner(job_id, record.uid, actor)
    after = [d for d in record.spec.get("after") or () if isinstance(d, str)]
    if doomed := [(d, s) for d, s in DependencyStates(layout).lookup(after).items() if s in FINAL and s != "done"]:
        # As submit --after refuses it: back in the queue, it was cancelled again at once.
        raise HoldError(
            f"{job_id}: its dependency {', '.join(f'{d} ended {s}' for d, s in doomed)}: it could never start "
            f"(its worker would cancel it again). Fix: `gpuq retry {doomed[0][0]}` first"
        )
    change = StateChange(layout, record, State.PENDING, host, reason=f"retry by {actor.name}")
    _set_aside_intruders(layout, job_id, record.uid)
    if pending_specs(layout, job_id):
        raise HoldError(
            f"{job_id}: jobs/ holds a file with this id already (not this job: it would be "
            "rejected); nothing was changed"
        )
    # Made in a directory only the worker's account writes, owned by the job's owner, then
    # linked into jobs/: nothing a member planted in jobs/ is ever written through.
    tmp = create_owned(layout.held, job_id, record.spec_text.encode(), record.uid)
    forget_place(layout, job_id)  # a retried job queues anew
    change.write()  # the ended attempt kept in requeued/, so the next one is numbered +1
    if record.claim:  # left by a box that died after recording the end: its id is free again
        (layout.claims / record.claim).unlink(missing_ok=True)
    if not _unclaim_past_intruders(layout, tmp, layout.jobs / f"{job_id}.yaml", record.uid):  # a file of hers: undo
        tmp.unlink()
        change.undo()
        raise HoldError(f"{job_id}: jobs/{job_id}.yaml appeared meanwhile (not this job); nothing was changed")
    change.log()
    return f"{job_id}: back in the queue as attempt {record.attempt + 1}"


def _unclaim_past_intruders(layout: Layout, spec: Path, dest: Path, owner: int, tries: int = 3) -> bool:
    """Link the owner's spec back into jobs/ (store.unclaim). A file another member keeps
    re-creating under the id is not this job and must not keep it held or ended for good (he
    re-made it between the worker's refusals, which come after the pass's requests): it is set
    aside, a few times over. False: a file of the owner's own is there (hers to move away)."""
    for _ in range(tries):
        if unclaim(spec, dest):
            return True
        if not _set_aside_intruders(layout, dest.stem, owner):
            return False
    return False


def _set_aside_intruders(layout: Layout, job_id: str, owner: int) -> bool:
    """Move every file under `job_id` in jobs/ that is not a plain file of `owner`'s with one
    link to state/rejected/ (under a name of its own, with an .error that says why); True if
    any was. The id is the owner's (spool/ids.py): such a file is never that job."""
    moved = False
    for path in pending_specs(layout, job_id):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == owner:
            continue
        aside = layout.rejected / f"{job_id}{KEPT_APART}{int(wall_time())}.{os.urandom(3).hex()}{path.suffix}"
        try:
            os.rename(path, aside)
        except OSError:
            continue  # gone meanwhile, or a directory that cannot leave jobs/: the worker's pass sees to it
        message = (
            f"jobs/{path.name}: job id '{job_id}' belongs to {user_name(owner)}'s job, which goes back to the "
            f"queue under it. Fix: rename the file (e.g. {job_id}-2.yaml). The file is kept as "
            f"state/rejected/{aside.name}.\n"
        )
        atomic_write(aside.with_suffix(".error"), message.encode(), mode=0o644)
        moved = True
    return moved


def _kept_ended(kept: object) -> Record | None:
    """The attempt kept in requeued/, if it is one that ended (a retry's), not a requeued one."""
    try:
        record = Record.from_json(kept) if isinstance(kept, dict) else None
    except ValueError:
        return None
    return record if record is not None and record.state.is_final else None


def _rejected_spec(layout: Layout, job_id: str) -> Path | None:
    """The refused spec in rejected/ under this id (moved there as it was), if any."""
    return next(
        (p for p in (layout.rejected / f"{job_id}.yaml", layout.rejected / f"{job_id}.yml") if os.path.lexists(p)), None
    )


def dismiss(layout: Layout, job_id: str, actor: Actor) -> str:
    """`gpuq dismiss ID`: the refusals of this id leave REJECTED, each with its files in
    rejected/ (the spec as it was refused and its .error; those kept under another name, the
    id being another job's, too). Each refusal apart: only those whose refused file is the
    actor's (or any, for root and admins; one that kept no spec, only theirs) go, so that
    nobody's own refusal blocks or erases another's."""
    units = _refusals(layout, job_id)
    if not units:
        raise HoldError(f"{job_id}: no refused spec of this id is in REJECTED")
    mine = [(spec, error) for spec, error in units if _may_dismiss(spec, actor)]
    if not mine:
        spec = next((spec for spec, _ in units if spec is not None), None)
        if spec is None:
            raise HoldError(f"{job_id}: only an admin may dismiss a refusal that kept no spec")
        raise HoldError(refusal(job_id, os.lstat(spec).st_uid))
    for spec, error in mine:
        for path in (spec, error):
            if path is not None:
                path.unlink(missing_ok=True)
    left = f"; {len(units) - len(mine)} of others' stay" if len(mine) < len(units) else ""
    return f"{job_id}: dismissed ({len(mine)} refusal{'s' if len(mine) != 1 else ''}{left})"


def _refusals(layout: Layout, job_id: str) -> list[tuple[Path | None, Path | None]]:
    """Each refusal of `job_id` in rejected/: (its refused spec, its .error), either may be
    missing: the id's own (`ID.yaml`, `ID.error`) and each kept apart (`ID+TIME.HEX.yaml`)."""
    try:
        names = set(os.listdir(layout.rejected))
    except FileNotFoundError:
        return []
    stems = {job_id} | {n.rsplit(".", 1)[0] for n in names if _kept_apart(n, job_id)}
    units = []
    for stem in sorted(stems):
        spec = next((layout.rejected / f"{stem}{s}" for s in (".yaml", ".yml") if f"{stem}{s}" in names), None)
        error = layout.rejected / f"{stem}.error" if f"{stem}.error" in names else None
        if spec is not None or error is not None:
            units.append((spec, error))
    return units


def _may_dismiss(spec: Path | None, actor: Actor) -> bool:
    """A refusal that kept its spec is its file's owner's; one that kept none (a directory
    given back), only an admin's."""
    if spec is None:
        return actor.admin
    try:
        return actor.may_act_on(os.lstat(spec).st_uid)
    except FileNotFoundError:
        return False


def _kept_apart(name: str, job_id: str) -> bool:
    """Whether `name` in rejected/ is a refusal of `job_id` kept under another name (the id
    was another job's): `<id>.<time>.<hex>.yaml` and its `.error`."""
    return re.fullmatch(rf"{re.escape(job_id)}{KEPT_APART_RE}\.(ya?ml|error)", name) is not None


# A refusal kept apart by a version that joined it with a dot (`ID.TIME.HEX.yaml`): its name
# looks like an id, and retry must not take it for one (model/names.py KEPT_APART).
_LEGACY_KEPT = re.compile(r".+\.\d{9,}\.[0-9a-f]{6}")


def _retry_rejected(layout: Layout, src: Path, job_id: str, host: str, actor: Actor) -> str:
    """A refused spec goes back into jobs/, to be checked again: for a refusal that the
    config, a host or a user account has since mended (a spec whose text was wrong is simply
    refused again; a fixed one is dropped anew). Only a plain file, only for its owner (or
    root, or an admin), and never one that others may write. It goes back as a fresh copy the
    worker makes, owned by the spec's owner, and the refused file goes: a handle another
    member opened on it while they could write it (a chmod does not take that back) never
    reaches the spec that runs."""
    if _LEGACY_KEPT.fullmatch(job_id):
        raise HoldError(
            f"{job_id}: a refused spec kept apart (its id was another job's, or others could write it): it never "
            "runs under this name; write a fresh copy yourself into jobs/ under a new name"
        )
    try:
        raw, st = read_spec_file(src, f"state/rejected/{src.name}")
    except SpecError:
        raise HoldError(
            f"{job_id}: the refused file is not a plain spec file (it was refused for that); submit a new spec"
        ) from None
    _check_owner(job_id, st.st_uid, actor)
    # A group's id, or a job recorded since retry() looked (a race): refused for that, it stays so.
    if has_record(layout, job_id) or group_file(layout, job_id).exists():
        raise HoldError(
            f"{job_id}: the id is another job's, so this refused spec cannot run under it; "
            f"drop it into jobs/ under a new name (e.g. {job_id}-2.yaml)"
        )
    if others_may_write(st.st_mode, os.stat(layout.jobs).st_mode):
        raise HoldError(
            f"{job_id}: the refused file can be written by others (mode {stat.S_IMODE(st.st_mode):04o}), "
            "so it may hold their text; write a fresh copy yourself (mode 0644) into jobs/"
        )
    refused = found_job(layout, job_id, src, st.st_uid, user_name(st.st_uid))
    change = StateChange(layout, refused, State.PENDING, host, queued_at=wall_time(), reason=f"retry by {actor.name}")
    if pending_specs(layout, job_id):
        raise HoldError(f"{job_id}: jobs/ holds a file with this id already; nothing was changed")
    fresh = create_owned(layout.held, job_id, raw, st.st_uid, mode=stat.S_IMODE(st.st_mode))
    if not unclaim(fresh, layout.jobs / src.name):
        fresh.unlink()
        raise HoldError(f"{job_id}: jobs/{src.name} appeared meanwhile; nothing was changed")
    src.unlink()
    (layout.rejected / f"{job_id}.error").unlink(missing_ok=True)
    change.log()
    return f"{job_id}: its refused spec is back in the queue, to be checked again"
