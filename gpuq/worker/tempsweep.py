"""The sweep of temp files: what writers killed mid-write left (never visible as records;
docs/design.md lets a worker delete only temp files), removed once an hour old, whatever host
wrote them. One kind is finished instead of removed: a spec a cancel moved aside
(`finished/.ID.cancelling.HEX.tmp`) before its process was killed, recorded cancelled
(spool/cancel.py), or the job would be gone with no record."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from gpuq.model.states import TransitionError
from gpuq.spool.cancel import CANCELLING, finish_interrupted_cancel
from gpuq.spool.layout import Layout

log = logging.getLogger("gpuq.worker")
STALE_TEMP_S = 3600.0


def sweep_temp_files(layout: Layout, host: str, now_wall: float) -> None:
    """Every temp file an hour old by both its times: a file renamed aside keeps its mtime (a
    cancel moves a spec submitted days ago to `.ID.cancelling.HEX.tmp`; a sweep member is made
    with its group spec's mtime) while the rename, or the create, sets its ctime to now; by
    its mtime alone, another box's sweep removed such a file in the middle of the move, and
    the spec with it. An hour: its writer is long gone, on any host and whatever its clock says."""
    cutoff = now_wall - STALE_TEMP_S
    for directory, prefix in _temp_places(layout):
        try:
            it = os.scandir(directory)
        except OSError:
            continue  # a host's control directory removed by `gpuq forget` meanwhile
        with it:
            for entry in it:
                if entry.name.startswith(prefix) and entry.name.endswith(".tmp"):
                    _sweep(layout, host, directory, entry, cutoff)


def _sweep(layout: Layout, host: str, directory: Path, entry: os.DirEntry, cutoff: float) -> None:
    """One temp file, removed once old; a cancel's spec moved aside is recorded cancelled."""
    try:
        st = entry.stat(follow_symlinks=False)
        if max(st.st_mtime, st.st_ctime) >= cutoff:
            return
        if directory == layout.finished and CANCELLING in entry.name:
            finish_interrupted_cancel(layout, Path(entry.path), host)
        else:
            os.unlink(entry.path)
    except OSError:
        pass  # gone, or a directory posing as a temp file: left alone (a full disk: next time)
    except TransitionError as e:
        log.warning("could not finish the cancel cut off in %s: %s", entry.name, e)


def _temp_places(layout: Layout) -> list[tuple[Path, str]]:
    """Where writers leave temp files, and the prefix of those a worker may remove: every
    directory only gpuq's own writers write (each host's stop orders too), and in the
    members' jobs/ only `gpuq submit`'s: a member's other dot files there are hers (the
    requests inbox and the replies are swept by spool/inbox.py)."""
    # Not the inboxes; not the logs, written in place; not the replies, swept whole.
    apart = {*layout.member_writable(), layout.logs, layout.worker_logs, layout.replies}
    places = [(d, ".") for d in layout.directories() if d not in apart]
    try:
        with os.scandir(layout.control) as it:
            places += [(Path(e.path), ".") for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        pass
    return places + [(layout.jobs, ".submit-")]
