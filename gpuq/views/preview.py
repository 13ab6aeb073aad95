"""What a job will see, for `gpuq show`: the command line its supervisor starts (after its
venv/conda/setup prelude, through a launch wrapper such as its container's runtime), as whom, where, and its
environment. Built by the very function the supervisor uses (launch.build_launch), so the
preview cannot drift from what runs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from gpuq.host.owners import Identity
from gpuq.model.config import Config, extras_settings
from gpuq.model.record import Record
from gpuq.model.secrets import MASK, looks_secret
from gpuq.model.spec import JobSpec
from gpuq.model.states import State
from gpuq.run.joblocal import Runtime
from gpuq.run.launch import CannotStart, Launch, build_launch, job_variables
from gpuq.spool.layout import Layout
from gpuq.spool.store import next_attempt, resumes_preempted


def what_the_job_sees(
    layout: Layout,
    config: Config,
    job_id: str,
    spec: JobSpec,
    record: Record | None,
    owner_uid: int | None,
    previous: dict | None = None,
) -> dict[str, Any]:
    """For a started job, its record's GPUs, host and attempt; for a pending one, GPUs 0..n-1
    stand for the GPUs it will be granted, and the attempt it waits to run is the one after
    `previous` (its last attempt's record, kept in requeued/ while it waits again). Secret-looking
    values are masked."""
    pending = record is None
    if record is None:
        record = Record(
            id=job_id,
            state=State.RUNNING,
            spec=spec.to_json(),
            gpus=list(range(spec.gpus)),
            gpu_mem_mib=spec.gpu_mem_mib,
            attempt=next_attempt(previous),
            preempted=resumes_preempted(previous),
        )
    rt = Runtime(
        layout,
        record.host or "<host>",
        "",
        Path("/"),
        config.grace_s,
        config.lost_after_s,
        {},
        config.allow_root_jobs,
        extras_settings(config),
    )
    try:
        identity = Identity.of(owner_uid) if owner_uid is not None and owner_uid >= 0 else None
    except KeyError:
        identity = None
    cannot: str | None = None
    try:
        launch = build_launch(rt, record, spec, identity, preview=True)
    except CannotStart as e:  # a spec field whose extra is gone, an option this runtime refuses
        launch = Launch([], {}, spec.workdir or str(layout.root), identity)
        cannot = str(e)
    if launch.wrapped is not None:  # what the wrapper says the job sees (a container's env file)
        seen, base = launch.wrapped.seen, launch.wrapped.seen_from
    else:
        seen = {**job_variables(rt, record, spec), **(identity.environment() if identity else {})}
        base = (
            "under a root worker, a clean login environment (the owner's HOME, USER, LOGNAME, SHELL, "
            "PATH=/usr/local/bin:/usr/bin:/bin, the locale); under a user's own worker, that worker's "
            "environment; then these (a spec written by `gpuq submit` carries the exported variables in env)"
        )
    if pending and spec.exclusive and "GPUQ_GPU_MEM_MIB" in seen:
        seen["GPUQ_GPU_MEM_MIB"] = "<its GPU's usable MiB>"  # a whole GPU's: known once placed (not 0)
    return {
        "argv": launch.argv,
        "command_line": shlex.join(launch.argv) if cannot is None else f"(cannot start: {cannot})",
        "workdir": launch.cwd,
        "as_user": identity.name if identity else None,
        "runtime": launch.wrapped.label if launch.wrapped else None,
        "env": {k: MASK if looks_secret(k, v) else v for k, v in sorted(seen.items())},
        "env_base": base,
        "gpus_shown": "placeholders 0..n-1 for the GPUs it will be granted" if pending else "granted",
    }


# `gpuq show` lists a long environment folded: what gpuq sets and what decides which programs
# and GPUs the job finds; the rest (a submit's exported shell, often 50+ lines) with --env.
FOLD_ABOVE = 12
ALWAYS_SHOWN = ("PATH", "HOME", "USER", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "LD_LIBRARY_PATH")


def preview_lines(sees: dict[str, Any], job_id: str, whole_env: bool = False) -> list[str]:
    lines = [
        f"{'will run:' if sees['gpus_shown'] != 'granted' else 'runs:':<18}{sees['command_line']}",
        f"{'in:':<18}{sees['workdir']}" + (f" as {sees['as_user']}" if sees["as_user"] else ""),
    ]
    if sees["gpus_shown"] != "granted":
        lines.append(f"{'':<18}(GPU numbers are {sees['gpus_shown']})")
    lines.append(f"{'environment:':<18}{sees['env_base']}:")
    env = sees["env"]
    shown = (
        env
        if whole_env or len(env) <= FOLD_ABOVE
        else {k: v for k, v in env.items() if k in ALWAYS_SHOWN or k.startswith(("GPUQ_", "CUDA_", "NVIDIA_"))}
    )
    lines += [f"{'':<18}{k}={v}" for k, v in shown.items()]
    if len(shown) < len(env):
        lines.append(f"{'':<18}... and {len(env) - len(shown)} more (all of them: gpuq show {job_id} --env)")
    return lines
