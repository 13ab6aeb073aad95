"""Reading jobs/: which pending specs exist, parsed once per version of each file.

A spec still being written must not be rejected: a file that fails to parse is retried
until it has been unchanged for `spec_settle_s`. Parsed specs are cached by (mtime, size,
inode), and the cache is shared through state/workers/<host>.specs.json so `gpuq status`
does not re-parse 10,000 files.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import time
from dataclasses import dataclass
from pathlib import Path

from gpuq.host import safefile
from gpuq.host.owners import OwnerPolicy
from gpuq.host.safefile import NotPlain, read_plain
from gpuq.model.errors import MAX_SPEC_BYTES, SpecError
from gpuq.model.jobs import PendingJob
from gpuq.model.names import ID_RULE, JOB_ID_RE
from gpuq.model.spec import JobSpec, parse_spec_text
from gpuq.spool.dirwatch import MtimeWatch
from gpuq.spool.ids import held_for
from gpuq.spool.layout import Layout, job_id_for_spec_name
from gpuq.spool.store import kept_place

StatKey = tuple[int, int, int, int]  # mtime_ns, size, inode, links

# How long one scan may spend reading specs before it leaves the rest to the next: a member's
# thousand 250 KB specs that never parse, touched each second, held one pass for 283 s, past the
# lease, and every running job on the box was fenced. Each owner's files are read in turn
# (_fair_order), so another member's spec is read in the first scan all the same.
READ_BUDGET_S = 2.0
NOT_READ_YET = "not read yet: jobs/ changed more than one look reads; the workers read the rest over their next passes"


@dataclass
class Entry:
    key: StatKey
    jobs_dir: Path
    name: str  # the file name in jobs/ (a Path per entry costs 10,000 joins)
    job: PendingJob | None = None
    error: SpecError | None = None
    text: bytes = b""
    unchanged_since: float = 0.0  # monotonic time the key was first seen
    final: bool = False  # the error is the file's own, not its content's
    uid: int = -1  # the owner of the file read (fstat)

    @property
    def path(self) -> Path:
        return self.jobs_dir / self.name


@functools.lru_cache(maxsize=1024)  # one /etc/passwd read per user, not per spec
def user_name(uid: int) -> str:
    if uid < 0:  # spool/ids.py NOBODY: a reservation whose owner nobody can name
        return "an unknown member"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_spec_file(path: Path, display: str) -> tuple[bytes, os.stat_result]:
    """A spec's bytes and its open file's stat (host/safefile.py): a regular file, not a link
    (nor read through one), one link, under the size cap."""
    try:
        return read_plain(path, MAX_SPEC_BYTES)
    except NotPlain as e:
        fix = {
            safefile.LINK: "copy the spec into jobs/ as a plain file",
            safefile.NOT_REGULAR: "put a plain YAML file in jobs/",
            safefile.LINKS: "copy the spec instead of linking it",
        }
        if e.why == safefile.TOO_BIG:
            size = e.st.st_size if e.st else MAX_SPEC_BYTES + 1
            raise SpecError(
                display,
                None,
                f"is {size} bytes, over the {MAX_SPEC_BYTES} cap",
                "a spec is a few lines; put data in files the command reads",
            ) from None
        raise SpecError(display, None, e.why, fix[e.why]) from None


def check_job_id(job_id: str, name: str) -> None:
    if not JOB_ID_RE.match(job_id):
        raise SpecError(
            f"jobs/{name!r}",
            None,
            "the file name is not a usable job id",
            f"rename it to {ID_RULE}, e.g. train-a.yaml",
        )


def keeper(layout: Layout, job_id: str, paths: list[Path]) -> Path | None:
    """Of files in jobs/ under one id (x.yaml and x.yml), the one that is the job: the file of
    the user the id is held for (spool/ids.py, held_for), else the one that landed first (by change time,
    as a job's place in the queue is read). None: none is (the id is held for someone else)."""
    found = []
    for path in paths:
        try:
            found.append((os.lstat(path), path))
        except FileNotFoundError:
            continue
    if found and (owner := held_for(layout, job_id)) is not None:
        found = [(st, path) for st, path in found if st.st_uid == owner]
    return min(found, key=lambda f: f[0].st_ctime_ns)[1] if found else None


def parse_entry(layout: Layout, job_id: str, path: Path, st: os.stat_result, text: bytes) -> PendingJob:
    spec = parse_spec_text(text, f"jobs/{path.name}")
    user = user_name(st.st_uid)
    # A job's place in the queue is when its file landed in jobs/: the change time, which the
    # kernel sets on every write, link and rename (its mtime a member can set to any past
    # day); or, for a job a worker put back (released, requeued), the place it kept.
    kept = kept_place(layout, job_id, st.st_uid)
    return PendingJob(job_id, user, spec, st.st_ctime if kept is None else min(kept, st.st_ctime))


class Intake:
    """The pending specs of one root, re-read only when a file changes."""

    def __init__(self, layout: Layout, policy: OwnerPolicy | None = None, watch: MtimeWatch | None = None) -> None:
        self.layout = layout
        self.watch = watch or MtimeWatch()  # jobs/'s mtime, on the worker's monotonic clock
        self.policy = policy  # the worker's: whose specs it may run
        self.entries: dict[str, Entry] = {}
        self.duplicates: dict[str, str] = {}  # a second file of a known id (x.yml beside x.yaml): refused
        # Kept apart so that a pass costs O(changes), not O(pending):
        self.failing: set[str] = set()  # ids whose file does not parse (yet)
        self.unchecked: set[str] = set()  # ids parsed since the worker last checked them
        self.deferred: set[str] = set()  # ... of them, sweeps left to the next pass (check_later)
        self.version = 0  # bumped whenever the set of parsed jobs changes
        self._pending: tuple[int, list[PendingJob]] = (-1, [])
        self.scanned_at = float("-inf")
        self.full_scan_at = float("-inf")
        self.dir_key: tuple[int, int, int] | None = None
        self.listing: dict[str, int] = {}  # jobs/ as last read: name -> inode
        self.jobs_dir_str = str(layout.jobs)
        self.unread: set[str] = set()  # names the last scan left to the next (READ_BUDGET_S)

    def scan(self, now_mono: float, full: bool = True, budget_s: float | None = None) -> None:
        """Find new, changed and vanished specs. `full=False` skips the directory when its
        mtime shows no change (and the change was not so recent that the clock tick could
        hide another), and otherwise examines only names that are new or whose inode changed
        (readdir gives both for free). Specs that do not parse yet are always re-examined.
        Reading stops after `budget_s` (READ_BUDGET_S) of real time (one file at least); the names left are
        `unread`, and the next scan examines them whatever the directory says."""
        self.scanned_at = now_mono
        if full:
            self.full_scan_at = now_mono
        else:
            try:
                dir_key, settled = self._dir_key()
            except OSError:
                return
            if dir_key == self.dir_key and settled and not self.failing and not self.unread:
                return
            self.dir_key = None  # until the listing below is whole (one that fails must not stand)
        listing = self._list()
        if full:
            candidates = set(listing)
        else:  # set operations on dict views run in C: a burst of claims costs O(changes)
            self.dir_key = dir_key if settled else None  # the listing is whole: it may stand
            candidates = {name for name, _ in listing.items() - self.listing.items()}
            candidates.update(self.entries[i].name for i in self.failing)
            candidates.update(self.unread)
        self.listing = listing
        changed = False
        for gone in [i for i, e in self.entries.items() if e.name not in listing]:
            self._drop(gone)
            changed = True
        deadline, read_one = time.monotonic() + (READ_BUDGET_S if budget_s is None else budget_s), False
        self.unread = set()
        looked_at: set[str] = set()  # ids examined this scan: their other file is too, whatever the budget
        for name, st in self._fair_order(candidates, listing):
            job_id = job_id_for_spec_name(name)
            if job_id is None:
                continue
            if read_one and job_id not in looked_at and time.monotonic() > deadline:
                self.unread.add(name)
                continue
            looked_at.add(job_id)
            known = self.entries.get(job_id)
            if known is not None and known.name != name:  # train.yaml and train.yml: one id, two files
                if not self._keeps_id(job_id, name, known.name):
                    self.duplicates[name] = job_id
                    continue
                # The file that landed first keeps the id, whichever one a scan met first (a
                # scan that finds both new meets them in no order: a member's later file under
                # another's id took it from her when the worker fell behind).
                self.duplicates[known.name] = job_id
                self._drop(job_id)
                known, changed = None, True
            read = self._examine(job_id, name, known, now_mono, st)  # False: unchanged, nothing read
            read_one |= read
            changed |= read
        if changed:
            self.version += 1

    def _fair_order(self, names: set[str], listing: dict[str, int]) -> list[tuple[str, os.stat_result]]:
        """The names to examine with their lstat, each owner's in turn (their first files,
        then their second ones, ...), oldest first: what one member drops cannot keep
        another's spec unread past the first scan. Names no longer listed, or gone, are left out."""
        found = []
        for name in names:
            if name not in listing:
                continue
            try:
                st = os.lstat(f"{self.jobs_dir_str}/{name}")
            except FileNotFoundError:
                continue
            found.append((st.st_uid, st.st_ctime_ns, name, st))
        found.sort(key=lambda f: f[:3])
        seen: dict[int, int] = {}  # owner -> how many of theirs are ordered so far
        first: dict[str | None, tuple[int, int]] = {}  # job id -> the place of its first file
        places = []
        for uid, ctime_ns, name, st in found:
            seen[uid] = turn = seen.get(uid, -1) + 1
            job_id = job_id_for_spec_name(name)
            first[job_id] = min(first.get(job_id, (turn, ctime_ns)), (turn, ctime_ns))
            places.append((job_id, ctime_ns, name, st))
        # An id's two files (x.yaml, x.yml: another member's may come later) side by side, at the
        # place of its first: the later one was read, and took the id, while the first waited.
        places.sort(key=lambda p: (*first[p[0]], p[1], p[2]))
        return [(name, st) for _, _, name, st in places]

    def gone_since_scan(self) -> set[str]:
        """Ids of parsed specs no longer in jobs/: claimed (or cancelled) by another box since
        the last scan. A pass reads jobs/ before it waits for the queue lock; what another box
        claimed meanwhile must not be planned again (its running copy fills the GPU it took,
        and the plan made an opportunistic job yield elsewhere for it). One stat when jobs/
        has not changed; nothing here changes what the next scan will find."""
        try:
            dir_key, settled = self._dir_key()
            if dir_key == self.dir_key and settled:
                return set()
            listing = self._list()
        except OSError:
            return set()
        return {i for i, e in self.entries.items() if e.name not in listing}

    def _dir_key(self) -> tuple[tuple[int, int, int], bool]:
        """jobs/'s identity and whether it has stood long enough that a change within the
        same clock tick would show (spool/dirwatch.py)."""
        st = os.stat(self.layout.jobs)
        key = (st.st_mtime_ns, st.st_ino, st.st_size)
        return key, self.watch.stood(key)

    def _list(self) -> dict[str, int]:
        """jobs/ as it is now: name -> inode."""
        with os.scandir(self.layout.jobs) as it:
            return {entry.name: entry.inode() for entry in it}

    def _keeps_id(self, job_id: str, name: str, other: str) -> bool:
        """Whether jobs/`name` rather than jobs/`other` keeps the id (`keeper`: a put-back lands
        last, and a member's file waiting there first must not take her id); False when
        either cannot be looked at."""
        mine, theirs = self.layout.jobs / name, self.layout.jobs / other
        return os.path.lexists(theirs) and keeper(self.layout, job_id, [mine, theirs]) == mine

    def _examine(self, job_id: str, name: str, known: Entry | None, now_mono: float, st: os.stat_result) -> bool:
        """(Re)read one spec file (`st`: its lstat) if it changed. Returns whether the entry changed."""
        key = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_nlink)
        if known is not None and known.key == key:
            return False
        entry = Entry(key, self.layout.jobs, name, unchanged_since=now_mono)
        try:
            # What is wrong with the file itself (a link, a FIFO, its owner, its name) does not
            # mend as a writer finishes: refused at once. Its content waits to settle, and so
            # does a second hard link: `gpuq submit` and a worker putting a spec back link the
            # name into jobs/ and then unlink their own (a loaded box reads in between).
            entry.final = st.st_nlink == 1
            entry.text, fst = read_spec_file(entry.path, f"jobs/{name}")
            entry.final, entry.uid = True, fst.st_uid
            if self.policy is not None:
                self.policy.check(fst, f"jobs/{name}")
            check_job_id(job_id, name)
            entry.final = False
            job = parse_entry(self.layout, job_id, entry.path, fst, entry.text)
            if self.policy is not None:  # before it is a job: a refused spec is never planned
                self.policy.check_rank(fst.st_uid, job.spec.priority_class, job.spec.priority, f"jobs/{name}")
            entry.job = job
        except SpecError as e:
            entry.error = e
        except FileNotFoundError:
            return False
        except OSError as e:
            entry.error = SpecError(
                f"jobs/{name}", None, f"cannot be read ({e.strerror})", "make it readable by the worker"
            )
        except Exception as e:  # a check that failed on some input it did not foresee: this spec's problem only
            entry.error = SpecError(
                f"jobs/{name}",
                None,
                f"could not be checked ({type(e).__name__}: {e})",
                "compare its fields with docs/reference.md, and report this message to the root's owner",
            )
        self._put(job_id, entry)
        return True

    def _put(self, job_id: str, entry: Entry) -> None:
        self.entries[job_id] = entry
        if entry.error is not None:
            self.failing.add(job_id)
            self.unchecked.discard(job_id)
        else:
            self.failing.discard(job_id)
            self.unchecked.add(job_id)

    def _drop(self, job_id: str) -> Entry | None:
        self.failing.discard(job_id)
        self.unchecked.discard(job_id)
        return self.entries.pop(job_id, None)

    def take_duplicates(self) -> list[tuple[str, str]]:
        """(file name, job id) of second files for ids another file already has."""
        found = [
            (name, job_id)
            for name, job_id in self.duplicates.items()
            if name in self.listing and job_id in self.entries
        ]
        self.duplicates.clear()
        return found

    def forget(self, job_id: str) -> None:
        """The worker claimed or rejected this spec: it is no longer pending. If a file by
        that name comes back (a claim put back), the next scan must read it afresh."""
        entry = self._drop(job_id)
        if entry is not None:
            self.listing.pop(entry.name, None)
            self.version += 1

    def pending(self) -> list[PendingJob]:
        """The parsed pending jobs: a pass asks several times, and with thousands waiting a
        list built anew each time costs; it changes only with `version`."""
        if self._pending[0] != self.version:
            self._pending = (
                self.version,
                [e.job for i, e in self.entries.items() if e.job is not None and i not in self.deferred],
            )
        return self._pending[1]

    def settled_errors(self, now_mono: float, settle_s: float) -> list[tuple[str, Entry]]:
        """Invalid specs unchanged for `settle_s`: time to reject them."""
        return [
            (i, self.entries[i])
            for i in self.failing
            if self.entries[i].final or now_mono - self.entries[i].unchanged_since >= settle_s
        ]

    def unsettled(self) -> dict[str, SpecError]:
        return {i: self.entries[i].error for i in self.failing}  # type: ignore[misc]

    def check_later(self, job_id: str) -> None:
        """Back among the unchecked, for the worker's next pass; not pending meanwhile (a sweep
        not yet expanded is no job to plan)."""
        if job_id in self.entries:
            self.unchecked.add(job_id)
            self.deferred.add(job_id)
            self.version += 1

    def take_unchecked(self) -> list[Entry]:
        """Parsed specs the worker has not yet checked (once per version of each file)."""
        taken = [self.entries[i] for i in self.unchecked]
        self.unchecked.clear()
        if self.deferred:
            self.deferred.clear()
            self.version += 1
        return taken

    # --- the shared cache ---------------------------------------------------------------

    def cache_json(self) -> dict:
        return {
            i: [list(e.key), e.job.user, e.job.spec.to_cache(), e.job.queued_at, e.name]
            for i, e in self.entries.items()
            if e.job is not None
        }

    def seed(self, cache: dict) -> None:
        """Take parsed specs from another process's `cache_json`; a scan re-reads any file
        whose (mtime, size, inode, links) no longer matches."""
        jobs = self.layout.jobs
        entries = self.entries  # (parsed specs only: nothing failing, and the worker's checks done)
        for job_id, (key, user, spec, queued_at, name) in cache.items():
            entries[job_id] = Entry(
                tuple(key), jobs, name, PendingJob(job_id, user, JobSpec.from_cache(spec), queued_at)
            )
            self.listing[name] = key[2]  # as if this process had listed it: only other names are examined


def load_pending_for_view(layout: Layout, cache_files: list[Path]) -> tuple[list[PendingJob], dict[str, str]]:
    """Pending jobs for `gpuq status`: the same scan a worker does between its full scans,
    seeded with a worker's shared cache, so that only files added, removed or replaced since
    are read here (a file edited in place shows its new content once that worker's cache is
    rewritten, within seconds). Returns (jobs, problems: id -> message for specs that do not
    parse yet)."""
    intake = Intake(layout)
    for path in cache_files:
        try:
            intake.seed(json.loads(path.read_bytes()))
        except (OSError, ValueError, KeyError, TypeError):  # unreadable, or another version's: scan instead
            continue
    intake.scan(time.monotonic(), full=False)
    problems = {i: str(e) for i, e in intake.unsettled().items()}
    for name in intake.unread:
        if (job_id := job_id_for_spec_name(name)) is not None and job_id not in intake.entries:
            problems[job_id] = f"jobs/{name}: {NOT_READ_YET}"
    return intake.pending(), problems
