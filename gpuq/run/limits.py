"""A running job's limits, as its supervisor enforces them: time limit, host RAM of its
process tree, CPU cores (affinity), and the stop (model/stops.py) an overrun gets.

The worker resolves each limit (the spec's, else config's) into the running record when it
starts the job, so the supervisor, `gpuq show` and the record agree on what applied.
"""

from __future__ import annotations

import os

from gpuq.host.usage import TreeSampler
from gpuq.model.config import Config
from gpuq.model.record import Record
from gpuq.model.spec import JobSpec
from gpuq.model.stops import Stop, StopCause
from gpuq.model.units import format_duration, format_mib

SAMPLE_EVERY_S = 1.0


class LimitWatch:
    """Checked by the supervisor while the job runs: samples the job's process tree every
    second (host/usage.py) and says when, and why, to stop it."""

    def __init__(self, record: "Record", started_monotonic: float) -> None:
        self.time_limit_s = record.time_limit_s
        self.mem_limit_mib = record.mem_limit_mib
        self.ends_at = started_monotonic + self.time_limit_s if self.time_limit_s else float("inf")
        self.sample_at = started_monotonic + SAMPLE_EVERY_S
        self.usage = TreeSampler()
        self.cpu_s: float | None = None  # the tree's CPU time, as its keeper counted it at the end

    def watch(self, root_pid: int) -> None:
        """Sample the process tree under `root_pid` (the job's keeper) from now on."""
        self.usage.root_pid = root_pid

    @property
    def next_at(self) -> float:
        return min(self.ends_at, self.sample_at)

    def breach(self, now: float) -> Stop | None:
        if now >= self.ends_at:
            return Stop(StopCause.TIMEOUT, f"time limit {format_duration(self.time_limit_s)} reached")
        if now >= self.sample_at:
            self.sample_at = now + SAMPLE_EVERY_S
            used = self.usage.sample(now)
            if self.mem_limit_mib and used > self.mem_limit_mib:
                return Stop.limit(f"host memory {format_mib(used)} above its mem {format_mib(self.mem_limit_mib)}")
        return None


def limits_for(spec: "JobSpec", config: "Config", cores_in_use: list[list[int]]) -> dict:
    """The limits that apply to a job starting now: its spec's, else config's; its cores."""
    cpus = spec.cpus if spec.cpus is not None else config.cpus
    cores = pick_cores(cpus, os.sched_getaffinity(0), cores_in_use) if cpus else []
    return {
        "time_limit_s": spec.time_limit_s if spec.time_limit_s is not None else config.time_limit_s,
        "mem_limit_mib": spec.mem_mib if spec.mem_mib is not None else config.mem_mib,
        "cpu_cores": cores,
    }


def pick_cores(count: int, allowed: set[int], in_use: list[list[int]]) -> list[int]:
    """`count` cores for a new job: the least used by other jobs (none, where the host has
    room), lowest index first among equals."""
    load = {c: 0 for c in allowed}
    for cores in in_use:
        for c in cores:
            if c in load:
                load[c] += 1
    return sorted(sorted(load, key=lambda c: (load[c], c))[:count])
