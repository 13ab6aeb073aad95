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

# Why a file was not read, in the words the callers' messages use.
LINK = "is a symbolic link"
NOT_REGULAR = "is not a regular file"
LINKS = "has more than one hard link"
NOT_OWNER = "belongs to someone it may not come from"
TOO_BIG = "is over the size cap"


class NotPlain(Exception):
    """The file is not one to read: `why` is LINK, NOT_REGULAR, LINKS, NOT_OWNER or TOO_BIG;
    `st` the open file's stat where it was opened."""

    def __init__(self, why: str, st: os.stat_result | None = None) -> None:
        super().__init__(why)
        self.why, self.st = why, st


def _writers_leftover(path: os.PathLike[str] | str, st: os.stat_result) -> bool:
    """Whether the file's second link is the temporary name host/files.py atomic_write gave it
    before linking it into place (`.<name>.<pid>.<hex>.tmp`, beside it): a writer killed
    between the two steps leaves it for good. A name only whoever may write the directory can
    make, for an inode with no name anywhere else; and only in a directory no group or other
    may write (state/'s, not jobs/: there a member could name two links to another's file so)."""
    directory, name = os.path.split(os.fspath(path))
    prefix = f".{name[:100]}."
    try:
        if os.lstat(directory or ".").st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        names = [n for n in os.listdir(directory or ".") if n.startswith(prefix) and n.endswith(".tmp")]
        for other in names:
            there = os.lstat(os.path.join(directory, other))
            if (there.st_ino, there.st_dev) == (st.st_ino, st.st_dev):
                return True
    except OSError:
        pass
    return False


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
        # A file atomic_write made exclusively has a second link, its temporary name, from
        # when it is linked into place until that name goes (for good, if the writer was
        # killed between): read then, an id reservation was "nobody's" and a member's own job
        # was refused as another's. Its name may have gone since the fstat: asked again.
        if st.st_nlink != 1 and not (st.st_nlink == 2 and _writers_leftover(path, st)) and os.fstat(fd).st_nlink != 1:
            raise NotPlain(LINKS, st)
        if owners is not None and st.st_uid not in owners:
            raise NotPlain(NOT_OWNER, st)
        data = os.pread(fd, cap + 1, 0)
        if st.st_size > cap or len(data) > cap:  # grown since the fstat: as big
            raise NotPlain(TOO_BIG, st)
        return data, st
    finally:
        os.close(fd)
