"""Job traces for `gpuq simulate`: reading the CSV, and the cluster to replay it on.

Columns (the schema of the real traces under shared/traces): `job_id, submit_s, duration_s,
gpus, gpu_mem_gib, gpu_util, user`, and optionally `priority` and `time_limit_s` (what the job
declared, as sbatch --time; else its duration rounded up to a limit people pick, limit_for).
A fractional `gpus` is a share of one GPU (its memory share when `gpu_mem_gib` is empty); an integer `gpus` with empty
`gpu_mem_gib` takes whole GPUs; jobs wider than a host are capped to one host and counted.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from gpuq.model.spec import CLASS_RANK, JobSpec
from gpuq.model.units import parse_size_mib

REQUIRED = ("job_id", "submit_s", "duration_s", "gpus", "gpu_mem_gib", "gpu_util", "user")
_GROUP_RE = re.compile(r"^(\d+)x(\d+)x(.+)$")
# The limits people pick when asked how long a job may run (sbatch --time): a trace without a
# `time_limit_s` column gets each job's duration rounded up to the next of these.
LIMIT_STEPS_S = tuple(
    h * 3600 for h in (1, 2, 4, 8, 12, 24, 48, 72, 7 * 24, 14 * 24, 30 * 24, 60 * 24, 90 * 24, 180 * 24, 365 * 24)
)


MAX_LIMIT_S = 10 * 365 * 86400.0  # a "limit" beyond ten years is a typo


class TraceError(Exception):
    """A trace or cluster that cannot be replayed; the message names the place and the fix."""


@dataclass(frozen=True)
class HostGroup:
    hosts: int
    gpus_per_host: int
    mem_mib: int

    def __str__(self) -> str:
        return f"{self.hosts}x{self.gpus_per_host}x{self.mem_mib // 1024}GiB"


@dataclass(frozen=True)
class Cluster:
    """The boxes to replay on: groups of identical hosts (`1x8x80GiB+2x4x24GiB`)."""

    groups: tuple[HostGroup, ...]

    @property
    def hosts(self) -> int:
        return sum(g.hosts for g in self.groups)

    @property
    def gpus(self) -> int:
        return sum(g.hosts * g.gpus_per_host for g in self.groups)

    @property
    def gpus_per_host(self) -> int:
        """The widest host's GPUs: a job wider than that is capped to it."""
        return max(g.gpus_per_host for g in self.groups)

    @property
    def mem_mib(self) -> int:
        """The smallest GPU's memory: a share of "a GPU" (a trace's fractional `gpus`) is a
        share of this, so that it fits on every GPU of the cluster."""
        return min(g.mem_mib for g in self.groups)

    def host_shapes(self) -> list[tuple[int, int]]:
        """(GPUs, memory of each) for every host, in the order they are named h0, h1, ..."""
        return [(g.gpus_per_host, g.mem_mib) for g in self.groups for _ in range(g.hosts)]

    def __str__(self) -> str:
        return "+".join(str(g) for g in self.groups)


def parse_cluster(text: str) -> Cluster:
    """'2x8x32GiB' -> 2 hosts of 8 GPUs of 32 GiB; '1x8x80GiB+2x4x24GiB' (or with ',') mixes."""
    groups = []
    for part in re.split(r"[+,]", text.strip()):
        match = _GROUP_RE.match(part.strip())
        try:
            if not match:
                raise ValueError
            group = HostGroup(int(match.group(1)), int(match.group(2)), parse_size_mib(match.group(3)))
        except ValueError:
            raise TraceError(
                f"--cluster {text!r}: write HOSTSxGPUSxMEMORY, e.g. 2x8x32GiB, or groups joined by '+', "
                "e.g. 1x8x80GiB+2x4x24GiB"
            ) from None
        if not (1 <= group.hosts <= 1000 and 1 <= group.gpus_per_host <= 64):
            raise TraceError(f"--cluster {text!r}: use 1-1000 hosts of 1-64 GPUs")
        if group.mem_mib < 1024:
            raise TraceError(f"--cluster {text!r}: GPUs of {group.mem_mib} MiB hold no job. Fix: give 1GiB or more")
        groups.append(group)
    cluster = Cluster(tuple(groups))
    if cluster.hosts > 1000:
        raise TraceError(f"--cluster {text!r}: use 1-1000 hosts in all")
    return cluster


def limit_for(duration_s: float) -> float:
    """The time limit a person would have typed for a job that ran `duration_s`: the next of
    LIMIT_STEPS_S at or above it (the longest step for anything longer)."""
    return next((step for step in LIMIT_STEPS_S if step >= duration_s), float(max(LIMIT_STEPS_S[-1], duration_s)))


@dataclass(frozen=True)
class TraceJob:
    id: str
    submit_s: float
    duration_s: float
    spec: JobSpec
    util: float  # its GPU utilization, % (the slowdown model's input)
    user: str
    capped: bool  # asked for more GPUs than a host has
    time_limit_s: float = 0.0  # the trace's `time_limit_s`, else limit_for(duration_s)


def _hash_fraction(job_id: str, algorithm: str) -> float:
    """The first 8 hex digits of the job id's digest, as a fraction of 2**32."""
    return int(hashlib.new(algorithm, job_id.encode()).hexdigest()[:8], 16) / 2**32


