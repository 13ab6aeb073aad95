"""`gpuq submit`: write a spec into jobs/ under a unique, readable id.

Like sbatch's default (--export=ALL) the submitter's environment and working directory are
recorded, so the job sees what the user saw, except for variables that look like secrets:
a spec and its record are readable by the whole team, so a secret is stored only when the
submitter names it (`--export ALL,HF_TOKEN`), and submit says which ones it left out. The user
is the spec file's owner (the file system records it; a field could be forged).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import secrets
import stat
import time
import types
from pathlib import Path
from typing import Any, Iterator

import yaml

from gpuq.host.faults import io_fault
from gpuq.host.owners import OwnerPolicy, uids_of, writable_by_others
from gpuq.model.errors import MAX_SPEC_BYTES, SpecError
from gpuq.model.names import ID_RULE, JOB_ID_RE
from gpuq.model.secrets import looks_secret
from gpuq.model.spec import JobSpec, parse_spec_text, validate_spec
from gpuq.spool.deps import FINAL, DependencyStates
from gpuq.spool.ids import held_for, id_taken
from gpuq.spool.intake import user_name
from gpuq.spool.layout import Layout
from gpuq.spool.store import pending_spec_path

# Per-shell or per-session variables that would be wrong inside the job (the agent socket and
# the desktop session end with the login; a job outlives it).
NOT_EXPORTED = (
    "CUDA_VISIBLE_DEVICES",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "DBUS_SESSION_BUS_ADDRESS",
    "DESKTOP_SESSION",
    "SESSION_MANAGER",
)
# CUDA_MPS_*: a job submitted from inside an MPS job would join that job's daemon, or keep its limits.
NOT_EXPORTED_PREFIXES = ("GPUQ_", "XDG_SESSION_", "CUDA_MPS_")


class SubmitError(Exception):
    pass


def exported_environment(export: str | None = None, isolated: bool = False) -> tuple[dict[str, str], list[str]]:
    """The submitter's variables a job records, as sbatch's --export: `ALL` (the default on
    the host), `NONE` (the default for a job `isolated` from the host's environment, as in a
    container, whose image's PATH and libraries the host's would hide), or `NAME,...` (only
    those), each followed by any `NAME=VALUE` to set.
    `ALL` leaves out what looks like a secret (looks_secret) unless it is named too
    (`ALL,HF_TOKEN`). Returns (the variables, the names left out as secrets)."""
    items = [i for i in (export or ("NONE" if isolated else "ALL")).split(",") if i]
    if not items:
        raise SubmitError("--export: give ALL, NONE, or variable names, e.g. --export ALL,WANDB_API_KEY,SEED=3")
    mode = items[0] if items[0] in ("ALL", "NONE") else "NAMES"
    everything = (
        {k: v for k, v in os.environ.items() if k not in NOT_EXPORTED and not k.startswith(NOT_EXPORTED_PREFIXES)}
        if mode == "ALL"
        else {}
    )
    env = {k: v for k, v in everything.items() if not looks_secret(k, v)}
    for item in items[1:] if mode != "NAMES" else items:
        name, sep, value = item.partition("=")
        if not name or not (name[0].isalpha() or name[0] == "_") or not name.replace("_", "a").isalnum():
            raise SubmitError(f"--export: {item!r} is not a variable name or NAME=VALUE")
        if sep:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env, sorted(k for k in everything if k not in env)


def withheld_note(names: list[str]) -> str:
    """What submit says on stderr about the secrets it did not store."""
    listed = ",".join(names)
    return (
        f"gpuq submit: left out {', '.join(names)}: {'it looks' if len(names) == 1 else 'they look'} "
        "like secrets, and a spec and its record are readable by your team. The job runs as you: "
        "keep secrets in a file only you can read and load it with --setup '. ~/.secrets.env', "
        f"or store them in the spec anyway (readable by the team; `gpuq show` masks them) with "
        f"--export ALL,{listed}"
    )


def check_size(text: bytes, env: dict[str, str]) -> None:
    """A spec over the cap is almost always a huge exported environment: say so, and how to
    record less (the parser's own message would only say that a spec is a few lines)."""
    if len(text) <= MAX_SPEC_BYTES:
        return
    biggest = sorted(env, key=lambda k: len(env[k]), reverse=True)[:3]
    raise SubmitError(
        f"the spec would be {len(text)} bytes, over the {MAX_SPEC_BYTES} cap; its env (your exported "
        f"variables) holds {sum(len(k) + len(v) for k, v in env.items())} bytes"
        + (f", the largest {', '.join(biggest)}" if biggest else "")
        + ". Fix: record only what the job needs, e.g. --export NONE or --export PATH,HOME,NAME... "
        "Nothing was written."
    )


def readable_base(command: list[str], name: str | None) -> str:
    """A short id stem from --name (`train/v2` -> `train-v2`) or the command: `python
    train.py` -> `train`."""
    source = name or _program_word(command)
    stem = re.sub(r"[^A-Za-z0-9_-]+", "-", source).strip("-_")[:40]
    return stem or "job"


def _program_word(command: list[str]) -> str:
    """The name in a command: its script or program, past interpreters and flags, as a stem
    (`/bin/bash /home/ana/train.sh` -> `train`); `python -c CODE` -> `python` (code is no name)."""
    interpreters = {"bash", "sh", "torchrun", "uv", "run"}
    source = "job"
    for word in " ".join(command).split():
        if word == "-c" and source.startswith("python"):
            return source
        if not word.startswith("-"):
            program = Path(word).name  # `/usr/bin/python3.11` is python3.11, never its stem python3
            source = Path(word).stem if "/" in word or "." in word else word
            if program not in interpreters and not re.fullmatch(r"python[\d.]*", program):
                return source
            source = program
    return "job"


def check_runnable_by_workers(
    layout: Layout, run_for_users: tuple[str, ...], allow_root: bool, admins: tuple[str, ...] = (), spec: Any = None
) -> None:
    """Refuse, before writing, a spec the workers would refuse for its owner (this user): root
    without allow_root_jobs, a user a non-root worker does not run for, a rank above normal
    from someone who is not an admin. The workers' account is the owner of state/, as the
    workers require."""
    jobs_mode = os.stat(layout.jobs).st_mode
    workers = os.stat(layout.state).st_uid
    # A team root (jobs/ others write) is served by root parts that run jobs as their owners.
    policy = OwnerPolicy.for_worker(jobs_mode, run_for_users, allow_root, writable_by_others(jobs_mode), admins)
    admitted = uids_of(admins) | {0, workers}  # the workers', not this user's (who may be anyone)
    policy = dataclasses.replace(policy, worker_uid=workers, shared_root=False, admins=admitted)
    try:  # the file submit writes: this user's, 0640
        policy.check(types.SimpleNamespace(st_uid=os.geteuid(), st_mode=stat.S_IFREG | 0o640), "gpuq submit")
        if spec is not None:
            policy.check_rank(os.geteuid(), spec.priority_class, spec.priority, "gpuq submit")
    except SpecError as e:
        raise SubmitError(
            f"this job would be refused by the workers: {e.problem.replace('is owned', 'would be owned')}. "
            f"Fix: {e.fix}. Nothing was written."
        ) from None


def check_dependencies(layout: Layout, spec: JobSpec, as_fields: bool = False) -> None:
    """Refuse ids no job has (a typo would leave the job waiting for ever), and an afterok on
    a job that already ended otherwise than done (its worker would cancel the job at once).
    `as_fields`: named as the spec's fields (`gpuq edit`), not submit's options."""
    after, after_any = (
        ("field 'after'", "field 'after_any'") if as_fields else ("--after (afterok)", "--after-any (afterany)")
    )
    for option, ids in ((after, spec.after), (after_any, spec.after_any)):
        unknown = [d for d in ids if not id_taken(layout, d)]
        if unknown:
            raise SubmitError(
                f"{option} {', '.join(unknown)}: no such job. Fix: give ids that "
                "`gpuq status` or `gpuq submit` showed. Nothing was written."
            )
    states = DependencyStates(layout).lookup(spec.after)
    if failed := [f"{d} ended {state}" for d, state in states.items() if state in FINAL and state != "done"]:
        raise SubmitError(
            f"{after} {', '.join(failed)}: this job could never start (its worker would cancel it). "
            f"Fix: `gpuq retry` that job first, or use {'after_any' if as_fields else '--after-any'}. "
            "Nothing was written."
        )


def spec_bytes(data: dict[str, Any]) -> bytes:
    """The spec file submit writes for `data`."""
    header = f"# submitted by gpuq submit at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    return (header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)).encode()


def checked_spec_text(layout: Layout, data: dict[str, Any]) -> bytes:
    """The spec file for `data`, refused before anything is written as a worker would refuse it."""
    check_dependencies(layout, validate_spec(data, "gpuq submit", new=True))
    text = spec_bytes(data)
    check_size(text, data.get("env") or {})
    parse_spec_text(text, "gpuq submit", new=True)  # what the worker will read back
    return text


def write_spec(layout: Layout, data: dict[str, Any], job_id: str | None, base: str) -> str:
    """Validate, then create jobs/<id>.yaml without ever overwriting: the final name is
    made with link(2), which fails if the name exists, so concurrent submits cannot collide."""
    return place_spec(layout, checked_spec_text(layout, data), job_id, base)


def _candidate_ids(job_id: str | None, base: str) -> Iterator[str]:
    if job_id is not None and not JOB_ID_RE.match(job_id):
        raise SubmitError(f"--id {job_id!r}: ids are {ID_RULE}")
    yield from [job_id] if job_id else (f"{base}-{n}" for n in range(1, 100000))


def _id_used(layout: Layout, job_id: str) -> SubmitError:
    holder = held_for(layout, job_id)  # an id reserved; else a spec waiting in jobs/ no worker has read
    if holder is None and (spec := pending_spec_path(layout, job_id)) is not None:
        try:
            holder = os.lstat(spec).st_uid
        except OSError:
            pass
    me = os.geteuid()
    if holder is not None and me not in (holder, 0, _state_owner(layout)):  # retry and release are not a member's
        return SubmitError(f"job id {job_id!r} is {user_name(holder)}'s job. Fix: pick another --id")
    return SubmitError(
        f"job id {job_id!r} is already used (a job's record and log keep its id). Fix: pick "
        f"another --id, or run that job again with `gpuq retry {job_id}` once it has ended "
        f"(`gpuq release {job_id}` if it is held)"
    )


def _state_owner(layout: Layout) -> int | None:
    try:
        return os.stat(layout.state).st_uid
    except OSError:
        return None


def free_id(layout: Layout, job_id: str | None, base: str) -> str:
    """An id no job has now, for `submit --hold` (whose request creates the spec: the worker
    checks again then, and refuses it if another job took the id meanwhile)."""
    for candidate in _candidate_ids(job_id, base):
        if not id_taken(layout, candidate):
            return candidate
        if job_id:
            raise _id_used(layout, job_id)
    raise SubmitError("no free job id")


def _cannot_write(layout: Layout, e: OSError) -> SubmitError:
    """One line for a spec that could not be written: a full disk or a quota says so."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return SubmitError(
            f"the queue's disk is full ({e.strerror}): {layout.jobs} cannot take the spec. Fix: ask an admin to "
            "free space there (old logs/ of finished jobs are the usual bulk), then submit again. Nothing was written."
        )
    return SubmitError(f"cannot write a spec into {layout.jobs}: {e.strerror or e}. Nothing was written.")


def place_spec(layout: Layout, text: bytes, job_id: str | None, base: str) -> str:
    """Create jobs/<id>.yaml holding `text`, already checked as the worker would."""
    candidates = _candidate_ids(job_id, base)
    tmp = layout.jobs / f".submit-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)  # it may hold secrets
    except PermissionError:
        raise  # the spool's modes: the CLI says who may write (cli/__init__.py)
    except OSError as e:  # no inode left: a full disk too
        raise _cannot_write(layout, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            io_fault("write:submit")
            f.write(text)
    except OSError as e:  # a full disk, a quota: nothing half-written stays behind
        tmp.unlink(missing_ok=True)
        raise _cannot_write(layout, e) from None
    try:
        for candidate in candidates:
            if id_taken(layout, candidate):
                if job_id:
                    raise _id_used(layout, job_id)
                continue
            try:
                os.link(tmp, layout.jobs / f"{candidate}.yaml")
                return candidate
            except FileExistsError:
                if job_id:
                    raise _id_used(layout, job_id) from None
        raise SubmitError("no free job id")
    finally:
        tmp.unlink(missing_ok=True)
