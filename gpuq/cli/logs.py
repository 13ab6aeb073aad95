"""`gpuq logs ID [-f]`: a job's log (or a group's members' logs), as it is for its owner and
escaped for everyone else, followed until the job ends."""

from __future__ import annotations

import argparse
import codecs
import errno
import os
import stat
import sys
import time
from pathlib import Path

from gpuq.cli.common import open_layout, read_config, refuse_bad_id
from gpuq.cli.completion import did_you_mean
from gpuq.cli.workflow import with_group_members
from gpuq.model.record import RecordError
from gpuq.model.states import State
from gpuq.model.text import safe_text
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record
from gpuq.views.show import find_job


def cmd_logs(args: argparse.Namespace) -> int:
    """`gpuq logs ID [-f]`. The log is the job's own output: its owner gets it as it is, like
    `cat` or `tail -f` (colours and progress bars work). Anyone else (a teammate, an admin,
    root) gets another user's bytes, so those are printed with terminal controls escaped
    (render.safe_text): a job cannot clear the screen or retitle the window of who reads its
    log, nor can a log file planted under someone's job id. A sweep's or array's id shows
    its members' logs, each under a `==> ID <==` line as `tail` heads several files."""
    if refuse_bad_id("logs", args.id):
        return 1
    layout = open_layout(args)
    ids = with_group_members(layout, [args.id])
    group = ids != [args.id]
    if not group and not os.path.lexists(layout.job_log(args.id)):  # no output yet, or no such job
        job = find_job(layout, read_config(layout), args.id)
        if job is None:
            print(f"gpuq logs: no job {args.id!r}{did_you_mean(layout, args.id)}", file=sys.stderr)
            return 1
    if args.follow:
        _say_what_waits(layout, ids)
    readers = {job_id: LogReader(layout.job_log(job_id), args.lines) for job_id in ids}
    ended: set[str] = set()
    shown = None  # whose output was printed last (a group's heads each change of job)
    while True:
        if args.follow and not group and not os.path.lexists(layout.job_log(args.id)):
            members = with_group_members(layout, [args.id])  # a sweep or array a worker expanded meanwhile
            if members != [args.id]:
                ids, group = members, True
                readers = {job_id: LogReader(layout.job_log(job_id), args.lines) for job_id in ids}
                _say_what_waits(layout, ids)
        for job_id, reader in readers.items():
            if job_id in ended:
                continue
            got = False
            while True:  # in bounded pieces: a log may be half a gigabyte (or sparse and huge)
                try:
                    chunk = reader.read()
                except OSError as e:
                    print(f"gpuq logs: {_unreadable(job_id, layout.job_log(job_id), e)}", file=sys.stderr)
                    return 1
                if not chunk:
                    break
                got = True
                if group and shown != job_id:
                    sys.stdout.write(f"{chr(10) if shown else ''}==> {job_id} <==\n")
                    shown = job_id
                sys.stdout.flush()
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            if not args.follow or (not got and layout.record(layout.finished, job_id).exists()):
                if rest := reader.rest():
                    sys.stdout.buffer.write(rest)
                    sys.stdout.flush()
                ended.add(job_id)
        if len(ended) == len(readers):
            silent = [i for i, r in readers.items() if r.offset == 0]
            if silent and not group:
                print(f"gpuq logs: {_why_silent(layout, args.id)}", file=sys.stderr)
            elif silent:
                print(
                    f"gpuq logs: {len(silent)} of {args.id}'s {len(ids)} members have no output yet: {_first(silent)}",
                    file=sys.stderr,
                )
            return ended_status(layout, ids, group) if args.follow else 0
        time.sleep(0.2)


def _why_silent(layout: Layout, job_id: str) -> str:
    """Why a job's log is empty: it ended without a word, or never ran (cancelled while it
    waited: `logs -f` said "no output yet" of a job that never would have any), or has none yet."""
    try:
        record = read_record(layout.record(layout.finished, job_id))
    except (RecordError, ValueError):
        record = None
    if record is None:
        return f"{job_id} has no output yet ({layout.job_log(job_id)})"
    how = f"{record.state.value}" + (f" ({safe_text(record.reason)})" if record.reason else "")
    return f"{job_id} never ran: {how}" if record.started_at is None else f"{job_id} {how}, with no output"


