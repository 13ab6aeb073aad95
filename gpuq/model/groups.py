"""Job groups as written: a spec's `sweep:` and `array:` (Slurm's --array syntax, with %N),
their checks and limits, and the error a bad `--array` raises."""

from __future__ import annotations

import re
from typing import Any

from gpuq.model.errors import SpecError, kind_of
from gpuq.model.spec_fields import FIELDS

ARRAY_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


MAX_ARRAY = 1000


class GroupError(Exception):
    pass


# How a member held back by its array's %N limit is told (spool/eligible.py), and how the
# estimate knows it from other waits (sched/estimate.py): one word, not a text matched twice.
ARRAY_LIMIT_WAIT = "array limit"


def array_limit(text: str) -> int | None:
    """'0-9%2' -> 2: at most that many of the array's jobs run at once (Slurm's %N); None without."""
    _, percent, limit = text.partition("%")
    if not percent:
        return None
    if not limit.strip().isdigit() or int(limit) < 1:
        raise GroupError(f"--array {text!r}: after % give how many may run at once, like 0-9%2")
    return int(limit)


def parse_array(text: str) -> list[int]:
    """'0-9', '1-9:2', '1,4,7', '0-3,10', '0-9%2' -> the indices (Slurm's --array syntax; the
    limit after % is array_limit's)."""
    array_limit(text)  # a bad limit is refused with the indices
    text = text.partition("%")[0]
    out: list[int] = []
    for part in text.split(","):
        m = ARRAY_RE.match(part.strip())
        if not m:
            raise GroupError(f"--array {text!r}: write indices like 0-9, 1-9:2 or 1,4,7")
        start, end, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        if end < start or step < 1:
            raise GroupError(f"--array {text!r}: {part} is empty; write the lower index first")
        span = range(start, end + 1, step)
        if len(out) + len(span) > MAX_ARRAY:  # counted before it is built: 0-99999999999 is a line of text
            raise GroupError(f"--array {text!r} makes {len(out) + len(span)} jobs or more; at most {MAX_ARRAY}")
        out += span
    return sorted(dict.fromkeys(out))


MAX_SWEEP_JOBS = 1000


def check_sweep(value: Any, command: str, file: str) -> tuple[tuple[str, tuple], ...]:
    """A spec's `sweep:` (names to lists of values, each used in `command`, as typed)."""
    if value is None:
        return ()
    example = f"e.g. `sweep: {FIELDS['sweep'].example}` and `{{lr}}` in command"
    if not isinstance(value, dict) or not value:
        raise SpecError(file, "sweep", "must be a mapping of names to lists of values", example)
    total = 1
    for key, values in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise SpecError(file, "sweep", f"{key!r} is not a name", "use names like lr or seed")
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values)
        ):
            raise SpecError(file, "sweep", f"{key}: must be a list of numbers or strings", example)
        if f"{{{key}}}" not in command:
            raise SpecError(
                file, "sweep", f"{key} is not used in command", f"write {{{key}}} in command where its value goes"
            )
        total *= len(values)
    if total > MAX_SWEEP_JOBS:
        raise SpecError(file, "sweep", f"makes {total} jobs", f"keep it to at most {MAX_SWEEP_JOBS} combinations")
    return tuple((k, tuple(v)) for k, v in value.items())


# What a sweep's or an array's members may come to, all together: a worker writes every one
# into jobs/ in one pass (a sweep of 1,000 members of a 75,000-placeholder command was 750 MB
# written as root, and a pass long enough for the other boxes to take the box for dead).
MAX_EXPANDED_BYTES = 4 * 1024 * 1024


def check_expansion(
    data: dict, command: str, sweep: tuple[tuple[str, tuple], ...], array: str | None, file: str
) -> None:
    """Refuse a sweep or array whose members would come to more than MAX_EXPANDED_BYTES."""
    if not sweep and array is None:
        return
    base = len(repr({k: v for k, v in data.items() if k not in ("sweep", "array")}))  # about its YAML's size
    if sweep:
        count, growth = 1, 0
        for key, values in sweep:
            count *= len(values)
            growth += command.count(f"{{{key}}}") * max(0, max(len(str(v)) for v in values) - len(key) - 2)
    else:
        count, growth = len(parse_array(str(array))), 0
    if count * (base + growth) > MAX_EXPANDED_BYTES:
        field_name = "sweep" if sweep else "array"
        raise SpecError(
            file,
            field_name,
            f"its {count} jobs would come to {count * (base + growth) // 1024} KiB of specs, over the "
            f"{MAX_EXPANDED_BYTES // 1024 // 1024} MiB a sweep or array may write",
            "a shorter command (long values belong in a file the command reads), or fewer jobs",
        )


def check_array(value: Any, sweep: Any, file: str) -> str | None:
    """A spec's `array:` as written, once its indices parse."""
    if value is None:
        return None
    if sweep is not None:
        raise SpecError(file, "array", "cannot be combined with sweep", "use one of them")
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise SpecError(file, "array", f'must be indices like "0-9", not {kind_of(value)}', 'write `array: "0-9"`')
    try:
        parse_array(str(value))
    except GroupError as e:
        raise SpecError(
            file, "array", str(e).replace("--array ", ""), "write indices like 0-9, 1-9:2 or 1,4,7"
        ) from None
    return str(value)
