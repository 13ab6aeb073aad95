"""The job states and the one table of allowed transitions (enforced in `check_transition`)."""

from __future__ import annotations

from enum import Enum


class State(str, Enum):
    PENDING = "pending"
    HELD = "held"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"
    TIMEOUT = "timeout"  # ran past its time_limit: stopped (TERM, grace, KILL)
    REJECTED = "rejected"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATES


FINAL_STATES = frozenset({State.DONE, State.FAILED, State.CANCELLED, State.LOST, State.TIMEOUT, State.REJECTED})

ALLOWED: dict[State, frozenset[State]] = {
    State.PENDING: frozenset({State.RUNNING, State.HELD, State.CANCELLED, State.REJECTED}),
    State.HELD: frozenset({State.PENDING, State.CANCELLED}),
    # running -> pending is a requeue (preempted, lost, or never started).
    State.RUNNING: frozenset({State.DONE, State.FAILED, State.CANCELLED, State.LOST, State.TIMEOUT, State.PENDING}),
    # An ended job goes back to the queue only by `gpuq retry` (spool/holds.py).
    State.DONE: frozenset({State.PENDING}),
    State.FAILED: frozenset({State.PENDING}),
    State.CANCELLED: frozenset({State.PENDING}),
    State.TIMEOUT: frozenset({State.PENDING}),
    # A lost job whose retries allow goes back to the queue (issue: crash recovery).
    State.LOST: frozenset({State.PENDING}),
    # A refused spec goes back to be checked again by `gpuq retry` (a refusal since mended).
    State.REJECTED: frozenset({State.PENDING}),
}


class TransitionError(Exception):
    """A state change that the table does not allow: a bug, never user input."""


def check_transition(job_id: str, old: State, new: State) -> None:
    if new not in ALLOWED[old]:
        raise TransitionError(f"job {job_id} cannot go from {old.value} to {new.value}")


# Slurm's state names and codes (squeue -t, sacct -s, scancel -t), read as the states they
# name; a held job is one of Slurm's PENDING ones (its reason says it is held).
SLURM_STATES: dict[str, tuple[str, ...]] = {
    "PD": ("pending", "held"),
    "PENDING": ("pending", "held"),
    "R": ("running",),
    "RUNNING": ("running",),
    "CD": ("done",),
    "COMPLETED": ("done",),
    "F": ("failed",),
    "FAILED": ("failed",),
    "CA": ("cancelled",),
    "CANCELLED": ("cancelled",),
    "TO": ("timeout",),
    "TIMEOUT": ("timeout",),
    "NF": ("lost",),
    "NODE_FAIL": ("lost",),
}


def states_named(text: str) -> list[str]:
    """gpuq's states for a comma-separated list of gpuq's names and Slurm's (PD, R, CD, F, CA,
    TO, NF and their long names), in any case, gpuq's first; a name neither knows is kept, to
    be refused by the caller with its own choices."""
    named: list[str] = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        ours = word.lower() in {s.value for s in State}  # gpuq's `pending` is its own, not Slurm's PENDING
        named += [word.lower()] if ours else SLURM_STATES.get(word.upper(), (word.lower(),))
    return list(dict.fromkeys(named))
