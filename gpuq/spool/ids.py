"""Whose a job id is, and whether it is taken: one reservation per accepted job.

Ids become file names in every part of the spool and are never reused (a record and a log
always name one job). The worker (the queue's account) reserves an id the moment it first
accepts a job under it, by creating state/ids/ID exclusively, holding the owner's uid: when a
spec leaves jobs/ for its keeping (a claim, a hold, a cancel, a sweep's or array's spec), for
each member it writes for a group, and for a held submission it makes. A reservation is never
replaced or removed. Members read state/ids/ (`gpuq submit` picks a free id there) and never
write it: state/ is the queue account's, and nothing a member writes names a reservation's
owner but the spec file the worker moved, whose owner the kernel says.

A queue made before state/ids/ has none: a worker fills it once, under the queue lock, from
where older workers kept their jobs (`migrate`), then writes state/ids/.complete (no id starts
with a dot). Until then readers ask those places instead (`_legacy_holder`, `_legacy_taken`:
the one place that scan is kept).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gpuq.host.files import atomic_write, read_json
from gpuq.host.safefile import NotPlain, read_plain
from gpuq.model.names import JOB_ID_RE
from gpuq.model.record import parse_claim_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import claims_of, has_record, pending_spec_path, read_record

COMPLETE = ".complete"  # state/ids/ holds every accepted id (written once migrate() is done)
# Whose a damaged reservation is (garbage, a link, a FIFO, `{"uid": null}` from a migration that
# found no owner): nobody's to use. No uid is -1, so no file, request or spec is ever its owner's
# (an admin may still cancel under it); None is kept for "not reserved".
NOBODY = -1
RESERVATION_CAP = 64  # bytes: `{"uid":4294967295}` and room to spare


def reservation(layout: Layout, job_id: str) -> Path:
    return layout.ids / job_id


def _create(layout: Layout, job_id: str, uid: int | None, durable: bool) -> bool:
    """Create the reservation for `uid` (None: taken, by nobody we can name); False when the id
    has one already. Made as every record is (host/files.py atomic_write): a temp file created
    exclusively, never through a link, under the directory's descriptor, then linked into
    place, which fails when the name is there (any file, link or FIFO): never replaced."""
    data = json.dumps({"uid": uid}, separators=(",", ":")).encode()

    def link() -> bool:
        try:
            atomic_write(reservation(layout, job_id), data, durable=durable, exclusive=True)
            return True
        except FileExistsError:
            return False

    try:
        return link()
    except FileNotFoundError:  # a queue made before state/ids/, whose worker has not run since
        layout.make_state_dir(layout.ids)
        return link()


def reserve(layout: Layout, job_id: str, uid: int, durable: bool = True) -> int | None:
    """Reserve `job_id` for the job of `uid` being accepted now, unless it is reserved already.
    Returns whose the id is: `uid`'s (made now, or for an earlier job of the same owner: the
    job back again, or the id reused, which the caller judges), another's, or NOBODY (a damaged
    reservation: taken, by nobody we can name). `durable=False`: a start's, synced by the job's
    supervisor (`sync`) with its record, as the record itself is."""
    if _create(layout, job_id, uid, durable):
        return uid
    return _read(layout, job_id)[1]


def reserve_new(layout: Layout, job_id: str, uid: int) -> bool:
    """Reserve an id for a new job (a held submission): True only when this call made it."""
    return _create(layout, job_id, uid, durable=True)


def sync(layout: Layout, job_id: str) -> None:
    """A reservation written without an fsync (a start's), now on the disk."""
    fd = os.open(reservation(layout, job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(layout: Layout, job_id: str) -> tuple[bool, int | None]:
    """(whether the id is reserved, whose). The file is read as one others may have written
    (host/safefile.py: no link followed, no FIFO blocked on, one link, size cap), and only from
    the owner of state/ids/ or root: anything else there (a link, a FIFO, garbage, a file too
    big, a uid that is none) reserves the id for nobody we can name, as a damaged record did."""
    path = reservation(layout, job_id)
    try:
        owners = {0, os.lstat(layout.ids).st_uid}
        raw, _ = read_plain(path, RESERVATION_CAP, owners)
    except FileNotFoundError:
        return False, None
    except NotPlain:
        return True, NOBODY
    except OSError:  # unreadable (no permission, a disk error): taken, for all we know
        return True, NOBODY
    try:
        uid = json.loads(raw).get("uid")
    except (ValueError, AttributeError):
        return True, NOBODY
    return True, uid if type(uid) is int and 0 <= uid < 2**32 else NOBODY


def complete(layout: Layout) -> bool:
    """Whether state/ids/ holds every accepted id (a queue made, or migrated, since it came)."""
    return os.path.lexists(layout.ids / COMPLETE)


def held_for(layout: Layout, job_id: str) -> int | None:
    """The uid a job id is held for: the owner of the job the worker accepted under it (running,
    held, ended, claimed, a sweep's, or on its way back to the queue). While an id is held, a
    file anyone else drops into jobs/ under it is not that job: intake refuses it, and cancel
    and hold never act on it. (Never a refused spec in rejected/: any member can be refused
    under any free id, and such a hold would let him take ids of others' jobs on their way
    back, or of sweep members to come.) None: free; NOBODY: taken, by nobody we can name (no member's file is ever that
    job). Before the migration (older queues), as the older scan says."""
    return _read(layout, job_id)[1] if complete(layout) else _legacy_holder(layout, job_id)


def _rejected_name(job_id: str) -> re.Pattern[str]:
    """The names a job's rejected files have in state/rejected/: <id>.yaml|.yml|.error, a
    later rejection's <id>+<time>.<6 hex><suffix>, a set-aside <id>+<8 hex><suffix> (a dot for a `+`
    before 0.2.1) or
    .not-a-spec. Ids hold dots, so a glob `data.*` would also take the rejected `data.v2.yaml`."""
    return re.compile(re.escape(job_id) + r"([+.]\d+\.[0-9a-f]{6}|[+.][0-9a-f]{8})?\.(yaml|yml|error|not-a-spec)")


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def id_taken(layout: Layout, job_id: str) -> bool:
    """Whether a new job may not have `job_id`: it is reserved (a job was accepted under it),
    a spec waits under it in jobs/, or a spec was refused under it (not a reservation: see
    held_for; but its owner's `gpuq retry` puts it back under that id). Asked by `gpuq submit`
    and by the worker creating a held submission."""
    reserved = _read(layout, job_id)[0] if complete(layout) else _legacy_taken(layout, job_id)
    return (
        reserved
        or pending_spec_path(layout, job_id) is not None
        or any(map(_rejected_name(job_id).fullmatch, _names(layout.rejected)))
    )


# --- queues made before state/ids/ ------------------------------------------------------


def _legacy_taken(layout: Layout, job_id: str) -> bool:
    """Whether an older worker accepted a job under `job_id`: a record, a claim, a held spec,
    a group (its record, or its spec kept while it is expanded: groups/ID.yaml), or a place or
    an attempt kept for its way back."""
    return (
        has_record(layout, job_id)
        or any(layout.record(d, job_id).exists() for d in (layout.places, layout.requeued, layout.groups))
        or bool(claims_of(layout, job_id))
        or any((d / f"{job_id}.yaml").exists() for d in (layout.groups, layout.held))
    )


def _legacy_holder(layout: Layout, job_id: str) -> int | None:
    """Whose job an older worker keeps under `job_id`: its record's owner, its claim's or held
    spec's, its group's, or the owner of a place or attempt kept for its way back."""
    for directory in (layout.running, layout.held, layout.finished):
        try:
            record = read_record(layout.record(directory, job_id))
        except (ValueError, OSError):  # damaged: the id is still taken, by nobody we can name
            continue
        if record is not None and record.uid >= 0:
            return record.uid
    for path in [*claims_of(layout, job_id), layout.held / f"{job_id}.yaml", layout.groups / f"{job_id}.yaml"]:
        try:
            return os.lstat(path).st_uid
        except FileNotFoundError:
            continue
    for directory in (layout.places, layout.requeued, layout.groups):  # kept for its way back; a group
        try:
            kept_for = read_json(layout.record(directory, job_id))
        except (OSError, ValueError):
            continue
        if isinstance(kept_for, dict) and type(kept_for.get("uid")) is int and kept_for["uid"] >= 0:
            return kept_for["uid"]
    return None


def _legacy_ids(layout: Layout) -> set[str]:
    """Every id an older worker kept anything under."""
    found: set[str] = set()
    for directory in (layout.running, layout.finished, layout.held, layout.places, layout.requeued, layout.groups):
        found.update(name.rsplit(".", 1)[0] for name in _names(directory) if name.endswith((".json", ".yaml")))
    found.update(parsed[0] for name in _names(layout.claims) if (parsed := parse_claim_name(name)) is not None)
    return {i for i in found if JOB_ID_RE.match(i)}


def migrate(layout: Layout) -> int:
    """Fill state/ids/ from where older workers kept their jobs, once, then mark it complete;
    run by a worker holding the queue lock (a worker of this version reserves as it accepts,
    meanwhile: a reservation made first is kept). Returns how many it made."""
    if complete(layout):
        return 0
    layout.make_state_dir(layout.ids)
    made = sum(_create(layout, i, _legacy_holder(layout, i), durable=False) for i in sorted(_legacy_ids(layout)))
    if made:
        os.sync()  # every reservation on the disk before the mark that makes readers trust them
    atomic_write(layout.ids / COMPLETE, b"", mode=0o644)
    return made
