"""Dependencies between jobs. `after: [a, b]` starts a job once each of a and b has
succeeded; if one ends any other way (failed, cancelled, timeout, lost, rejected) the job
is cancelled with that reason, and so on down a chain (Slurm's afterok with
kill_invalid_depend). `after_any: [c]` starts it once c has ended, whatever the result.
A sweep's or an array's id stands for all its members.

A dependency is met only by a job of the dependent's own owner, or by one that took its
place in the queue before the dependent did (the job that had the id when the dependent was
accepted): a member who drops a file under the id of someone's missing dependency does not
release their job (security review 2026-12-05); the dependent waits, saying whose it is.

`gate` is pure; `DependencyStates` reads the states from the spool at the edge."""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from gpuq.host.files import read_json
from gpuq.model.jobs import PendingJob
from gpuq.model.spec import JobSpec
from gpuq.spool.eligible import limited_groups, not_yet
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import claims_of, pending_spec_path
from gpuq.spool.sweeps import being_expanded, kept_spec, read_group

FINAL = frozenset({"done", "failed", "cancelled", "timeout", "lost", "rejected"})
UNKNOWN = "unknown"


Origin = tuple[str, float]  # a job's owner (user name) and its place in the queue


def gate(
    spec: JobSpec,
    states: Mapping[str, str],
    origins: Mapping[str, Origin] | None = None,
    user: str | None = None,
    queued_at: float | None = None,
) -> tuple[str | None, str | None]:
    """(why it must wait, why it can never start), either or both None. With `origins`, a
    dependency of another owner than `user` that came into the queue after `queued_at` is not
    the job depended on: as good as unknown."""
    if origins and user is not None and queued_at is not None:
        mine = {*spec.after, *spec.after_any}  # only this job's: never a list of everyone's later jobs
        foreign = {d for d in mine if d in origins and origins[d][0] != user and origins[d][1] > queued_at}
        if foreign:
            states = {d: (UNKNOWN if d in foreign else s) for d, s in states.items()}
            waits, doom = gate(spec, states)
            named = ", ".join(f"{d} is {origins[d][0]}'s, queued after this one" for d in sorted(foreign))
            return (f"{waits} ({named})" if waits else None), doom
    for dep in spec.after:
        state = states.get(dep, UNKNOWN)
        if state in FINAL and state != "done":
            return None, f"dependency {dep} ended {state}"
    waiting = [d for d in spec.after if states.get(d, UNKNOWN) != "done"]
    waiting += [d for d in spec.after_any if states.get(d, UNKNOWN) not in FINAL and d not in waiting]
    if not waiting:
        return None, None
    unknown = [d for d in waiting if states.get(d, UNKNOWN) == UNKNOWN]
    return (
        "waiting for " + ", ".join(waiting) + (f" ({', '.join(unknown)}: no such job yet)" if unknown else "")
    ), None


def group_state(member_states: list[str]) -> str:
    """A sweep or array as a dependency (Slurm's afterok on an array job): done once every
    member is; ended as its first member that ended otherwise, once all have ended."""
    if any(s not in FINAL for s in member_states):
        return "running"
    return next((s for s in member_states if s != "done"), "done")


def referenced(specs: Iterable[JobSpec]) -> set[str]:
    return {d for spec in specs for d in (*spec.after, *spec.after_any)}


class DependencyStates:
    """The state of each job some pending job depends on: finished (the record's state,
    re-read only when its file changes), running, pending or held, or unknown."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._finished: dict[str, tuple[tuple[int, int], str]] = {}

    def lookup(self, ids: Iterable[str]) -> dict[str, str]:
        return {job_id: self._state(job_id) for job_id in ids}

    def origins(self, ids: Iterable[str]) -> dict[str, Origin]:
        """Whose each job is and when it took its place in the queue, where the spool says:
        its record (finished, running, held), else its pending spec file."""
        found: dict[str, Origin] = {}
        for job_id in ids:
            for directory in (self.layout.finished, self.layout.running, self.layout.held):
                record = _read(self.layout.record(directory, job_id))
                if isinstance(record, dict) and isinstance(record.get("queued_at"), (int, float)):
                    found[job_id] = (str(record.get("user", "")), float(record["queued_at"]))
                    break
            else:
                group = read_group(self.layout, job_id)
                path = pending_spec_path(self.layout, job_id) or (kept_spec(self.layout, job_id) if group else None)
                try:
                    st = os.lstat(path) if path is not None else None
                except OSError:
                    st = None
                if st is not None:
                    found[job_id] = (user_name(st.st_uid), st.st_ctime)
        return found

    def _state(self, job_id: str) -> str:
        path = self.layout.record(self.layout.finished, job_id)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._finished.pop(job_id, None)
        else:
            key = (st.st_ino, st.st_mtime_ns)
            cached = self._finished.get(job_id)
            if cached and cached[0] == key:
                return cached[1]
            record = read_json(path)
            if record is not None:
                self._finished[job_id] = (key, record["state"])
                return record["state"]
        if self.layout.record(self.layout.running, job_id).exists() or claims_of(self.layout, job_id):
            return "running"
        if pending_spec_path(self.layout, job_id) is not None or (self.layout.held / f"{job_id}.yaml").exists():
            return "pending"
        group = read_group(self.layout, job_id)
        if group is not None:
            return group_state([self._state(m) for m in group["members"]])
        return "pending" if kept_spec(self.layout, job_id).exists() else UNKNOWN  # being expanded


def _read(path) -> object:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def gates(
    pending: Iterable[PendingJob], states: DependencyStates, now: float, running: Iterable[str] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """For PendingJobs: ({id: why it waits}, {id: why it can never start}). A sweep spec
    waits too: it is never run itself (spool/sweeps.py); so do jobs before their begin time
    and an array's members over its limit, given the ids that run (spool/eligible.py)."""
    with_deps = [j for j in pending if j.gated]
    if not with_deps:
        return {}, {}
    groups, writing, expanding = {}, [], None
    for g in limited_groups(with_deps):
        if rec := read_group(states.layout, g):
            groups[g] = frozenset(rec["members"])
            continue
        if expanding is None:  # taken out of jobs/ lately, their records not yet written (a stranded one is not)
            expanding = set(being_expanded(states.layout, now))
        if g in expanding:
            writing.append(g)
    held_back = not_yet(with_deps, now, running, groups, writing)
    ids = referenced(j.spec for j in with_deps)
    known = states.lookup(ids)
    origins = states.origins(ids)
    waiting, doomed = {}, {}
    for job in with_deps:
        if job.spec.sweep or job.spec.array:  # never run itself: a worker turns it into its member jobs
            kind = "an array" if job.spec.array else "a sweep"
            waiting[job.id] = f"{kind}: the next worker pass turns it into its jobs"
            continue
        wait, doom = gate(job.spec, known, origins, job.user, job.queued_at)
        if doom:
            doomed[job.id] = doom
        elif wait or job.id in held_back:
            waiting[job.id] = wait or held_back[job.id]
    return waiting, doomed
