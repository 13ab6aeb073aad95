"""Which job's processes use which GPU memory: NVML lists processes per GPU; a process
belongs to the job whose supervisor is among its ancestors (the supervisor is a subreaper,
so a job's orphans stay under it), or its docker/podman container's main process (started
by the runtime's daemon, outside the supervisor's tree). What belongs to no job is someone
else's use."""

from __future__ import annotations

from typing import Callable

import psutil

from gpuq.model.gpu import GpuSnapshot
from gpuq.model.record import Record


def observe_job_memory(
    gpus: list[GpuSnapshot], running: list[Record], roots_of: Callable[[Record], list[int]]
) -> tuple[dict[str, dict[int, int]], dict[int, int]]:
    """NVML's per-process memory, summed per job: a process belongs to the job whose
    supervisor is among its ancestors (the supervisor is a subreaper, so orphans stay).
    Also the memory of processes that belong to no job, per GPU (someone else's use)."""
    if not any(g.processes for g in gpus):
        return {}, {}
    supervisors = {pid: r.id for r in running for pid in roots_of(r)}
    owner_of: dict[int, str | None] = {}

    def owner(pid: int) -> str | None:
        chain: list[int] = []
        while pid > 1 and pid not in owner_of and pid not in supervisors and len(chain) < 64:
            chain.append(pid)
            try:
                pid = psutil.Process(pid).ppid()
            except psutil.Error:
                pid = 0
        found = supervisors.get(pid) if pid in supervisors else owner_of.get(pid)
        for p in chain:
            owner_of[p] = found
        return found

    observed: dict[str, dict[int, int]] = {}
    foreign: dict[int, int] = {}
    for gpu in gpus:
        for proc in gpu.processes:
            job_id = owner(proc.pid) if supervisors else None
            if job_id is None:
                foreign[gpu.index] = foreign.get(gpu.index, 0) + (proc.used_mib or 1)
            elif proc.used_mib:
                per = observed.setdefault(job_id, {})
                per[gpu.index] = per.get(gpu.index, 0) + proc.used_mib
    return observed, foreign
