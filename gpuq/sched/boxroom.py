"""Cores and host memory a box holds for its jobs, as Slurm holds them: a job's -c (or config
`cpus`) and --mem (or config `mem`) start it only on a box with that many cores and that
much memory not held by the jobs already there. A box that does not say what it has (an
older worker's heartbeat, the simulator's boxes) holds nothing back."""

from __future__ import annotations

from typing import Iterable, Sequence

from gpuq.model.config import Config
from gpuq.model.jobs import HostView, PendingJob, RunningJob
from gpuq.model.units import format_mib


def asks(job: PendingJob, config: Config) -> tuple[int, int]:
    """The cores and MiB of host memory a job holds while it runs (0: none asked)."""
    spec = job.spec
    cpus = spec.cpus if spec.cpus is not None else config.cpus
    mem = spec.mem_mib if spec.mem_mib is not None else config.mem_mib
    return cpus or 0, mem or 0


class BoxRoom:
    """What each box has left of its cores and memory during one planning pass."""

    def __init__(self, hosts: Sequence[HostView], running: Iterable[RunningJob], config: Config) -> None:
        self.config = config
        self.cores = {h.name: h.cores for h in hosts if h.cores is not None}
        self.mem = {h.name: h.mem_mib for h in hosts if h.mem_mib is not None}
        for job in running:
            if job.preemptible and config.preemption:
                continue  # opportunistic work yields to ordinary work, its cores and memory too
            if job.host in self.cores:
                self.cores[job.host] -= job.cpus
            if job.host in self.mem:
                self.mem[job.host] -= job.mem_mib

    @staticmethod
    def applies(hosts: Sequence[HostView]) -> bool:
        """Whether any box says what it has (a replay's boxes do not: nothing to hold)."""
        return any(h.cores is not None or h.mem_mib is not None for h in hosts)

    def roomy(self, job: PendingJob, allowed: list[str]) -> list[str]:
        """Those of `allowed` with room for the job's cores and memory."""
        cpus, mem = asks(job, self.config)
        if not cpus and not mem:
            return allowed
        return [h for h in allowed if self.cores.get(h, cpus) >= cpus and self.mem.get(h, mem) >= mem]

    def take(self, job: PendingJob, host: str) -> None:
        cpus, mem = asks(job, self.config)
        if host in self.cores:
            self.cores[host] -= cpus
        if host in self.mem:
            self.mem[host] -= mem

    def why(self, job: PendingJob, allowed: list[str]) -> str:
        """Why none of `allowed` has room: the cores or memory asked, and the most left."""
        cpus, mem = asks(job, self.config)
        if cpus and any(self.cores.get(h, cpus) < cpus for h in allowed):
            most, where = max((self.cores.get(h, cpus), h) for h in allowed)
            cores = f"{cpus} core{'s' if cpus != 1 else ''}"
            return f"needs {cores} (-c) on one box; at most {max(0, most)} not held there ({where})"
        most_mem, where = max((self.mem.get(h, mem), h) for h in allowed)
        left = format_mib(max(0, most_mem))
        return f"needs {format_mib(mem)} of host memory (--mem) on one box; at most {left} not held there ({where})"
