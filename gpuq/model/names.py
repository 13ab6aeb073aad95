"""What a job id and a host name may be: both become file names in every part of the spool, so
both are checked wherever one is read."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

# Not starting with '.' (a hidden file, `..`). A leading '-' stays allowed: records, specs
# and requests of such ids exist, and a stricter rule would make them unreadable (their jobs
# invisible, their GPUs seemingly free); commands take such an id after `--`.
JOB_ID_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}\Z")
ID_RULE = "letters, digits, '_', '-' and '.', at most 64, not starting with '.'"

HOST_RE = JOB_ID_RE

# What joins a refused spec's id to the name it is kept under in state/rejected/ when that is
# not its id's own (`ID+TIME.HEX.yaml`): a character no id has, so that no `gpuq retry` takes
# it for an id (versions before 0.2.1 used a dot: ids of that shape are refused by retry).
KEPT_APART = "+"
KEPT_APART_RE = r"[+.](\d+\.)?[0-9a-f]+"  # after the id: the time and a random part, or only the latter


def natural_order(job_id: str) -> tuple[tuple[str | int, ...], str]:
    """sw-2 before sw-10, an array's _2 before its _10: the numbers in an id compared as
    numbers (re.split puts text and numbers at alternating places, so two keys never compare
    a number with text), then the id itself (a01 and a1 stay apart)."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", job_id)), job_id


def named(patterns: tuple[str, ...] | None, name: str, job_id: str) -> bool:
    """Whether `--name` patterns (shell patterns; None: any) match a job's name or its id:
    `-n 'train-*'` means the ids people see as well as sacct's names."""
    return patterns is None or any(fnmatchcase(name, p) or fnmatchcase(job_id, p) for p in patterns)


def name_of(job_id: str) -> str:
    """A job's name from its id, for events written before they carried it: the id without
    the counter `submit` adds and an array's index (train-12 -> train, sweep-3_4 -> sweep); a
    sweep's member is named by its group (exp-1_lr1e-3 -> exp, never exp-1_lr1e)."""
    group, _, _ = job_id.rpartition("_")
    member = re.fullmatch(r"(.+)-\d+", group)  # submit's <name>-<n>_<member>
    return member.group(1) if member else re.sub(r"(?:[-_]\d+)+$", "", job_id) or job_id
