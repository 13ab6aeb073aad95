"""A booking: GPUs set aside for a person or an event over a time span (store.py keeps them;
plan honours them as model.jobs.SetAside values)."""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass

from gpuq.model.names import HOST_RE


@dataclass(frozen=True)
class Booking:
    id: str
    host: str
    gpus: tuple[int, ...]
    start: float
    end: float
    owner: str
    note: str = ""
    by: str = ""

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def overlaps(self, other: "Booking") -> bool:
        return (
            self.host == other.host
            and bool(set(self.gpus) & set(other.gpus))
            and self.start < other.end
            and other.start < self.end
        )

    def describe(self) -> str:
        return f"{self.id} ({self.what()})"

    def what(self) -> str:
        """For whom, which GPUs, when: "nobody, a:0,1, Mon 01:37–Mon 01:47"."""
        return f"{self.owner}, {self.host}:{','.join(map(str, self.gpus))}, {_clock(self.start)}–{_clock(self.end)}"

    def to_json(self) -> dict:
        return {**asdict(self), "gpus": list(self.gpus)}

    @classmethod
    def from_json(cls, data: object) -> "Booking | None":
        """None for a missing file; ValueError for one that is not a booking."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("not a booking")
        b = cls(**{**data, "gpus": tuple(data["gpus"])})
        b.check()
        return b

    def check(self) -> None:
        """Every field is what gpuq writes: names, bounded indices, finite times."""
        if not (
            isinstance(self.id, str)
            and BOOKING_ID_RE.match(self.id)
            and isinstance(self.host, str)
            and HOST_RE.match(self.host)
        ):
            raise BookingError("a booking names a host like box-a")
        if not self.gpus or not all(type(g) is int and 0 <= g < MAX_GPU_INDEX for g in self.gpus):
            raise BookingError(f"GPUs are indices below {MAX_GPU_INDEX}")
        if not all(
            isinstance(t, (int, float)) and math.isfinite(t) and 0 <= t < MAX_TIME for t in (self.start, self.end)
        ):
            raise BookingError("--from and --to must be real times (before the year 3000)")
        if not all(isinstance(s, str) and len(s) <= 200 for s in (self.owner, self.note, self.by)):
            raise BookingError("--note is at most 200 characters")


class BookingError(ValueError):
    pass


BOOKING_ID_RE = re.compile(r"^bk-\d{1,9}\Z")


MAX_TIME = 32503680000.0  # 3000-01-01: later than any booking, and what time.localtime can show


def _clock(t: float) -> str:
    return time.strftime("%a %H:%M", time.localtime(t))


MAX_GPU_INDEX = 1024  # more GPUs than any one box has; bounds what a GPU list may name
