"""When a pending job may be considered at all, before any placement: not before its `begin`
time (sbatch's --begin), and not while its array already runs as many jobs as `%N` allows
(sbatch's --array 0-9%2). Pure: the caller hands in now and the ids that run.

An array's members are those its group record lists (state/groups/, written by the worker that
expanded it: never a file someone else dropped under <group>_<n>); of those waiting, the lowest
indices are let through, so that every worker lets the same ones through and two boxes never
start two different members for the same free place."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Iterable, Mapping

from gpuq.model.groups import ARRAY_LIMIT_WAIT
from gpuq.model.jobs import PendingJob


def not_yet(
    pending: Iterable[PendingJob],
    now: float,
    running: Iterable[str],
    groups: Mapping[str, frozenset[str]],
    being_written: Iterable[str] = (),
) -> dict[str, str]:
    """{id: why it may not start yet} for the jobs held back by their begin time or their
    array's limit. `groups`: each array's members, as its record lists them (limited_groups).
    `being_written`: arrays a worker is writing now, members first, then the record: until it
    is there none of their members starts (another box started three of a %2 array's members
    at once, in the moment before the record said they were its members)."""
    waiting: dict[str, str] = {}
    limited: dict[str, list[PendingJob]] = defaultdict(list)
    writing = set(being_written)
    for job in pending:
        if job.spec.begin_at is not None and job.spec.begin_at > now:
            waiting[job.id] = f"begins at {_moment(job.spec.begin_at, now)} (--begin)"
        elif job.spec.array_limit is not None and _group(job.id) in writing:
            waiting[job.id] = f"{ARRAY_LIMIT_WAIT}: {_group(job.id)} is being written; its members start a pass later"
        elif job.spec.array_limit is not None and job.id in groups.get(_group(job.id), ()):
            limited[_group(job.id)].append(job)
    if not limited:
        return waiting
    runs: dict[str, int] = defaultdict(int)
    for job_id in running:
        if job_id in groups.get(_group(job_id), ()):
            runs[_group(job_id)] += 1
    for group, members in limited.items():
        limit = min(m.spec.array_limit or 1 for m in members)
        members.sort(key=lambda m: _index(m.id))
        free = max(0, limit - runs[group])
        # The places left go to the lowest indices: the others say which (a member read "0 of
        # arr-1 running, at most 1 at once" as a contradiction).
        first = [m.id for m in members[:free]]
        before = f"; {', '.join(first[:3])}{' ...' if len(first) > 3 else ''} first" if first else ""
        for member in members[free:]:
            waiting[member.id] = (
                f"{ARRAY_LIMIT_WAIT}: {runs[group]} of {group} running, at most {limit} at once (%{limit}){before}"
            )
    return waiting


def limited_groups(pending: Iterable[PendingJob]) -> set[str]:
    """The arrays whose members' limit is asked (their records are read for not_yet)."""
    return {_group(job.id) for job in pending if job.spec.array_limit is not None}


def _group(job_id: str) -> str:
    return job_id.rpartition("_")[0] or job_id


def _index(job_id: str) -> tuple[int, str]:
    index = job_id.rpartition("_")[2]
    return (int(index), job_id) if index.isdigit() else (1 << 30, job_id)


def _moment(t: float, now: float) -> str:
    """16:00 today, else the day too (a time no clock can show, as a number: never a crash)."""
    try:
        same_day = time.localtime(t)[:3] == time.localtime(now)[:3]
        return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return f"{t:.0f}"