def ended_status(layout: Layout, ids: list[str], group: bool) -> int:
    """What `logs -f` exits with once the jobs ended, as the job did: a failed job's exit code
    (128 + the signal that killed it), 1 for one that ended otherwise (cancelled, lost,
    timeout: what its stopped command returned is gpuq's doing, not the job's); for a group,
    0 when every member is done, else 1."""
    codes = []
    for job_id in ids:
        try:
            record = read_record(layout.record(layout.finished, job_id))
        except (RecordError, ValueError, OSError):
            record = None
        if record is not None and record.state is State.DONE:
            codes.append(0)
        elif record is not None and record.state is State.FAILED and (record.exit_code or record.signal):
            codes.append(record.exit_code or 128 + (record.signal or 0))
        else:
            codes.append(1)
    if group:
        return 0 if not any(codes) else 1
    return codes[0] if 0 <= codes[0] <= 255 else 1


SHOWN_WAITING = 5  # a group's waiting members named before "and N more"
CHUNK = 1 << 20  # a log is printed a MiB at a time, whatever its size


def _first(ids: list[str]) -> str:
    return ", ".join(ids[:SHOWN_WAITING]) + (
        f" and {len(ids) - SHOWN_WAITING} more" if len(ids) > SHOWN_WAITING else ""
    )


def _say_what_waits(layout, ids: list[str]) -> None:
    """Before following: which of the jobs have not started, and what each waits for (a
    pending job's log does not exist yet; silence would look like a hang)."""
    if all(os.path.lexists(layout.job_log(job_id)) for job_id in ids):
        return
    config = read_config(layout)
    waiting = [
        (job_id, job)
        for job_id in ids
        if not os.path.lexists(layout.job_log(job_id))
        and (job := find_job(layout, config, job_id)) is not None
        and job.get("state") in ("pending", "held")
    ]
    for job_id, job in waiting[:SHOWN_WAITING]:
        print(
            f"gpuq logs: {job_id} is {job['state']}: {safe_text(job.get('reason') or 'waiting')}; "
            "following its log from when it starts (Ctrl-C stops)",
            file=sys.stderr,
        )
    if len(waiting) > SHOWN_WAITING:
        print(f"gpuq logs: and {len(waiting) - SHOWN_WAITING} more members waiting", file=sys.stderr)


class LogReader:
    """A log read from where the last read stopped: opened anew each time (it may not exist
    yet), without following a link or blocking on a FIFO; another user's bytes escaped."""

    def __init__(self, path: Path, last_lines: int | None = None) -> None:
        self.path, self.offset = path, 0
        self.decoder: codecs.IncrementalDecoder | None = None  # set once the log is another user's
        self.last_lines = last_lines  # `logs -n N`: the first read starts N lines from the end

    def _tail_offset(self, fd: int, size: int, lines: int) -> int:
        """Where the last `lines` lines begin (a last line without its newline counts)."""
        end, found = size, -1 if size and os.pread(fd, 1, size - 1) == b"\n" else 0
        while end > 0:
            start = max(0, end - CHUNK)
            chunk = os.pread(fd, end - start, start)
            for at in range(len(chunk) - 1, -1, -1):
                if chunk[at] == 10:
                    found += 1
                    if found == lines:
                        return start + at + 1
            end = start
        return 0

    def read(self) -> bytes:
        """The next piece (at most CHUNK bytes), b"" when there is nothing more yet."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return b""
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            if self.last_lines is not None:
                self.offset = self._tail_offset(fd, st.st_size, self.last_lines) if self.last_lines > 0 else st.st_size
                self.last_lines = None
            f.seek(self.offset)
            raw = f.read(CHUNK)
        self.offset += len(raw)
        if st.st_uid == os.geteuid():
            return raw

        if self.decoder is None:  # a character cut by a read's end waits here for the next
            self.decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")
        return safe_text(self.decoder.decode(raw), keep="\n\t").encode()

    def rest(self) -> bytes:
        """What the escaping decoder still holds at the end (a cut character), escaped."""
        if self.decoder is None:
            return b""

        return safe_text(self.decoder.decode(b"", final=True)).encode()


def _unreadable(job_id: str, path: Path, e: OSError) -> str:
    """One line for a log that cannot be read: whose it is when it is someone else's."""
    try:
        st = os.lstat(path)
    except OSError:
        return f"cannot read {path} ({e.strerror})"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{job_id}'s log is {user_name(st.st_uid)}'s (mode {stat.S_IMODE(st.st_mode):04o}); ask them or an admin"
    if e.errno == errno.ELOOP or stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link, not a log gpuq wrote; ask an admin"
    return f"cannot read {path} ({e.strerror}); ask an admin"
