"""Sweeps and arrays: one submission, many jobs, handled as a group.

- A spec with `sweep: {lr: [1e-3, 3e-4], seed: [1, 2, 3]}` becomes one job per combination,
  `{lr}` and `{seed}` in its command replaced by the values, with readable ids
  `<id>_lr1e-3-seed1` (or `<id>_<n>` where that would not be a valid id).
- `array: 0-9` (what `gpuq submit --array 0-9` writes) makes `<id>_0` ... `<id>_9`, each with
  `GPUQ_ARRAY_INDEX`.
Every member gets `GPUQ_GROUP` (the group's id). The members are written into jobs/ with the
group's owner at the group's place in the queue (kept in state/places/: the spec's ctime, which
no member can set); state/groups/<id>.json lists
them, so `gpuq show ID` and `gpuq cancel ID` act on the whole group.

A sweep or array spec dropped into jobs/ is expanded by the worker that reads it: it takes the file by
rename into state/groups/ (one worker wins), writes the members (never over an existing
file), then the group record. A crash in between is finished at the worker's next start.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

import yaml

from gpuq.host.files import create_owned, read_json, write_json
from gpuq.model.groups import GroupError, array_limit, parse_array
from gpuq.model.names import JOB_ID_RE
from gpuq.spool.ids import reserve
from gpuq.spool.intake import read_spec_file, user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import keep_place, kept_place, put_back, unclaim


def _slug(value: object) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "", str(value))


def _substitute(command: str | list[str], values: dict[str, object]) -> str | list[str]:
    def one(text: str) -> str:
        for key, value in values.items():
            text = text.replace(f"{{{key}}}", str(value))
        return text

    return one(command) if isinstance(command, str) else [one(a) for a in command]


def sweep_members(data: dict[str, Any], group: str) -> list[tuple[str, dict[str, Any]]]:
    """(member id, member spec data) for every combination of a validated sweep spec."""
    keys = list(data["sweep"])
    combos = list(itertools.product(*(data["sweep"][k] for k in keys)))
    base = {k: v for k, v in data.items() if k != "sweep"}
    readable = [f"{group}_" + "-".join(f"{k}{_slug(v)}" for k, v in zip(keys, combo)) for combo in combos]
    if len(set(readable)) != len(readable) or not all(JOB_ID_RE.match(i) for i in readable):
        readable = [f"{group}_{n}" for n in range(len(combos))]
    members = []
    for member_id, combo in zip(readable, combos):
        values = dict(zip(keys, combo))
        env = {
            **(base.get("env") or {}),
            "GPUQ_GROUP": group,
            **{f"GPUQ_SWEEP_{k.upper()}": str(v) for k, v in values.items()},
        }
        members.append((member_id, {**base, "command": _substitute(base["command"], values), "env": env}))
    return _checked(members, group)


# A command given as words runs without a shell: the index, written as a variable in a word
# (`-- python train.py --seed \$GPUQ_ARRAY_INDEX`), is put in by the expansion instead.
_INDEX_WORD = re.compile(r"\$(?:\{(GPUQ_ARRAY_INDEX|SLURM_ARRAY_TASK_ID)\}|(GPUQ_ARRAY_INDEX|SLURM_ARRAY_TASK_ID)\b)")


def array_members(data: dict[str, Any], group: str, indices: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """One member per index, with its index in GPUQ_ARRAY_INDEX and in Slurm's array variables
    (a ported array script reads SLURM_ARRAY_TASK_ID; no other SLURM_ variable is set, so
    frameworks that detect Slurm by them do not think they run under it)."""
    span = {
        "SLURM_ARRAY_TASK_COUNT": str(len(indices)),
        "SLURM_ARRAY_TASK_MIN": str(min(indices, default=0)),
        "SLURM_ARRAY_TASK_MAX": str(max(indices, default=0)),
    }
    members = []
    for i in indices:
        command = data.get("command")
        if isinstance(command, list):  # (not in the code after -c: a shell script reads its variables itself)
            command = [
                _INDEX_WORD.sub(str(i), word) if isinstance(word, str) and (n == 0 or command[n - 1] != "-c") else word
                for n, word in enumerate(command)
            ]
        index = {"GPUQ_ARRAY_INDEX": str(i), "SLURM_ARRAY_TASK_ID": str(i)}
        env = {**(data.get("env") or {}), "GPUQ_GROUP": group, **index, **span}
        members.append((f"{group}_{i}", {**data, "command": command, "env": env}))
    return _checked(members, group)


def _checked(members: list[tuple[str, dict]], group: str) -> list[tuple[str, dict]]:
    if not all(JOB_ID_RE.match(i) for i, _ in members):
        raise GroupError(
            f"{group}: too long for its members' ids (<id>_<n>, at most 64 characters); use a shorter name"
        )
    return members


def group_file(layout: Layout, group: str) -> Path:
    return layout.groups / f"{group}.json"


def kept_spec(layout: Layout, group: str) -> Path:
    """Where a sweep's spec is kept once a worker took it out of jobs/: there before the
    group record is written, so it marks a group being expanded."""
    return layout.groups / f"{group}.yaml"


def place_members(
    layout: Layout, group: str, kind: str, members: list[tuple[str, dict]], uid: int, place: float
) -> list[str]:
    """The worker's part: write each member into jobs/ (owned by `uid`, at `place`: the
    group's queue place), then the group record. A member id another user's file has taken
    is left out (listed as skipped): the group never stands for someone else's job. Each member
    is made in state/groups/, where only the worker's account writes, and linked into jobs/:
    nothing a member planted in jobs/ is ever written through. Returns the member ids."""
    placed = []
    for member_id, data in members:
        # The group's place, kept before the member is in jobs/ (a scan between would take its
        # ctime, now): only for this owner's file (store.kept_place checks the uid).
        keep_place(layout, member_id, uid, place)
        text = f"# member of {kind} {group}\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        tmp = create_owned(
            layout.groups, member_id, text.encode(), uid, mode=0o640, mtime_ns=int(place * 1e9)
        )  # as submit writes it
        if not unclaim(tmp, layout.jobs / f"{member_id}.yaml"):
            tmp.unlink()  # already there: ours after a crash and this again, or someone else's file
            try:
                if os.lstat(layout.jobs / f"{member_id}.yaml").st_uid != uid:
                    continue
            except FileNotFoundError:
                continue
        placed.append(member_id)
        # The worker made this job: its id is the group's owner's (spool/ids.py). Not synced: a
        # member waiting in jobs/ keeps its id taken all the same (and its claim reserves it).
        reserve(layout, member_id, uid, durable=False)
    write_json(
        group_file(layout, group),
        {
            "id": group,
            "kind": kind,
            "members": placed,
            "uid": uid,
            "queued_at": place,
            "skipped": [i for i, _ in members if i not in placed],
        },
    )
    return placed


def read_group(layout: Layout, group: str) -> dict[str, Any] | None:
    """The group record, None when there is none (or the id is not one, or the file is not
    a group record gpuq wrote)."""
    if not JOB_ID_RE.match(group):
        return None
    try:
        data = read_json(group_file(layout, group))
    except (ValueError, OSError):
        return None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("members"), list)
        or not all(isinstance(m, str) and JOB_ID_RE.match(m) for m in data["members"])
    ):
        return None
    return data


def group_members(data: dict[str, Any], group: str) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(kind, members) of a validated sweep or array spec's data."""
    if data.get("array") is not None:
        base = {k: v for k, v in data.items() if k != "array"}
        if (limit := array_limit(str(data["array"]))) is not None:
            base["array_limit"] = limit  # each member knows how many of its array may run at once
        return "array", array_members(base, group, parse_array(str(data["array"])))
    return "sweep", sweep_members(data, group)


