"""running/ as a box reads it every pass: its own running records, and every other box's for
the one plan, re-read only where something changed.

A record is only ever replaced by rename, so a file read before (same name, inode, mtime and
size: a freed inode is reused at once) is not read again. Every change to running/ is a rename
or an unlink, so while the directory's mtime stays (and had stood long enough, when it was
listed, that a change in the same clock tick would have moved it: spool/dirwatch.py) the last
listing stands: one stat, not one per record (NFS pays each). A file that is not a record is
reported (once, by the caller's `report`) and skipped.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from gpuq.host.wake import mtime_ns
from gpuq.model.record import Record
from gpuq.spool.dirwatch import MtimeWatch
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record

_Key = tuple[str, int, int, int]  # name, inode, mtime_ns, size


class RunningListing:
    def __init__(
        self, layout: Layout, host: str, report: Callable[[str, str], None], watch: MtimeWatch | None = None
    ) -> None:
        self.layout, self.host, self.report = layout, host, report
        self.watch = watch or MtimeWatch()  # on the worker's monotonic clock
        # running/'s mtime when it was last listed, if it had stood long enough then that a
        # change in the same clock tick would have moved it (else None: the next read lists again).
        self.listed: int | None = None
        self.own: list[Record] = []  # this box's records in that listing
        self.others: list[Record] = []  # every other box's
        self.cache: dict[_Key, Record] = {}

    def changed(self) -> bool:
        """Whether running/ changed since the last listing (another box claimed meanwhile)."""
        return mtime_ns(self.layout.running) != self.listed

    def read(self) -> list[Record]:
        """This box's running records (a new list: the caller may change it); `others` too."""
        listed = mtime_ns(self.layout.running)  # before the listing: a later record changes it
        if listed is not None and listed == self.listed:
            return list(self.own)
        own: list[Record] = []
        others: list[Record] = []
        cache: dict[_Key, Record] = {}
        # Judged when listing, not when reusing: a record renamed in later within the same
        # tick leaves the mtime as it is, and an old listing would then stand for good. Kept
        # only once the listing is whole: one that failed (EIO, ESTALE) must not stand.
        stood = listed is not None and self.watch.stood(listed)
        self.listed = None
        with os.scandir(self.layout.running) as it:
            for entry in it:
                if not entry.name.endswith(".json"):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                    key = (entry.name, st.st_ino, st.st_mtime_ns, st.st_size)
                    record = self.cache.get(key) or read_record(Path(entry.path))
                except FileNotFoundError:
                    continue  # finished or requeued since the listing: not there, not garbage
                except (OSError, ValueError) as e:
                    self.report(f"running/{entry.name}", f"state/running/{entry.name} skipped: {e}")
                    continue
                if record is not None:
                    cache[key] = record
                    (own if record.host == self.host else others).append(record)
        self.cache, self.own, self.others = cache, own, others
        self.listed = listed if stood else None
        return list(own)
