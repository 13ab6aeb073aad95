"""Whether a listing of a directory may stand while the directory's mtime stays the same.

Every change to jobs/ and running/ (a rename, a create, an unlink) sets the directory's mtime,
so an unchanged mtime says nothing changed, with one exception: a change in the same timestamp
tick as the one before leaves the mtime as it was (a tick is a few milliseconds on older
kernels, a second on many file servers). A listing taken in the tick of the mtime it saw can
miss a change made later in that tick. So a listing stands only once this box has seen that
mtime stay for RACY_MTIME_S on its own monotonic clock: a change after such a listing lands
in a later tick and moves the mtime.

The mtime is the file server's clock; it is never compared with this box's wall clock, which
may run ahead of it (then every listing looked old enough, and a box missed its own new
running record: it started an exclusive job beside it).

This holds for a fresh stat and a fresh listing. An NFS client may serve either from its
attribute and directory caches while the mtime it cached stands, for up to `acdirmax`: a
change another box made is then seen that much later, and `gpuq doctor` warns of a mount that
caches long.
"""

from __future__ import annotations

import time
from typing import Callable, Hashable

# Longer than any timestamp tick of the filesystems a spool lives on (FAT's is 2 s).
RACY_MTIME_S = 3.0


class MtimeWatch:
    """One directory's mtime (or a key made with it), as this box first saw it and when, on
    `mono` (the worker's monotonic clock)."""

    def __init__(self, mono: Callable[[], float] = time.monotonic) -> None:
        self.mono = mono
        self.seen: tuple[Hashable, float] | None = None

    def stood(self, key: Hashable) -> bool:
        """Whether `key`, as a stat has just given it, has stayed the same for RACY_MTIME_S on
        this box's clock. Call it after that stat and before the listing: the clock is read
        here, so that when the key was first seen bounds that stat from after, and now bounds
        the listing from before."""
        now = self.mono()
        if self.seen is None or self.seen[0] != key:
            self.seen = (key, now)
            return False
        return now - self.seen[1] > RACY_MTIME_S
