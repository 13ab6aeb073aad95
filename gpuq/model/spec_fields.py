"""The spec's fields as users read about them: type, default, meaning, example. The one
schema table of the core's fields: model/spec.py validates exactly these keys (and the ones
the extras add through gpuq/hooks.py `SpecField`, each with its own `Field`), and
docs/reference.md's spec table is rendered from it (tools/doc_tables.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    type: str
    default: str
    doc: str
    example: str


# The schema, in one place. docs/reference.md's spec table is rendered from it (reference.py).
FIELDS: dict[str, Field] = {
    "command": Field(
        "string or list of strings",
        "(required)",
        "A string runs under /bin/sh -c; a list is executed directly.",
        "python train.py --lr 3e-4",
    ),
    "name": Field("string", "the job id", "A label shown in status; free text.", "resnet baseline"),
    "gpus": Field("integer >= 0", "1", "GPUs on one host; 0 is a CPU-only job.", "2"),
    "gpu_mem": Field(
        "size", "whole GPU", "GPU memory needed on each GPU. Absent: the whole GPU, exclusively.", "20GiB"
    ),
    "gpu_compute": Field(
        "percentage 1-100%",
        "all of it (under MPS: its memory share, gpu_mem / the GPU's memory)",
        "The share of the GPU's compute (SMs) the job keeps busy; needs gpu_mem. Jobs whose shares "
        "fit in 100% together share a GPU even while others sit idle (they do not slow each other). "
        "Under config gpu_sharing: mps it is also the job's limit (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).",
        "50%",
    ),
    "priority": Field(
        "high|normal|low or integer",
        "normal",
        "Queue order: class first, then the integer (higher first), then age. `high` and integers "
        "above 0 only from the queue's admins (config `admins`): anyone else's spec is refused, naming the field.",
        "high",
    ),
    "workdir": Field(
        "absolute path",
        "the owner's home (a queue one user runs as themselves: its root); `gpuq submit`: the current directory",
        "Directory the command runs in.",
        "/home/ana/proj",
    ),
    "env": Field("mapping of string to string", "{}", "Extra environment variables.", "{WANDB_MODE: offline}"),
    "hosts": Field("list of host names", "any host", "Run only on these hosts.", "[box-a]"),
    "preemptible": Field(
        "true or false",
        "true for priority low",
        "Opportunistic: runs only on idle "
        "GPUs (and inside config idle_windows), and is stopped (SIGTERM, grace, SIGKILL) "
        "and requeued with GPUQ_PREEMPTED=1 when higher-priority work needs its memory, "
        "a non-gpuq process starts using its GPU, or its window closes.",
        "true",
    ),
    "grace": Field(
        "duration",
        "config grace_s (10s)",
        "Time between SIGTERM and SIGKILL when the job is stopped (cancel, preemption): time to write a checkpoint. "
        "An opportunistic job's is at most 10m: the job that needs its GPU waits that long.",
        "60s",
    ),
    "time_limit": Field(
        "duration",
        "config time_limit (none)",
        "Longest run: past it the job gets SIGTERM, its grace, then SIGKILL, and its record says timeout. "
        "A number is seconds; sbatch's forms are read as sbatch reads them (1:30:00, 2-12: seconds rounded "
        "up to a minute; YAML's base-60 numbers are not read). "
        "`gpuq submit --time 90` is 90 minutes, as sbatch's is.",
        "12h",
    ),
    "cpus": Field(
        "integer >= 1",
        "config cpus (no pinning)",
        "CPU cores for the job, held for it as sbatch's -c holds them: it starts on a box with that "
        "many cores not held by other jobs, and its affinity is that many cores, kept apart from theirs.",
        "8",
    ),
    "mem": Field(
        "size",
        "config mem (no limit)",
        "Host RAM of the job's whole process tree, held for it as sbatch's --mem holds it (it starts on a box "
        "with that much not held by other jobs); above it the job is stopped, and its record says why.",
        "64GiB",
    ),
    "after": Field(
        "list of job ids",
        "none",
        "Start only after each of these jobs succeeded; if one "
        "fails or is cancelled, this job is cancelled too, with that reason.",
        "[prep-1]",
    ),
    "after_any": Field(
        "list of job ids", "none", "Start only after each of these jobs ended, whatever the result.", "[train-3]"
    ),
    "sweep": Field(
        "mapping of name to list of values",
        "none",
        "One job per combination of the values; "
        "`{name}` in command is replaced by each value. Member ids: <id>_<name><value>-... "
        "At most 1,000 jobs, and 4 MiB of specs together.",
        "{lr: [1e-3, 3e-4], seed: [1, 2]}",
    ),
    "array": Field(
        "indices: 0-9, 1-9:2 or 1,4,7",
        "none",
        "One job per index, each with GPUQ_ARRAY_INDEX "
        "(Slurm's --array); member ids <id>_<index>; `%N` after the indices: at most N of them run at once. "
        "`gpuq submit --array` writes it. At most 1,000 jobs, and 4 MiB of specs together.",
        '"0-9%2"',
    ),
    "array_limit": Field(
        "whole number ≥ 1",
        "none",
        "At most this many jobs of the member's array run at once (each member of `array: 0-9%2` gets it).",
        "2",
    ),
    "begin": Field(
        "a time: 2026-12-24T08:00, '2026-12-24 08:00', with an offset (+01:00), or a Unix time",
        "none",
        "Start no earlier than this (sbatch's --begin; `gpuq submit --begin now+1hour` writes it). "
        "Local time where no offset is given.",
        '"2026-12-24T08:00"',
    ),
    "restart": Field(
        "never, on-failure or always",
        "never",
        "A service: when its command ends (always) or "
        "fails (on-failure), it is started again on the same GPUs after a backoff (1 s, doubling to "
        "5 min; back to 1 s after 10 min up), keeping its GPU memory meanwhile. Cancel, time limit "
        "and preemption still end it.",
        "on-failure",
    ),
    "venv": Field(
        "absolute path",
        "none",
        "A Python virtualenv activated before the command (inside the container, if any).",
        "/shared/envs/proj",
    ),
    "conda": Field(
        "environment name or absolute path",
        "none",
        "A conda environment activated before the command (with the conda found as $CONDA_EXE, else on PATH).",
        "torch-2.3",
    ),
    "setup": Field(
        "shell line or list of shell lines",
        "none",
        "Run first, in the same shell as the command (after venv/conda); the first that fails ends the job as failed.",
        "[export HF_HOME=/scratch/hf, ./fetch_data.sh]",
    ),
    "retries": Field(
        "integer >= 0",
        "config lost_retries (2)",
        "Re-runs when the job is lost with its host (dead, rebooted, fenced); a failing job is never re-run.",
        "0",
    ),
}
