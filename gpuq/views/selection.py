"""The jobs a filter names, for the verbs that act on many (`gpuq cancel --me --state pending`,
`gpuq retry --state failed --name 'sweep-*'`), as scancel's -u/-t/-n select: each job's id,
owner, name and state, read from where that state is kept (jobs/, held/, running/, finished/,
rejected/). Read only: the verb then asks a worker, which checks again who may act on each."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from gpuq.model.errors import SpecError
from gpuq.model.names import name_of, named, natural_order
from gpuq.model.record import RecordError
from gpuq.model.spec import parse_spec_text
from gpuq.model.states import FINAL_STATES, states_named
from gpuq.spool.intake import load_pending_for_view, read_spec_file, user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import read_record, running_records
from gpuq.spool.teamstate import load_heartbeats
from gpuq.views.status import freshest_spec_cache

ENDED = tuple(sorted(s.value for s in FINAL_STATES))
# Which jobs each verb may act on at all; a filter picks among them.
VERB_STATES: dict[str, tuple[str, ...]] = {
    "cancel": ("pending", "held", "running"),
    "hold": ("pending",),
    "release": ("held",),
    "retry": ENDED,
}
# A filter without --state takes these. retry: the failed ones only, as pueue's
# `restart --all-failed` (a Slurm user's `retry --me` requeued 62 jobs, cancelled ones too).
DEFAULT_STATES = {**VERB_STATES, "retry": ("failed",)}


@dataclass(frozen=True)
class JobFilter:
    """Owners, states and names (shell patterns) a verb's jobs must match; None: any."""

    users: frozenset[str] | None
    states: tuple[str, ...]
    names: tuple[str, ...] | None

    def keeps(self, job: Found) -> bool:
        return (
            (self.users is None or job.user in self.users)
            and job.state in self.states
            and named(self.names, job.name, job.id)
        )


@dataclass(frozen=True)
class Found:
    id: str
    user: str
    name: str
    state: str


def states_asked(verb: str, text: str | None) -> tuple[str, ...]:
    """The states `--state` names for `verb` (comma-separated, Slurm's codes too); ValueError
    for one the verb cannot act on."""
    if not text:
        return DEFAULT_STATES[verb]
    named = states_named(text)
    asked = tuple(s for s in named if s in VERB_STATES[verb])
    if wrong := [s for s in named if s not in VERB_STATES[verb] and not (s == "held" and asked)]:
        raise ValueError(
            f"--state {', '.join(wrong)}: {verb} acts on jobs that are {', '.join(VERB_STATES[verb])}; "
            "choose among those"
        )
    return asked


def matching(layout: Layout, wanted: JobFilter) -> list[str]:
    """The ids of the jobs `wanted` keeps, in the order people count them (sw-2 before sw-10)."""
    found = [job.id for job in _jobs(layout, frozenset(wanted.states)) if wanted.keeps(job)]
    return sorted(set(found), key=natural_order)


def _jobs(layout: Layout, states: frozenset[str]) -> Iterator[Found]:
    if "pending" in states:
        hosts = [str(hb.get("host")) for hb in load_heartbeats(layout)]
        pending, _ = load_pending_for_view(layout, freshest_spec_cache(layout, hosts))
        for job in pending:
            yield Found(job.id, job.user, job.spec.name or name_of(job.id), "pending")
    if "held" in states:
        for path in sorted(layout.held.glob("*.yaml")):
            try:
                raw, st = read_spec_file(path, f"held/{path.name}")
                name = parse_spec_text(raw, f"held/{path.name}").name
            except (OSError, SpecError):
                continue
            yield Found(path.stem, user_name(st.st_uid), name or name_of(path.stem), "held")
    if "running" in states:
        for record in running_records(layout):
            yield Found(record.id, record.user, record.spec.get("name") or name_of(record.id), "running")
    if states & set(ENDED) - {"rejected"}:
        for path in sorted(layout.finished.glob("*.json")):
            try:
                ended = read_record(path)
            except (RecordError, ValueError, OSError):
                continue
            if ended is not None and ended.state.value in states:
                yield Found(ended.id, ended.user, ended.spec.get("name") or name_of(ended.id), ended.state.value)
    if "rejected" in states:
        for path in sorted(layout.rejected.glob("*.y*ml")):
            try:
                owner = user_name(os.lstat(path).st_uid)
            except OSError:
                continue
            yield Found(path.stem, owner, name_of(path.stem), "rejected")
