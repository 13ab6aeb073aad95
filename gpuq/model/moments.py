"""Moments people type: `history --since yesterday`, `report --since 7d`, `submit --begin
now+1hour`. One reader for all of them, in local time, pure given `now`.

The forms are Slurm's (sbatch --begin, sacct -S/-E) and gpuq's own durations:
- `now`, `today`, `yesterday`, `tomorrow` (midnight of that day), `midnight`, `noon`;
- `now+1hour`, `now-30min`, `now+2days` (a bare count is seconds, as Slurm reads it);
- a duration such as `7d` or `90m`, back from now for a window's edge, ahead for a start;
- `2026-11-01`, `2026-11-01 14:00`, `2026-11-01T14:00[:SS]`;
- `HH:MM[:SS]`: today at that time (for a start, tomorrow once it has passed, as sbatch does).
"""

from __future__ import annotations

import re
import time

from gpuq.model.units import DURATION_RE, MAX_DURATION_S, parse_duration_s

MOMENT_EXAMPLES = "yesterday, 7d, now-2h, 2026-11-01, '2026-11-01 14:00', 14:00"
BEGIN_EXAMPLES = "now+1hour, 2h, 16:00, tomorrow, 2026-12-24T08:00"

_RELATIVE_RE = re.compile(
    r"^now\s*([+-])\s*(\d+)\s*(seconds?|secs?|s|minutes?|mins?|m|hours?|h|days?|d|weeks?|w)?$", re.ASCII
)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$", re.ASCII)
_DATE_FORMATS = ("%Y-%m-%d", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S")


def parse_moment(text: str, now: float, ahead: bool = False) -> float:
    """The instant `text` names, as a Unix time. `ahead`: a bare duration and a time of day
    look forward (a job's earliest start); otherwise back (a window's edge). Raises ValueError
    saying what was not understood and the accepted forms."""
    word = text.strip().lower()
    examples = BEGIN_EXAMPLES if ahead else MOMENT_EXAMPLES
    if word == "now":
        return now
    if word in _DAYS_FROM_TODAY:
        return _midnight(now, _DAYS_FROM_TODAY[word])
    if word in ("midnight", "noon"):
        at = _midnight(now, 0) + (12 * 3600 if word == "noon" else 0)
        return at + 86400 if ahead and at < now else at
    if relative := _RELATIVE_RE.match(word):
        sign, count, unit = relative.groups()
        step = int(count) * _UNIT_S[(unit or "s")[0]]
        if step > MAX_DURATION_S:
            raise ValueError(f"{text!r} is more than 100 years away; write it like {examples}")
        return now + step if sign == "+" else now - step
    if DURATION_RE.match(word):
        try:
            duration = parse_duration_s(word)
        except ValueError:
            raise ValueError(f"{text!r} is more than 100 years away; write it like {examples}") from None
        return now + duration if ahead else now - duration
    if clock := _CLOCK_RE.match(word):
        hours, minutes, seconds = int(clock[1]), int(clock[2]), int(clock[3] or 0)
        if hours > 23 or minutes > 59 or seconds > 59:
            raise ValueError(f"{text!r} is not a time of day; write it like {examples}")
        offset = hours * 3600 + minutes * 60 + seconds
        at = _midnight(now, 0) + offset
        return _midnight(now, 1) + offset if ahead and at < now else at
    for fmt in _DATE_FORMATS:
        try:
            return time.mktime(time.strptime(text.strip(), fmt))
        except (ValueError, OverflowError):
            continue
    raise ValueError(f"{text!r} is not a moment gpuq reads; write it like {examples}")


_DAYS_FROM_TODAY = {"today": 0, "yesterday": -1, "tomorrow": 1}


def _midnight(t: float, days_later: int) -> float:
    """Local midnight `days_later` days after the day of `t` (through mktime: a day is not
    always 86,400 s where the clocks change)."""
    day = time.localtime(t)
    return time.mktime((day.tm_year, day.tm_mon, day.tm_mday + days_later, 0, 0, 0, 0, 0, -1))
