"""Why a running job was stopped, as a type: the cause a worker's stop order or the supervisor's
own watch gives, carried beside the human reason (the record's `cause`, the event's `cause`).
Decisions (requeue or record, which final state) are taken on the cause, never on the text.

A stop order travels from a worker to the job's supervisor as a small local file of one line,
the reason, whose first word is its cause ("preempted: ...", "limit: ...", "cancelled by ...").
That is the format orders always had, so a supervisor started by an older gpuq (still running
its job through an upgrade) reads a newer worker's order as it always did; `Stop.decode` turns
it into the type once, at that boundary. An order is only ever a cancel, a preemption or a
limit, whose constructors begin the reason with the cause's word, so an order read back is the
stop that was sent (a timeout and fencing are the supervisor's own, never ordered).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpuq.model.states import State


class StopCause(str, Enum):
    CANCEL = "cancelled"  # `gpuq cancel`, or a job whose dependency failed
    PREEMPT = "preempted"  # yields its GPU to higher-priority work: requeued, never recorded as ended
    LIMIT = "limit"  # used more than it declared (host memory, GPU memory)
    TIMEOUT = "timeout"  # ran past its time_limit
    FENCE = "fenced"  # its host lost touch with the spool: the attempt's result is not recorded

    @property
    def ends_as(self) -> State | None:
        """The final state a job stopped for this cause is recorded in; None when the stop is not
        its end (a preempted job goes back to the queue; a fenced one is settled by recovery)."""
        return _ENDS_AS.get(self)


_ENDS_AS = {StopCause.CANCEL: State.CANCELLED, StopCause.LIMIT: State.FAILED, StopCause.TIMEOUT: State.TIMEOUT}


def ended_as(stop: Stop | None, exit_code: int | None) -> State:
    """How an attempt that ran to its end is recorded, by its supervisor or, when that died,
    by the worker from the keeper's exit file: as its stop says, else by its exit code (a
    job killed by a signal has none: failed)."""
    if stop is not None:
        return stop.cause.ends_as or State.CANCELLED
    return State.DONE if exit_code == 0 else State.FAILED


AT_ONCE = " (at once, without its grace)"  # a cancel's words where it is `gpuq cancel --now`


@dataclass(frozen=True)
class Stop:
    cause: StopCause
    reason: str  # what `gpuq status` and `gpuq show` say: "preempted: job x needs its GPU memory"

    @classmethod
    def cancel(cls, by: str, at_once: bool = False) -> Stop:
        """`at_once` (`gpuq cancel --now`): SIGKILL without the job's grace; the words say it,
        as the stop file carries nothing else."""
        return cls(StopCause.CANCEL, f"cancelled by {by}" + (AT_ONCE if at_once else ""))

    @property
    def at_once(self) -> bool:
        return self.cause is StopCause.CANCEL and self.reason.endswith(AT_ONCE)

    @classmethod
    def preempt(cls, why: str) -> Stop:
        return cls(StopCause.PREEMPT, f"preempted: {why}")

    @classmethod
    def limit(cls, why: str) -> Stop:
        return cls(StopCause.LIMIT, f"limit: {why}")

    def encode(self) -> bytes:
        return self.reason.encode()

    @classmethod
    def decode(cls, data: bytes) -> Stop:
        """A stop order: its cause is its first word. Only a cancel, a preemption or a limit is
        ever ordered (a timeout and fencing are the supervisor's own); anything else, empty or
        unreadable, is a cancel: whoever could write the file wanted the job stopped."""
        text = data.decode("utf-8", "replace").strip() or "cancelled"
        return cls(cause_in_words(text) or StopCause.CANCEL, text)


def cause_in_words(reason: object) -> StopCause | None:
    """A preemption's or a limit's cause from the word its reason begins with: how a stop order
    says it, and how records and events written before the `cause` field said it."""
    if not isinstance(reason, str):
        return None
    for cause in (StopCause.PREEMPT, StopCause.LIMIT):
        if reason.startswith(cause.value):
            return cause
    return None


def cause_of(entry: dict) -> StopCause | None:
    """The cause of a record's or an event's stop: the typed one wherever gpuq wrote the field
    (None included), else as its reason's words said it before the field existed."""
    if "cause" not in entry:
        return cause_in_words(entry.get("reason"))
    try:
        return StopCause(entry["cause"]) if entry["cause"] is not None else None
    except ValueError:  # a cause a newer gpuq knows: none this one acts on
        return None


@dataclass(frozen=True)
class StopOrder:
    """A running job told to stop, as its box publishes it (the heartbeat's `stops`): since
    when, on that box's wall clock, and why. None in either: a heartbeat that did not say
    (a worker of an older gpuq lists only the ids)."""

    since: float | None
    cause: StopCause | None

    def to_json(self) -> dict:
        return {"since": self.since, "cause": self.cause.value if self.cause else None}

    @classmethod
    def from_json(cls, d: object) -> StopOrder:
        """From a heartbeat's `stops` entry (checked by teamstate.heartbeat_problem)."""
        if not isinstance(d, dict):
            return cls(None, None)
        cause = d.get("cause")
        return cls(d.get("since"), StopCause(cause) if cause in _CAUSES else None)


_CAUSES = {c.value for c in StopCause}
