"""The jobs that ended on this host since its worker started, read from the host's event log
(its supervisors append every end there), only the part not read yet: the alerts extra counts the short
ones (a flood of them), and what an extra publishes may count them by final state (the
reports extra's metrics)."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

from gpuq.model.states import FINAL_STATES

SHORT_JOB_S = 10.0
FINAL = frozenset(s.value for s in FINAL_STATES) - {"rejected"}  # a rejected spec never ran here


class FinishedCounter:
    """Jobs that ended on this host since the worker started, by final state."""

    def __init__(self, events_file: Path) -> None:
        self.path = events_file
        try:
            self.offset = events_file.stat().st_size
        except OSError:
            self.offset = 0
        self.by_state: dict[str, int] = {}
        self.short_ends: deque[float] = deque()  # end times of jobs that ran under SHORT_JOB_S

    def counts(self) -> dict[str, int]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return dict(self.by_state)
        complete = data[: data.rfind(b"\n") + 1]  # a line still being appended waits
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("to") in FINAL:
                self.by_state[event["to"]] = self.by_state.get(event["to"], 0) + 1
                started, ended = event.get("started_at"), event.get("ended_at")
                if started and ended and ended - started < SHORT_JOB_S:
                    self.short_ends.append(ended)
        return dict(self.by_state)

    def short_jobs_since(self, t: float) -> int:
        """Jobs that ran under SHORT_JOB_S and ended after `t` (call after `counts`)."""
        while self.short_ends and self.short_ends[0] < t:
            self.short_ends.popleft()
        return len(self.short_ends)
