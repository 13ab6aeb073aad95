"""How far an attempt got, as its supervisor keeps it in the job's lock file (run/supervise.py
writes it, this host's worker reads it: run/joblocal.py): a typed phase with its one table of
allowed transitions, as model/states.py is for records, and what a worker makes of an attempt
whose supervisor is gone in each phase (worker/recovery.py).

The file's JSON keys are those of before the phases had names (`{claim}`, `{claim, keeper_pid,
keeper_ticks}`, `{claim, ended: true}`, `{claim, preempted}`, `{claim, fenced}`, `{claim,
result, unrecorded}`, `{}`; `{claim, retry, changes}` came later): a worker upgraded while
supervisors of the old code run reads theirs. The supervisor adds its own pid, start ticks and the time to each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Phase(str, Enum):
    UNSTARTED = "unstarted"  # no marker of this attempt: it never ran (or was handed back before it did)
    STARTED = "started"  # the supervisor owns the attempt, its record synced: the job may run
    RUNNING = "running"  # a keeper runs the job (each restart of a service marks its new keeper)
    ENDED = "ended"  # nothing of the job runs; the supervisor is recording the result
    PREEMPTED = "preempted"  # it yielded its GPU: the spec goes back to its old place
    FENCED = "fenced"  # stopped, and nothing recorded: this host was cut off from the others
    UNRECORDED = "unrecorded"  # the shared disk refused the result: it is kept here instead
    RETRY = "retry"  # it failed, and a retry rule sends it back to its place with its spec changed


# Each phase's possible successors, as the supervisor writes them (a fresh lock file, or one
# an earlier attempt left, is UNSTARTED for this one).
NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.UNSTARTED: frozenset({Phase.STARTED}),
    # Handed back (the root part was gone before anything ran); or it never ran a keeper.
    Phase.STARTED: frozenset({Phase.UNSTARTED, Phase.RUNNING, Phase.ENDED}),
    Phase.RUNNING: frozenset({Phase.RUNNING, Phase.ENDED, Phase.RETRY}),  # a retry keeps its GPUs: no ENDED
    # Recorded as usual, the attempt's files go, lock file with them: no marker follows.
    Phase.ENDED: frozenset({Phase.PREEMPTED, Phase.FENCED, Phase.UNRECORDED}),
    Phase.PREEMPTED: frozenset(),
    Phase.RETRY: frozenset(),
    Phase.FENCED: frozenset(),
    Phase.UNRECORDED: frozenset(),
}

# The phases in which nothing of the job runs any more: its GPUs and CPU slot are free while
# the supervisor finishes (its record may still say running for a moment). Not RETRY: the job
# goes back to its place, and its GPUs must not go to a job behind it before it is there.
OVER = frozenset({Phase.ENDED, Phase.PREEMPTED, Phase.FENCED, Phase.UNRECORDED})


class MarkerError(Exception):
    """A marker written out of order: a bug in the supervisor, never input."""


@dataclass(frozen=True)
class Marker:
    phase: Phase
    claim: str | None  # the attempt's claim: a marker of another attempt is no marker of this one
    why: str | None = None  # PREEMPTED, FENCED, UNRECORDED, RETRY: what happened
    keeper_pid: int | None = None  # RUNNING
    keeper_ticks: int | None = None
    result: object = None  # UNRECORDED: the result the record should have had (as read: unchecked);
    # RETRY: the spec fields to set (None: remove the field), as read: unchecked
    supervisor_pid: int | None = None  # as read back: who wrote it (with its start ticks)
    ticks: int | None = None

    def fields(self) -> dict[str, Any]:
        """The marker's own keys, as the file has them (the writer adds its pid, ticks, time)."""
        if self.phase is Phase.UNSTARTED:
            return {}
        own: dict[str, Any] = {"claim": self.claim}
        if self.phase is Phase.RUNNING:
            own |= {"keeper_pid": self.keeper_pid, "keeper_ticks": self.keeper_ticks}
        elif self.phase is Phase.ENDED:
            own["ended"] = True
        elif self.phase in (Phase.PREEMPTED, Phase.FENCED):
            own[self.phase.value] = self.why
        elif self.phase is Phase.UNRECORDED:
            own |= {"result": self.result, "unrecorded": self.why}
        elif self.phase is Phase.RETRY:
            own |= {"retry": self.why, "changes": self.result}
        return own


def parse_marker(data: bytes | None, claim: str | None) -> Marker:
    """The marker of attempt `claim` in a lock file's bytes: UNSTARTED when there is none of
    this attempt (an empty or torn file, an earlier attempt's, or not an object)."""
    try:
        found = json.loads(data or b"")
    except ValueError:
        found = None
    if claim is None or not isinstance(found, dict) or found.get("claim") != claim:
        return Marker(Phase.UNSTARTED, claim)
    pid, ticks = _int(found.get("supervisor_pid")), _int(found.get("ticks"))
    if found.get("preempted"):
        return Marker(Phase.PREEMPTED, claim, why=str(found["preempted"]), supervisor_pid=pid, ticks=ticks)
    if found.get("fenced"):
        return Marker(Phase.FENCED, claim, why=str(found["fenced"]), supervisor_pid=pid, ticks=ticks)
    if found.get("retry"):
        why = str(found["retry"])
        return Marker(Phase.RETRY, claim, why=why, result=found.get("changes"), supervisor_pid=pid, ticks=ticks)
    if found.get("result"):
        why = str(found.get("unrecorded"))
        return Marker(Phase.UNRECORDED, claim, why=why, result=found["result"], supervisor_pid=pid, ticks=ticks)
    if found.get("ended"):
        return Marker(Phase.ENDED, claim, supervisor_pid=pid, ticks=ticks)
    if "keeper_pid" in found:
        keeper, keeper_ticks = _int(found["keeper_pid"]), _int(found.get("keeper_ticks"))
        return Marker(
            Phase.RUNNING, claim, keeper_pid=keeper, keeper_ticks=keeper_ticks, supervisor_pid=pid, ticks=ticks
        )
    return Marker(Phase.STARTED, claim, supervisor_pid=pid, ticks=ticks)


def check_marker(previous: Phase, new: Phase) -> None:
    if new not in NEXT[previous]:
        raise MarkerError(f"an attempt's marker cannot go from {previous.value} to {new.value}")


def _int(value: object) -> int | None:
    return value if type(value) is int else None
