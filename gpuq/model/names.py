"""What a job id and a host name may be: both become file names in every part of the spool, so
both are checked wherever one is read."""

from __future__ import annotations

import re

# Not starting with '.' (a hidden file, `..`). A leading '-' stays allowed: records, specs
# and requests of such ids exist, and a stricter rule would make them unreadable (their jobs
# invisible, their GPUs seemingly free); commands take such an id after `--`.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}\Z")
ID_RULE = "letters, digits, '_', '-' and '.', at most 64, not starting with '.'"

HOST_RE = JOB_ID_RE


def natural_order(job_id: str) -> tuple[tuple[str | int, ...], str]:
    """sw-2 before sw-10, an array's _2 before its _10: the numbers in an id compared as
    numbers (re.split puts text and numbers at alternating places, so two keys never compare
    a number with text), then the id itself (a01 and a1 stay apart)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", job_id)), job_id
