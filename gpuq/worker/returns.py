"""Where a spec goes when the worker will not run it: back to jobs/ (put_back: a claim given
up, a job on its way back to the queue) or to state/rejected/ with an .error file beside it that
names the file, the field and the fix (reject). Every part of a pass that lets go of a spec
(arrivals, claims, starts, recovery, the Slurm bridge) does it here."""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from pathlib import Path

from gpuq.host.faults import wall_time
from gpuq.host.files import atomic_write, set_aside_directory
from gpuq.host.owners import others_may_write
from gpuq.model.names import JOB_ID_RE, KEPT_APART
from gpuq.model.states import State
from gpuq.model.text import safe_text
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import StateChange, found_job, unclaim
from gpuq.worker.box import Box

log = logging.getLogger("gpuq.worker")


def put_back(box: Box, job_id: str, claimed: Path) -> bool:
    """Return a claimed spec to jobs/. A file of another user's that took the name
    meanwhile is not this job (its id is this one's: spool/ids.py, held_for):
    it is refused, and the spec goes back. If the owner put a new spec there under the
    same name meanwhile, neither is lost: the claimed one goes to rejected/ with the reason."""
    dest = box.layout.jobs / f"{job_id}.yaml"
    intruder = False
    for _ in range(3):
        if unclaim(claimed, dest):
            return True
        try:
            intruder = not _owners_new_spec(box, dest, claimed)
        except FileNotFoundError:
            continue  # gone meanwhile: try again
        if not intruder:
            break
        reject(
            box,
            job_id,
            dest,
            f"jobs/{job_id}.yaml: job id '{job_id}' belongs to another user's job, which goes back to "
            f"the queue under it. Fix: rename the file (e.g. {job_id}-2.yaml).",
            retry_mends=False,
        )
    if intruder:  # a member re-creates the name as fast as it is refused: never the owner's loss
        _park(job_id, claimed)
        return False
    reject(
        box,
        job_id,
        claimed,
        f"jobs/{job_id}.yaml: an earlier version of this spec was being "
        "started when a new file with the same name arrived; this earlier version is kept "
        "here. Fix: resubmit it under another name if you still want it to run",
    )
    return False


def _owners_new_spec(box: Box, dest: Path, claimed: Path) -> bool:
    """Whether the file that took the claimed spec's name in jobs/ is its owner's own new spec:
    a plain file with one link, of the same owner, that nobody else may have written. A hard
    link another member made to one of her files (one he may write: a group-writable file,
    and any file of hers where the kernel does not protect hard links) has her uid but is his
    doing: taken for hers, it sent her real spec to rejected/ and it never ran."""
    found, spec = os.lstat(dest), os.lstat(claimed)
    return (
        stat.S_ISREG(found.st_mode)
        and found.st_nlink == 1
        and found.st_uid == spec.st_uid
        and not _others_may_have_written(box, dest)
    )


def _park(job_id: str, claimed: Path) -> None:
    """Leave the claimed spec in claims/ under a name of no live worker's (pid 0), so that
    requeue_orphan_claims puts it back at a later pass (this worker's own claims it skips)."""
    parts = claimed.name.split("@")
    parts[3] = "0"
    os.rename(claimed, claimed.with_name("@".join(parts)))
    log.warning("%s: another user's file keeps taking jobs/%s.yaml; it goes back at a later pass", job_id, job_id)


def _set_aside(box: Box, path: Path, message: str) -> Path | None:
    """A member's directory posing as a spec: renamed aside in jobs/ (set_aside_directory)."""
    try:
        return set_aside_directory(path, box.layout.jobs, "spec")
    except OSError:
        _unmovable(box, path, message)
        return None


def _others_may_have_written(box: Box, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and others_may_write(st.st_mode, os.stat(box.layout.jobs).st_mode)


def _unmovable(box: Box, path: Path, message: str) -> None:
    box.report_once(f"unmovable/{path.name}", f"cannot move {path.name} to rejected/ ({message})")


def reject(box: Box, job_id: str, path: Path, message: str, forget: bool = True, retry_mends: bool = True) -> None:
    """`retry_mends`: whether `gpuq retry` could ever put this spec back (never for an id that
    is another job's: under that id, retry is that job's, and only a new name is a fix)."""
    suffix = ".yml" if path.name.endswith(".yml") else ".yaml"
    # A name that is not a job id (250 characters, a line break) is kept under one of gpuq's:
    # its event names it, and every reader of events takes only ids (store.checked_event).
    fits = JOB_ID_RE.fullmatch(job_id) is not None
    stem = job_id if fits else f"bad-name-{hashlib.sha1(job_id.encode('utf-8', 'surrogateescape')).hexdigest()[:12]}"
    dest = box.layout.rejected / f"{stem}{suffix}"
    # The .error is named by the stem alone: x.yml refused beside x.yaml must not take its.
    # And rejected/<id>.yaml is the id's own refused spec, which `gpuq retry <id>` puts
    # back: a file refused for an id that is another job's never takes that name, nor one
    # others could write (a handle opened then outlives any chmod: its text may be theirs).
    unsafe = _others_may_have_written(box, path)
    if (
        not retry_mends
        or unsafe
        or any(os.path.lexists(box.layout.rejected / f"{stem}{s}") for s in (".yaml", ".yml", ".error"))
    ):
        # `+` is in no job id: `gpuq retry` can never take this name for its own (a security review).
        dest = box.layout.rejected / f"{stem}{KEPT_APART}{int(wall_time())}.{os.urandom(3).hex()}{suffix}"
    error = dest.parent / f"{dest.name.rsplit('.', 1)[0]}.error"
    if unsafe and retry_mends and not os.path.lexists(box.layout.rejected / f"{stem}.error"):
        error = box.layout.rejected / f"{stem}.error"  # its owner's: status shows it, retry finds no spec
    try:
        os.rename(path, dest)
    except FileNotFoundError:
        return  # taken or removed meanwhile
    except PermissionError:  # a member's directory cannot leave jobs/ (its `..` is theirs)
        dest = _set_aside(box, path, message) or dest
        if dest.parent != box.layout.jobs:
            return
    except OSError:  # another user's file in a sticky jobs/ (or a name it cannot take): it stays
        return _unmovable(box, path, message)
    if dest.parent != box.layout.jobs and (aside := _set_aside(box, dest, message)) is not None:
        dest = aside  # a directory, moved: back to its maker
    if dest.parent == box.layout.jobs:  # a member's directory, set aside where they can remove it
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
                f"{kept}: fix it there, writing into the file itself (an editor; not sed -i, which "
                f"needs to write beside it), or drop a fixed one, then `gpuq retry {stem}`."
                if retry_mends and retryable(dest, job_id, box.layout)
                else f"{kept}."
            )
        )  # one line, never more
    atomic_write(error, (message + "\n").encode(), mode=0o644)
    try:  # whose spec it was: the moved file's owner (reports count it for them, not "?")
        st = os.lstat(dest)
        owner, uid = user_name(st.st_uid), st.st_uid
    except OSError:
        owner, uid = "", -1
    found = found_job(box.layout, stem, path, uid, owner)
    # Its spec is its record; kept under another name (its id is another job's), status lists
    # it by that name for as long as the file is there.
    apart = {"kept": dest.name} if dest.parent == box.layout.rejected and dest.stem != stem else {}
    StateChange(box.layout, found, State.REJECTED, box.host, reason=message).log(**apart)
    if forget:
        box.intake.forget(job_id)
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
