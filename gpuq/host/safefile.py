"""Reading a file someone else may have written, as a privileged process must: never through
a symbolic link, never blocking on a FIFO, and judging the open file itself (fstat), not the
path, so that nothing can be swapped in between the check and the read. The one place this
is done: a spec in jobs/, a taken request, a record of another box's, a Slurm hand-over.

Imports only the standard library: the single-instance check loads it before anything else.
"""

from __future__ import annotations

import errno
import os
import stat
import time

# Why a file was not read, in the words the callers' messages use.
LINK = "is a symbolic link"
NOT_REGULAR = "is not a regular file"
LINKS = "has more than one hard link"
NOT_OWNER = "belongs to someone it may not come from"
TOO_BIG = "is over the size cap"
LINK_SETTLE_S = 0.2  # how long a file with a second link may take to lose it (see read_plain)


class NotPlain(Exception):
    """The file is not one to read: `why` is LINK, NOT_REGULAR, LINKS, NOT_OWNER or TOO_BIG;
    `st` the open file's stat where it was opened."""

    def __init__(self, why: str, st: os.stat_result | None = None) -> None:
        super().__init__(why)
        self.why, self.st = why, st


def read_plain(
    path: os.PathLike[str] | str, cap: int, owners: set[int] | frozenset[int] | None = None
) -> tuple[bytes, os.stat_result]:
    """The bytes (at most `cap`) and stat of `path` when it is a regular file with one link,
    at most `cap` bytes and, where `owners` is given, owned by one of them. NotPlain says why
    not; OSError for a file that cannot be opened at all (missing, no permission)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotPlain(LINK) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotPlain(NOT_REGULAR, st)
        settle = time.monotonic() + LINK_SETTLE_S
        while st.st_nlink == 2 and time.monotonic() < settle:
            # A file made exclusively (host/files.py atomic_write) is linked into place before
            # its temporary name goes: read in between, an id reservation was "nobody's" and a
            # member's own job was refused as another's. Its writer removes that name at once.
            time.sleep(0.005)
            st = os.fstat(fd)
        if st.st_nlink != 1:
            raise NotPlain(LINKS, st)
        if owners is not None and st.st_uid not in owners:
            raise NotPlain(NOT_OWNER, st)
        data = os.pread(fd, cap + 1, 0)
        if st.st_size > cap or len(data) > cap:  # grown since the fstat: as big
            raise NotPlain(TOO_BIG, st)
        return data, st
    finally:
        os.close(fd)