def is_marked_low(job_id: str, fraction: float, rule: str = "sha1", gpus: float = 1.0) -> bool:
    """Whether `--mark-low` makes this job of a trace opportunistic (low), deterministically, by
    `rule`: "sha1", the SHA-1 of the job id below `fraction` (the documented default); "md5",
    its MD5 (another hash: other jobs, as many); "small", jobs of one GPU or less only, by SHA-1."""
    if rule == "small" and gpus > 1:
        return False
    return _hash_fraction(job_id, "md5" if rule == "md5" else "sha1") < fraction


def load_trace(
    path: Path, cluster: Cluster, since_s: float | None = None, stretch: float = 1.0, count: int | None = None
) -> list[TraceJob]:
    """The trace's jobs from `since_s` on (the first `count` of them), in submit order;
    `stretch` multiplies the gaps between submissions (the traces README's way to size a big
    cluster's load to a small one)."""
    try:
        handle = open(path, newline="")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    with handle:
        if handle.read(1) != "\ufeff":  # a UTF-8 byte-order mark (spreadsheets write one) is no column name
            handle.seek(0)
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path}: column '{missing[0]}' is missing. Fix: the header must name "
                f"{', '.join(REQUIRED)} (and optionally priority, time_limit_s)"
            )
        jobs = []
        seen: dict[str, int] = {}
        for line, row in enumerate(reader, 2):
            try:
                job = _job(row, cluster)
            except (ValueError, KeyError) as e:
                raise TraceError(f"{path}:{line}: {e}") from None
            if job.id in seen:
                raise TraceError(
                    f"{path}:{line}: column 'job_id': {job.id!r} again (line {seen[job.id]}). "
                    "Fix: give each job its own id"
                )
            seen[job.id] = line
            if since_s is None or job.submit_s >= since_s:
                jobs.append(job)
    jobs.sort(key=lambda j: j.submit_s)
    if count is not None:
        jobs = jobs[: max(0, count)]
    if stretch != 1.0 and jobs:
        first = jobs[0].submit_s
        jobs = [replace(j, submit_s=first + (j.submit_s - first) * stretch) for j in jobs]
    if not jobs:
        raise TraceError(f"{path}: no jobs" + (f" at or after --since {since_s:g}" if since_s else ""))
    return jobs


def _number(row: dict, column: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"column '{column}': {text!r} is not a number. Fix: write a number") from None
    if not math.isfinite(value):
        raise ValueError(f"column '{column}': {text!r} is not a finite number. Fix: write a number")
    if value < 0:
        raise ValueError(f"column '{column}': {text!r} is negative. Fix: write a value >= 0")
    return value


def _job(row: dict, cluster: Cluster) -> TraceJob:
    gpus = _number(row, "gpus")
    if gpus <= 0:
        raise ValueError("column 'gpus': 0 GPUs. Fix: drop CPU-only jobs from the trace")
    mem_text = (row.get("gpu_mem_gib") or "").strip()
    util_text = (row.get("gpu_util") or "").strip()
    priority = (row.get("priority") or "normal").strip() or "normal"
    if priority not in CLASS_RANK:
        raise ValueError(f"column 'priority': {priority!r}. Fix: use high, normal or low")
    share = gpus if gpus < 1 else 1.0
    whole_gpus = 1 if gpus < 1 else math.ceil(gpus)
    capped = whole_gpus > cluster.gpus_per_host
    whole_gpus = min(whole_gpus, cluster.gpus_per_host)
    if mem_text:
        mem_mib: int | None = min(cluster.mem_mib, max(1, int(_number(row, "gpu_mem_gib") * 1024)))
    elif gpus < 1:
        mem_mib = max(1, int(share * cluster.mem_mib))
    else:
        mem_mib = None  # whole GPUs, exclusively
    spec = JobSpec(
        command="(trace)",
        gpus=whole_gpus,
        gpu_mem_mib=mem_mib,
        # A share of one GPU is a share of its compute (Alibaba's gpu_milli): the job declares it.
        gpu_compute_pct=max(1, math.ceil(100 * share)) if gpus < 1 else None,
        priority_class=priority,
        preemptible=priority == "low",
    )
    util = float(util_text) if util_text else 100.0 * share
    duration = _number(row, "duration_s")
    # What the job declares, as sbatch --time: the trace's own limit, else the one a person
    # would have picked for it. Every policy sees the same; none sees the duration.
    limit = _number(row, "time_limit_s") if (row.get("time_limit_s") or "").strip() else limit_for(duration)
    if not 0 < limit <= MAX_LIMIT_S:
        raise ValueError(
            f"column 'time_limit_s': {limit:g} s is no time limit. Fix: write the job's limit in seconds "
            f"(above 0, at most {MAX_LIMIT_S:g}), or leave it empty for its duration rounded up"
        )
    return TraceJob(
        row["job_id"],
        _number(row, "submit_s"),
        duration,
        replace(spec, time_limit_s=limit),
        util,
        (row.get("user") or "").strip(),
        capped,
        limit,
    )


def mark_low(jobs: list[TraceJob], fraction: float, drop: bool = False, rule: str = "sha1") -> list[TraceJob]:
    """Mark about `fraction` of the jobs low (opportunistic) by `is_marked_low` under `rule`;
    with `drop`, leave them out instead (the same jobs), to measure what they
    cost the others."""
    out = []
    for job in jobs:
        if not is_marked_low(job.id, fraction, rule, job.spec.gpus if job.spec.gpus > 1 else 1.0):
            out.append(job)
        elif not drop:
            out.append(replace(job, spec=replace(job.spec, priority_class="low", preemptible=True)))
    return out
