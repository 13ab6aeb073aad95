"""What each user ran, for fair share: their decayed GPU-seconds, read from the event logs
the workers keep (state/events/<host>.jsonl), incrementally: a worker's pass reads only the
lines appended since its last (sched/fairshare.py holds the arithmetic).

A job's usage is counted once it has ended (or been stopped and put back): its GPUs from its
start to its end, a shared GPU counted as the share of its memory it declared. The plan adds
the running jobs' usage so far itself. The same lines give how long each kind of job ran
(`estimate`): what a job without a time limit is expected to take.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from gpuq.model.states import FINAL_STATES
from gpuq.model.usage import RUNS_KEPT, UsageLedger, kind_of
from gpuq.spool.layout import Layout
from gpuq.spool.store import checked_event

_ENDS = frozenset(s.value for s in FINAL_STATES) | {"pending"}  # "pending": stopped and put back
MAX_LINE_BYTES = 1 << 20  # a longer "line" is not gpuq's
HEAD_BYTES = 256  # of a log's first line (its time, host and job): which log this is


class UsageHistory:
    """The ledger of ended jobs' usage, kept up to date with the event logs."""

    def __init__(self, layout: Layout, half_life_s: float) -> None:
        self.layout, self.half_life_s = layout, half_life_s
        self.ledger = UsageLedger(half_life_s)
        # log name -> (inode, bytes read, its first bytes): a log removed and begun anew may get
        # the same inode back, and one emptied in place keeps it; its first line tells them apart.
        self.read_to: dict[str, tuple[int, int, bytes]] = {}
        self.durations: dict[str, list[float]] = {}  # kind_of -> the latest runs that ended done
        self.started: dict[tuple[str, object], float] = {}  # (job, attempt) -> when it started, while it runs

    def usage(self, now: float, gpu_mem_of: Mapping[str, int]) -> dict[str, float]:
        """Each user's decayed GPU-seconds of ended jobs at `now`. `gpu_mem_of`: host -> the
        memory of its GPUs, to count a shared GPU as a share (a host not known: whole GPUs)."""
        try:
            names = sorted(p.name for p in self.layout.events.glob("*.jsonl"))
        except OSError:
            names = []
        for name in names:
            if not self._read(self.layout.events / name, gpu_mem_of):
                # A log replaced or cut short (moved away by an admin): count everything again.
                self.ledger, self.read_to, self.durations, self.started = UsageLedger(self.half_life_s), {}, {}, {}
                for again in names:
                    self._read(self.layout.events / again, gpu_mem_of)
                break
        return self.ledger.as_of(now)

    def _read(self, path: Path, gpu_mem_of: Mapping[str, int]) -> bool:
        """Add what was appended to one log since it was last read; False if the log is not
        the one read before (another inode, shorter, or other first bytes)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return True  # gone, or not a file: nothing to add
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            inode, offset, head = self.read_to.get(path.name, (st.st_ino, 0, b""))
            if inode != st.st_ino or st.st_size < offset or os.pread(f.fileno(), len(head), 0) != head:
                return False
            if not head:
                head = f.read(HEAD_BYTES)
            f.seek(offset)
            while True:
                line = f.readline(MAX_LINE_BYTES)
                if not line.endswith(b"\n"):
                    break  # a line still being written: read it whole next time
                offset += len(line)
                self._count(line, gpu_mem_of)
            self.read_to[path.name] = (st.st_ino, offset, head[:offset])
        return True

    def _count(self, line: bytes, gpu_mem_of: Mapping[str, int]) -> None:
        if b"running" not in line:  # a start or an end of a run (cheap: most lines are neither)
            return
        event = checked_event(line)
        if event is None:
            return
        run = (event["job"], event.get("attempt"))
        if event.get("to") == "running":  # when it started, for an end that does not say (a put-back)
            self.started[run] = event["t"]
            return
        if event.get("from") != "running" or event.get("to") not in _ENDS:
            return
        started = self.started.pop(run, None)
        start, end, user, gpus = event.get("started_at"), event.get("ended_at"), event.get("user"), event.get("gpus")
        start = start if isinstance(start, (int, float)) else started
        end = end if isinstance(end, (int, float)) else event["t"]
        if not (isinstance(start, (int, float)) and isinstance(user, str) and isinstance(gpus, list) and gpus):
            return
        mem, host_mem = event.get("gpu_mem_mib"), gpu_mem_of.get(str(event.get("host")))
        share = min(1.0, mem / host_mem) if isinstance(mem, int) and host_mem else 1.0
        self.ledger.add(user, len(gpus) * share, float(start), float(end))
        if event["to"] == "done" and end > start:
            runs = self.durations.setdefault(kind_of(user, event["job"]), [])
            runs.append(float(end) - float(start))
            del runs[:-RUNS_KEPT]
