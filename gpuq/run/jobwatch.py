"""The supervisor's wait for its job, decided from the time it is handed (as huey's
`loop(now)`): when to look next, and what is due at `now`: the KILL after a stop's grace, the
next fencing check, the limits' next sample. The supervisor (run/supervise.py) does what it
says (signals, the fencing check, sampling) and reads the clock; nothing here does either, so
a test drives the wait with plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuq.model.stops import Stop

NEVER = float("inf")
AT_ONCE_LOOK_S = 1.0  # during a stop's grace, how often its stop file is read for `cancel --now`
FENCE_CHECKS_PER_LEASE = 10  # a host cut off stops its job well inside lost_after_s
FENCE_CHECK_MAX_S = 5.0


@dataclass
class JobWatch:
    check_every: float  # the fencing check's period
    next_check: float
    stop: Stop | None = None  # the one stop under way (TERM sent); later ones change nothing but `kill_now`
    kill_at: float = NEVER  # when the stopped job gets SIGKILL

    @classmethod
    def starting(cls, now: float, lost_after_s: float) -> JobWatch:
        every = min(FENCE_CHECK_MAX_S, lost_after_s / FENCE_CHECKS_PER_LEASE)
        return cls(every, now + every)

    def stopping(self, stop: Stop, grace_s: float, now: float) -> bool:
        """A stop: TERM now, KILL once its grace is over; for `cancel --now`, KILL now (sent
        with it: no TERM, which would start a checkpoint the KILL cuts short), nothing after.
        False when one is under way already."""
        if self.stop is not None:
            return False
        self.stop, self.kill_at = stop, NEVER if stop.at_once else now + grace_s
        return True

    def wake_at(self, limits_at: float, lookup_at: float = NEVER) -> float:
        """When to look again (the job's exit wakes the wait sooner). Once stopped, only the
        KILL and a run's companion (a container's lookup) are due: no fencing check, no limit, so no busy wait;
        once killed, NEVER: its exit is all that is left to wait for."""
        if self.stop is not None:
            return min(self.kill_at, lookup_at)
        return min(self.next_check, limits_at, lookup_at)

    @property
    def in_grace(self) -> bool:
        """A stop's grace runs (TERM sent, KILL to come): a `cancel --now` may cut it short."""
        return self.stop is not None and not self.stop.at_once and self.kill_at != NEVER

    def look_within(self, timeout: float | None) -> float | None:
        """How long the wait may block: in a grace, AT_ONCE_LOOK_S at most, so that a `cancel
        --now` written into the stop file meanwhile is read (`kill_now`)."""
        if not self.in_grace:
            return timeout
        return AT_ONCE_LOOK_S if timeout is None else min(timeout, AT_ONCE_LOOK_S)

    def kill_now(self, now: float) -> None:
        """`cancel --now` while a stop's grace runs: KILL now. The stop stays the one under way
        (a timeout stays a timeout; a cancel's words are the first cancel's)."""
        if self.in_grace:
            self.kill_at = now

    def kill_due(self, now: float) -> bool:
        if now < self.kill_at:
            return False
        self.kill_at = NEVER  # once
        return True

    def limits_due(self, now: float, limits_at: float) -> bool:
        return self.stop is None and now >= limits_at

    def fence_check_due(self, now: float) -> bool:
        if self.stop is not None or now < self.next_check:
            return False
        self.next_check = now + self.check_every
        return True