def expand_dropped_sweep(layout: Layout, spec_path: Path, group: str, data: dict[str, Any]) -> list[str] | None:
    """The worker's part: take the sweep (or array) spec out of jobs/, reserve its id, and put
    its members in. None: another worker took it first."""
    kept = kept_spec(layout, group)
    # The id is reserved before the spec leaves jobs/ (spool/ids.py), as a claim's is: at no
    # moment is it free, so `submit --after GROUP` never finds "no such job" mid-expansion.
    try:
        first = os.lstat(spec_path)
    except FileNotFoundError:
        return None
    owner = first.st_uid
    # Its place in the queue, as intake gave it (the file's ctime, which no member can set, or
    # the place kept for it): the members take that place, not the moment they were written.
    kept_at = kept_place(layout, group, owner)
    place = first.st_ctime if kept_at is None else min(kept_at, first.st_ctime)
    if (holder := reserve(layout, group, owner)) not in (owner, None):  # another's id: not that group
        raise GroupError(f"job id '{group}' belongs to {user_name(holder)}'s job; rename the file (e.g. {group}-2)")
    try:
        os.rename(spec_path, kept)
    except FileNotFoundError:
        return None
    st = os.lstat(kept)  # the moved file: its owner is whom the members run as
    if st.st_uid != owner:  # replaced since the look (only its owner or root can, in a sticky jobs/)
        put_back(layout, kept, spec_path, group)
        raise GroupError(f"job id '{group}' belongs to {user_name(owner)}'s job; rename the file (e.g. {group}-2)")
    kind, members = group_members(data, group)
    return place_members(layout, group, kind, members, st.st_uid, place)


EXPANDING_S = 30.0  # a worker writes a group's members in well under this; a kept spec older is stranded


def being_expanded(layout: Layout, now: float) -> list[str]:
    """The sweeps and arrays a worker is writing the members of now (taken out of jobs/ in the
    last EXPANDING_S, by the rename that set the kept spec's ctime, and no group record yet):
    a listing of jobs/ meanwhile sees only some of their members. One left by a worker that
    died or refused it mid-way is not being written (its next start finishes or reports it)."""
    if not layout.groups.is_dir():
        return []
    found = []
    for kept in layout.groups.glob("*.yaml"):
        try:
            moved_at = os.lstat(kept).st_ctime
        except OSError:
            continue
        fresh = now - EXPANDING_S <= moved_at <= now + EXPANDING_S  # (a clock far off: not waited for)
        if fresh and JOB_ID_RE.match(kept.stem) and not group_file(layout, kept.stem).exists():
            found.append(kept.stem)
    return sorted(found)


def finish_interrupted(layout: Layout, load_yaml, on_error=None) -> list[str]:
    """Sweeps taken out of jobs/ whose group record was never written: write their members
    again (those already there are kept). Run at worker start. One that cannot be read is
    reported through `on_error(group, why)` and left alone: it never stops the worker."""
    done = []
    for kept in sorted(layout.groups.glob("*.yaml")) if layout.groups.is_dir() else []:
        group = kept.stem
        if not JOB_ID_RE.match(group) or group_file(layout, group).exists():
            continue
        try:
            raw, st = read_spec_file(kept, f"state/groups/{kept.name}")
            kind, members = group_members(load_yaml(raw, f"state/groups/{kept.name}"), group)
            place_members(layout, group, kind, members, st.st_uid, st.st_ctime)  # (never a member's mtime)
        except Exception as e:  # noqa: BLE001 - any bad file is reported, never fatal
            if on_error is not None:
                on_error(group, str(e))
            continue
        done.append(group)
    return done
