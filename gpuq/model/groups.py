"""Job groups as written: the `array:` syntax (Slurm's --array, without %) and the error a bad
group raises."""

from __future__ import annotations

import re

ARRAY_RE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


MAX_ARRAY = 1000


class GroupError(Exception):
    pass


def parse_array(text: str) -> list[int]:
    """'0-9', '1-9:2', '1,4,7', '0-3,10' -> the indices (Slurm's --array syntax, without %)."""
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
