"""`gpuq export slurm`: a gpuq spec as an sbatch script, for a team moving to Slurm.

Each field maps to what Slurm has for it; what Slurm cannot express the way gpuq does is said
in a comment in the script, never silently dropped:
  gpus -> --nodes=1 --gres=gpu:N (gpuq's GPUs are on one host); time_limit -> --time;
  cpus -> --cpus-per-task; mem -> --mem; name -> --job-name; workdir -> --chdir;
  env -> --export=ALL,NAME=value (values Slurm's list cannot carry: `export` lines);
  the log -> --output (appended); after/after_any -> --dependency=afterok:/afterany: with the
  Slurm ids of jobs already handed over; a sweep -> --array, each index running its command;
  priority class -> the partition and QOS named in config; gpu_mem -> config slurm_gpu_mem;
  venv/conda/setup -> the same activation lines gpuq runs; container -> the command run through
  its runtime with the GPUs Slurm granted (apptainer in the job's own process tree; docker and
  podman with a trap that stops the container when Slurm signals the script).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from itertools import product
from pathlib import Path
from typing import Mapping

from gpuq.host.hostinfo import read_owned
from gpuq.model.config import Config
from gpuq.model.environments import prelude_lines
from gpuq.model.names import JOB_ID_RE
from gpuq.model.spec import JobSpec
from gpuq.model.text import safe_text

SIMPLE_VALUE = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:@+-")
SLURM_ID_RE = re.compile(r"[0-9]{1,18}")
HANDED_OVER_MAX_BYTES = 4096  # {"claim": ..., "slurm_id": ...}


class ExportError(Exception):
    pass


def slurm_time(seconds: float) -> str:
    """12h -> '0-12:00:00'; Slurm's limit is whole seconds, rounded up."""
    s = math.ceil(seconds)
    return f"{s // 86400}-{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def handed_over(directory: Path) -> dict[str, str]:
    """gpuq id -> Slurm job id of the jobs a bridge has handed to Slurm (state/slurm/<id>.json),
    which later scripts name in --dependency. Only what the worker's account wrote counts (the
    owner of state/, this process's own user, or root): a file anyone else planted would decide
    when another user's job runs (afterok on a job of theirs). A file that is not one plain,
    small file, or whose ids are not ids (a Slurm job id is digits), is skipped."""
    try:
        trusted = {0, os.geteuid(), os.stat(directory.parent).st_uid}
        names = os.listdir(directory)
    except OSError:
        return {}
    out = {}
    for name in names:
        job_id = name[: -len(".json")]
        if not name.endswith(".json") or not JOB_ID_RE.match(job_id):
            continue
        data = _read_small_json(directory / name, trusted)
        slurm_id = str(data.get("slurm_id", "")) if isinstance(data, dict) else ""
        if SLURM_ID_RE.fullmatch(slurm_id):
            out[job_id] = slurm_id
    return out


def _read_small_json(path: Path, owners: set[int]) -> object:
    """The JSON of one plain file owned by one of `owners`, read without following a link or
    blocking on a FIFO; None for anything else."""
    raw = read_owned(path, owners, HANDED_OVER_MAX_BYTES)
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return None


def array_tasks(spec: JobSpec) -> int:
    """How many tasks a sweep's array has (0: not a sweep)."""
    return math.prod(len(v) for _, v in spec.sweep) if spec.sweep else 0


def slurm_logs(log_path: str, spec: JobSpec) -> list[str]:
    """The logs Slurm appends a job's output to (its --output): one per task of a sweep."""
    stem = log_path[:-4] if log_path.endswith(".log") else log_path
    return [f"{stem}-{i}.log" for i in range(array_tasks(spec))] if spec.sweep else [f"{stem}.log"]


def _gpu_mem_lines(spec: JobSpec, config: Config) -> tuple[list[str], list[str]]:
    """(sbatch options, comments) for gpu_mem, per config slurm_gpu_mem."""
    if not spec.gpus or spec.gpu_mem_mib is None:
        return [], []
    need = spec.gpu_mem_mib
    if config.slurm_gpu_mem == "constraint":
        fitting = sorted((mib, name) for name, mib in config.slurm_gpu_types.items() if mib >= need)
        if not fitting:
            raise ExportError(f"gpu_mem {need} MiB: no GPU type in config slurm_gpu_types has that much")
        features = "|".join(name for _, name in fitting)
        return [f"--constraint={features}"], [
            f"gpu_mem {need} MiB per GPU -> GPU types with at least that much "
            f"memory (config slurm_gpu_types): {features}"
        ]
    if config.slurm_gpu_mem == "shards" and config.slurm_shard_mib and spec.gpus == 1:
        shards = math.ceil(need / config.slurm_shard_mib)
        return [f"--gres=shard:{shards}"], [
            f"gpu_mem {need} MiB -> {shards} shard(s) of {config.slurm_shard_mib} MiB "
            "(config slurm_shard_mib): the job shares a GPU with others"
        ]
    return [], [
        f"gpu_mem {need} MiB per GPU: Slurm cannot reserve part of a GPU's memory; this job gets "
        "whole GPUs (config slurm_gpu_mem: constraint or shards to say otherwise)"
    ]


