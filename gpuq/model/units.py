"""Human sizes and durations, parsed strictly and printed briefly."""

from __future__ import annotations

import math
import re

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
# One rule, in any case: every size is binary, as Slurm reads "20G" and as a GPU's "80GB" is
# meant: 20g = 20G = 20GB = 20GiB = 20480 MiB. (Decimal GB would make "8GB" 7.5 GiB.)
_MIB_PER_UNIT = {
    "k": 1 / 1024,  # sbatch's --mem 8000K (rounded up to a whole MiB)
    "ki": 1 / 1024,
    "kib": 1 / 1024,
    "kb": 1 / 1024,
    "m": 1.0,
    "mi": 1.0,
    "mib": 1.0,
    "mb": 1.0,
    "g": 1024.0,
    "gi": 1024.0,
    "gib": 1024.0,
    "gb": 1024.0,
    "t": 1024.0**2,
    "ti": 1024.0**2,
    "tib": 1024.0**2,
    "tb": 1024.0**2,
}
SIZE_EXAMPLES = "20GiB, 20G, 20480MiB"
# Bounds that no real size or duration comes near: past them a number is a typo or an attack,
# and would overflow int(), time.localtime() or time.sleep() somewhere downstream.
MAX_SIZE_MIB = 2**30  # 1 PiB
MAX_DURATION_S = 100 * 365.25 * 86400  # 100 years


def parse_size_mib(text: str) -> int:
    """'20GiB' -> 20480. Raises ValueError with the accepted forms."""
    match = _SIZE_RE.match(text) if isinstance(text, str) else None
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _MIB_PER_UNIT:
        raise ValueError(f"{text!r} is not a size; write it like {SIZE_EXAMPLES}")
    mib = float(match.group(1)) * _MIB_PER_UNIT[unit]
    if not mib <= MAX_SIZE_MIB:  # also false for inf (a number of 400 digits)
        raise ValueError(f"{text!r} is larger than any machine (at most 1 PiB); write it like {SIZE_EXAMPLES}")
    return int(mib + 0.999999)  # never round a declared need down


DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
DURATION_EXAMPLES = "30s, 90m, 12h, 2d"


def parse_duration_s(value: object) -> float:
    """'90m' -> 5400.0; a bare number is seconds; sbatch's clock forms ('1:30:00', '2-12')
    as sbatch reads them (slurm_clock_s). Raises ValueError with the accepted forms; NaN,
    infinity and anything over MAX_DURATION_S are refused."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        seconds = float(value)
    elif isinstance(value, str) and (clock := slurm_clock_s(value.strip())) is not None:
        seconds = clock
    else:
        match = DURATION_RE.match(value) if isinstance(value, str) else None
        if not match:
            # As YAML writes what it read (Python's True is YAML's true).
            shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)
            raise ValueError(f"{shown} is not a duration; write it like {DURATION_EXAMPLES}")
        seconds = float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]
    if not seconds <= MAX_DURATION_S:  # also false for NaN and inf
        raise ValueError(f"{value!r} is longer than 100 years; write a duration like {DURATION_EXAMPLES}")
    return seconds


# sbatch's --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds"; its resolution is a minute, and seconds
# are rounded up to the next one (Slurm's sbatch manual).
_SLURM_CLOCK_RE = re.compile(r"^(?:\d+-\d+(?::\d+){0,2}|\d+(?::\d+){1,2})$", re.ASCII)
SLURM_TIME_EXAMPLES = (
    "90 (minutes, as sbatch reads it), 30:00, 1:30:00, 2-12 (days-hours), 2-12:30, 1-00:30:00, or 90m, 2h, 1d"
)


def slurm_clock_s(text: str) -> float | None:
    """'MM:SS', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS' as sbatch reads them, in seconds
    rounded up to a whole minute ('1:30' -> 120.0); None for anything else (a bare number too)."""
    if not _SLURM_CLOCK_RE.match(text):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, secs = (parts + [0, 0])[:3]
        seconds = int(days) * 86400 + hours * 3600 + minutes * 60 + secs
    else:  # minutes:seconds, hours:minutes:seconds
        seconds = sum(n * unit for n, unit in zip(reversed(parts), (1, 60, 3600)))
    return float(math.ceil(seconds / 60) * 60)


def parse_slurm_time_s(text: str) -> float:
    """sbatch's --time, read as sbatch reads it: a bare number is minutes ('90' -> 5400.0), the
    clock forms as slurm_clock_s; or gpuq's own '90m', '2h', '1d'. Never through YAML (whose
    base-60 integers read '1:30' as 90). Raises ValueError with the accepted forms; zero and
    UNLIMITED (Slurm's "no limit") too: gpuq has no unlimited, the queue's default applies
    where the option is left out."""
    text = text.strip()
    if text.upper() in ("0", "UNLIMITED", "INFINITE"):
        raise ValueError(
            f"{text!r} (sbatch's \"no limit\") is not one gpuq has; leave the option out for the queue's default "
            "(config time_limit), or give a long one such as 30-0 (30 days)"
        )
    if re.fullmatch(r"\d+", text, re.ASCII):
        seconds = int(text) * 60.0
    else:  # the clock forms, or a number with gpuq's unit (a bare "1.5" is neither: sbatch refuses it)
        try:
            if slurm_clock_s(text) is None and not re.search(r"\d\s*[smhd]$", text):
                raise ValueError(text)
            seconds = parse_duration_s(text)
        except ValueError as e:
            if "100 years" in str(e):  # a time, too long: said as such
                raise
            raise ValueError(f"{text!r} is not a time; write it like {SLURM_TIME_EXAMPLES}") from None
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time; give a positive one, like {SLURM_TIME_EXAMPLES}")
    if not seconds <= MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than 100 years; write it like {SLURM_TIME_EXAMPLES}")
    return float(seconds)


def format_limit(seconds: float) -> str:
    """A duration as a spec writes it, exactly, in its largest whole unit: 5400 -> '90m'."""
    for unit in ("d", "h", "m"):
        if seconds % _SECONDS_PER_UNIT[unit] == 0:
            return f"{int(seconds // _SECONDS_PER_UNIT[unit])}{unit}"
    return f"{seconds:g}s"


def format_clock(seconds: float) -> str:
    """A limit exactly, as Slurm shows one: 88260 -> '1-00:31:00', 5400 -> '01:30:00'."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    sec = f"{secs:02.0f}" if secs == int(secs) else f"{secs:06.3f}".rstrip("0")
    clock = f"{int(hours):02d}:{int(minutes):02d}:{sec}"
    return f"{int(days)}-{clock}" if days else clock


def format_mib(mib: float | int | None) -> str:
    """20480 -> '20GiB'; 1536 -> '1.5GiB'; 700 -> '700MiB'."""
    if mib is None:
        return "-"
    if not _finite(mib):  # a damaged record must not stop `status`
        return "?"
    if abs(mib) < 1024:
        return f"{int(mib)}MiB"
    gib = mib / 1024
    return f"{gib:.0f}GiB" if abs(gib - round(gib)) < 0.05 else f"{gib:.1f}GiB"


def format_duration(seconds: float | None) -> str:
    """65 -> '1m05s'; 3700 -> '1h01m'; None -> '-'."""
    if seconds is None:
        return "-"
    if not _finite(seconds):
        return "?"
    s = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
