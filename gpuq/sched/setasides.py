"""GPUs set aside for a person over a window (model/jobs.py SetAside: the bookings extra's
bookings, read at the edge) as one planning pass sees them: marked on the slots, and what a
job of someone else would run into. sched/plan.py keeps such jobs off them and says why."""

from __future__ import annotations

from typing import Sequence

from gpuq.model.config import Config
from gpuq.model.jobs import SetAside
from gpuq.model.spec import JobSpec
from gpuq.sched import placement
from gpuq.sched.placement import Slot


def mark(slots: Sequence[Slot], bookings: Sequence[SetAside], now: float) -> dict:
    """Mark the GPUs set aside (booked) now, and those to come; {(host, index): the one on now}."""
    if not bookings:
        return {}
    booked = {(b.host, i): b for b in bookings if b.active(now) for i in b.gpus}
    later: dict[tuple[str, int], list[tuple[float, str]]] = {}
    for coming in bookings:
        if coming.start > now:
            for i in coming.gpus:
                later.setdefault((coming.host, i), []).append((coming.start, coming.owner))
    for s in slots:
        if (b := booked.get((s.host, s.index))) is not None:
            s.booked_for, s.booked_until = b.owner, b.end
        s.booked_later = tuple(sorted(later.get((s.host, s.index), ())))
    return booked


def booked_in(spec: JobSpec, mine: list[Slot], booked: list[Slot], config: Config) -> Slot | None:
    """A booked GPU of the place the job would take if the bookings were not there (the one
    its reason names: not merely the first booked, which may be full); None: none would do."""
    fit = placement.best_fit(spec, mine + booked, config.max_jobs_per_gpu)
    return next((s for s in fit if any(s is b for b in booked)), booked[0]) if fit else None


def booked_before(slot: Slot, user: str, ends_by: float) -> tuple[float, str] | None:
    """The first booking to come on the slot, of someone else, that a job of `user` which may
    run until `ends_by` would run into; None if none."""
    return next(((t, owner) for t, owner in slot.booked_later if owner != user and t < ends_by), None)
