"""Idle windows: when opportunistic jobs may run (config `idle_windows`).

Each entry is a time-of-day range (`22:00-08:00`, may wrap past midnight), a day range
(`Sat-Sun`, `Mon`), or both (`Mon-Fri 19:00-23:00`). The window is open when any entry
matches the host's local time. No entries: always open.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_TIME_RANGE = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")
EXAMPLES = "22:00-08:00, Sat-Sun, Mon-Fri 19:00-23:00"


@dataclass(frozen=True)
class Window:
    text: str
    days: frozenset[int] | None  # 0 = Monday; None = every day
    minutes: tuple[int, int] | None  # [start, end) minutes after midnight; None = all day

    def contains(self, weekday: int, minute: int) -> bool:
        if self.minutes is None:
            return self.days is None or weekday in self.days
        start, end = self.minutes
        if start <= end:
            return start <= minute < end and (self.days is None or weekday in self.days)
        # Wraps midnight: the evening part belongs to the day it starts on, the morning part
        # to the day before (Fri 22:00-08:00 covers Saturday until 08:00).
        if minute >= start:
            return self.days is None or weekday in self.days
        return minute < end and (self.days is None or (weekday - 1) % 7 in self.days)


def parse_window(text: str) -> Window:
    """'Mon-Fri 22:00-08:00' -> Window. Raises ValueError naming the accepted forms."""
    days: frozenset[int] | None = None
    minutes: tuple[int, int] | None = None
    parts = text.split() if isinstance(text, str) else []
    if not 1 <= len(parts) <= 2:
        raise ValueError(f"{text!r} is not a window; write it like {EXAMPLES}")
    for part in parts:
        clock = _TIME_RANGE.match(part)
        if clock and minutes is None:
            h1, m1, h2, m2 = (int(g) for g in clock.groups())
            if h1 > 24 or h2 > 24 or m1 > 59 or m2 > 59:
                raise ValueError(f"{part!r} is not a time range; write it like 22:00-08:00")
            minutes = (h1 * 60 + m1, h2 * 60 + m2)
        elif days is None and not clock:
            days = _day_range(part)
        else:
            raise ValueError(f"{text!r} is not a window; write it like {EXAMPLES}")
    return Window(text, days, minutes)


def _day_range(part: str) -> frozenset[int]:
    names = part.lower().split("-")
    if len(names) > 2 or any(n[:3] not in DAYS or len(n) < 3 for n in names):
        raise ValueError(f"{part!r} is not a day range; write it like Sat-Sun or Mon-Fri")
    first, last = DAYS.index(names[0][:3]), DAYS.index(names[-1][:3])
    return frozenset((first + i) % 7 for i in range((last - first) % 7 + 1))


def window_open(windows: tuple[Window, ...], now: float) -> bool:
    if not windows:
        return True
    local = time.localtime(now)
    minute = local.tm_hour * 60 + local.tm_min
    return any(w.contains(local.tm_wday, minute) for w in windows)


def describe(windows: tuple[Window, ...]) -> str:
    return ", ".join(w.text for w in windows)


def moment(t: float, now: float) -> str:
    """A moment to come, as a person reads it: 14:05:31 within the next hour (a member read
    "22:16" for a start 30 s away, and "22:19" for a GPU free at 22:18:01), 14:05 within the next
    20 hours, else with its day (Dec 07 14:05); rounded up (the moment is a latest one)."""
    if t - now < 3600:
        return time.strftime("%H:%M:%S", time.localtime(math.ceil(t)))
    up = math.ceil(t / 60) * 60
    return time.strftime("%H:%M" if t - now < 20 * 3600 else "%b %d %H:%M", time.localtime(up))


def hhmm(t: float) -> str:
    """A time of day as a reason shows it (a clock's format, not a reading of the clock)."""
    return time.strftime("%H:%M", time.localtime(t))