def _dependency(spec: JobSpec, slurm_ids: Mapping[str, str]) -> tuple[list[str], list[str]]:
    parts, comments = [], []
    for kind, ids in (("afterok", spec.after), ("afterany", spec.after_any)):
        known = [slurm_ids[i] for i in ids if i in slurm_ids]
        missing = [i for i in ids if i not in slurm_ids]
        if known:
            parts.append(f"{kind}:{':'.join(known)}")
        if missing:
            comments.append(
                f"{kind} {', '.join(missing)}: not handed to Slurm (yet); submit "
                f"{'it' if len(missing) == 1 else 'them'} first and export this again"
            )
    return ([f"--dependency={','.join(parts)}"] if parts else []), comments


def _environment(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """--export=ALL,NAME=value for plain values; `export` lines in the body for the rest."""
    plain = {k: v for k, v in env.items() if v and set(v) <= SIMPLE_VALUE}
    rest = {k: v for k, v in env.items() if k not in plain}
    option = "--export=ALL" + "".join(f",{k}={v}" for k, v in plain.items())
    return [option], [f"export {k}={shlex.quote(v)}" for k, v in rest.items()]


def _body(spec: JobSpec) -> list[str]:
    if not spec.sweep:
        cmd = spec.command if isinstance(spec.command, str) else shlex.join(spec.command)
        return [cmd]
    keys = [k for k, _ in spec.sweep]
    combos = list(product(*(values for _, values in spec.sweep)))
    lines = ['case "$SLURM_ARRAY_TASK_ID" in']
    for index, combo in enumerate(combos):
        command = spec.command if isinstance(spec.command, str) else shlex.join(spec.command)
        for key, value in zip(keys, combo):
            command = command.replace(f"{{{key}}}", str(value))
        exports = " ".join(f"GPUQ_SWEEP_{k.upper()}={shlex.quote(str(v))}" for k, v in zip(keys, combo))
        lines.append(f"  {index}) export {exports}; {command} ;;")
    lines.append("esac")
    return lines


def _in_container(spec: JobSpec, config: Config, job_id: str, inner: list[str]) -> tuple[list[str], list[str]]:
    """`inner` (shell lines) run inside the spec's container: (script lines, comments). The
    container is the containers extra's field, read here as the JSON the core keeps
    (JobSpec.extras): an extra imports no other extra."""
    c = spec.extras["container"]
    image, mounts, given = c["image"], c.get("mounts") or (), c.get("options") or ()
    runtime = c.get("runtime") or config.container_runtime
    script = shlex.quote("\n".join(inner))
    if runtime == "apptainer":  # Slurm's environment (CUDA_VISIBLE_DEVICES too) passes through
        binds = "".join(f" --bind {shlex.quote(m)}" for m in mounts)
        options = "".join(f" {shlex.quote(o)}" for o in given)
        nv = " --nv" if spec.gpus else ""
        return [
            f'apptainer exec{nv} --bind "$PWD" --pwd "$PWD"{binds}{options} {shlex.quote(image)} /bin/sh -c {script}'
        ], []
    names = sorted({*spec.env, "GPUQ_JOB_ID", "SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID"})
    gpus = (
        ' --gpus "\\"device=${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}\\""' if spec.gpus and runtime == "docker" else ""
    )
    if spec.gpus and runtime == "podman":
        gpus = (
            ' $(for g in $(echo "${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES}" | tr , " "); '
            'do printf -- "--device nvidia.com/gpu=%s " "$g"; done)'
        )
    volumes = "".join(f" --volume {shlex.quote(m if ':' in m else f'{m}:{m}')}" for m in mounts)
    options = "".join(f" {shlex.quote(o)}" for o in given)
    envs = "".join(f" --env {n}" for n in names)
    lines = [
        f'_gpuq_container="gpuq-{job_id}-slurm-$SLURM_JOB_ID${{SLURM_ARRAY_TASK_ID:+-$SLURM_ARRAY_TASK_ID}}"',
        f'trap \'{runtime} stop --time {math.ceil(spec.grace_s or config.grace_s)} "$_gpuq_container" '
        ">/dev/null 2>&1' TERM INT",
        f'{runtime} run --rm --init --name "$_gpuq_container"{gpus} --user "$(id -u):$(id -g)" '
        f'--volume "$PWD:$PWD" --workdir "$PWD"{volumes}{envs}{options} {shlex.quote(image)} '
        f"/bin/sh -c {script} &",
        '_gpuq_pid=$!; wait "$_gpuq_pid"; _gpuq_status=$?',
        'while kill -0 "$_gpuq_pid" 2>/dev/null; do wait "$_gpuq_pid"; _gpuq_status=$?; done',
        'exit "$_gpuq_status"',
    ]
    comments = [
        f"container {image} ({runtime}): its daemon, not Slurm, holds the container, so the trap "
        f"stops it when Slurm signals this script; the GPUs are the job's (SLURM_JOB_GPUS)"
    ]
    return lines, comments


def sbatch_script(
    job_id: str, spec: JobSpec, config: Config, log_path: str, default_workdir: str, slurm_ids: Mapping[str, str] = {}
) -> str:
    """The sbatch script for one spec (a sweep: one script with --array)."""
    options = [
        f"--job-name={spec.name or job_id}" if set(spec.name or job_id) <= SIMPLE_VALUE else f"--job-name={job_id}"
    ]
    comments: list[str] = []
    if spec.gpus:
        options += ["--nodes=1", f"--gres=gpu:{spec.gpus}"]
    mem_options, mem_comments = _gpu_mem_lines(spec, config)
    options += mem_options
    comments += mem_comments
    if time_limit_s := spec.time_limit_s or config.time_limit_s:
        options.append(f"--time={slurm_time(time_limit_s)}")
    if spec.cpus or config.cpus:
        options.append(f"--cpus-per-task={spec.cpus or config.cpus}")
    if spec.mem_mib or config.mem_mib:
        options.append(f"--mem={spec.mem_mib or config.mem_mib}M")
    options.append(f"--chdir={spec.workdir or default_workdir}")
    suffix = "-%a" if spec.sweep else ""
    options += [
        f"--output={log_path[:-4] if log_path.endswith('.log') else log_path}{suffix}.log",
        "--open-mode=append",
    ]
    if spec.sweep:
        options.append(f"--array=0-{array_tasks(spec) - 1}")
    for table, flag in ((config.slurm_partitions, "--partition"), (config.slurm_qos, "--qos")):
        if spec.priority_class in table:
            options.append(f"{flag}={table[spec.priority_class]}")
    if spec.priority:
        comments.append(
            f"priority {spec.priority}: Slurm orders by its own priority plugin; use --nice or a QOS to say the same"
        )
    dep_options, dep_comments = _dependency(spec, slurm_ids)
    options += dep_options
    comments += dep_comments
    env_options, exports = _environment(spec.env)
    options += env_options
    if spec.hosts:
        if len(spec.hosts) == 1:
            options.append(f"--nodelist={spec.hosts[0]}")
        else:
            comments.append(
                f"hosts {', '.join(spec.hosts)}: Slurm has no 'any one of these nodes'; tag them "
                "with a feature and add --constraint"
            )
    if spec.preemptible:
        options.append("--requeue")
        comments.append(
            "preemptible: Slurm preempts per its PreemptType/PreemptMode; --requeue lets it "
            "requeue this job" + (f"; grace {spec.grace_s:g}s -> --signal=TERM@" if spec.grace_s else "")
        )
        if spec.grace_s:
            options.append(f"--signal=TERM@{math.ceil(spec.grace_s)}")
    if spec.restart != "never":
        comments.append(
            f"restart: {spec.restart}: Slurm does not restart a finished job; run the service "
            "under a supervisor loop in the script, or keep it in gpuq"
        )
    for line in options + comments:  # one line each: a newline in a value would add lines of its own
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in line):
            raise ExportError(
                f"{safe_text(line[:80])!s}: a value holds a newline or a control character, which would "
                "change the script's #SBATCH lines; fix the spec's workdir, hosts, name or env"
            )
    lines = ["#!/bin/bash", f"# gpuq job {job_id}, exported by `gpuq export slurm`"]
    lines += [f"#SBATCH {o}" for o in options]
    lines += [f"# {c}" for c in comments]
    inner = prelude_lines(spec.venv, spec.conda, spec.setup) + _body(spec)
    body, container_comments = (
        _in_container(spec, config, job_id, inner) if spec.extras.get("container") else (inner, [])
    )
    lines += [f"# {c}" for c in container_comments]
    lines += exports + [f"export GPUQ_JOB_ID={job_id}"] + body
    return "\n".join(lines) + "\n"
