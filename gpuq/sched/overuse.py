"""GPU memory overuse: a job observed (NVML, per process, mapped to its process tree) above
the memory it declared, by more than a tolerance, for longer than a while. The worker then
warns (an event, and a note in status) or stops the job, as config `gpu_mem_overuse` says."""

from __future__ import annotations

from dataclasses import dataclass

from gpuq.model.config import Config
from gpuq.model.record import Record
from gpuq.model.units import format_mib


@dataclass(frozen=True)
class Overuse:
    job_id: str
    why: str
    kill: bool


class GpuMemWatch:
    def __init__(self, config: "Config") -> None:
        self.tolerance = 1 + config.gpu_mem_tolerance_pct / 100
        self.after_s = config.gpu_mem_overuse_after_s
        self.kill = config.gpu_mem_overuse == "kill"
        self.over_since: dict[str, float] = {}
        self.current: dict[str, str] = {}  # job id -> why, while it lasts (status shows it)

    def update(self, running: list["Record"], observed: dict[str, dict[int, int]], now: float) -> list[Overuse]:
        """The overuses to act on now: each once per episode (it ends when usage drops back)."""
        acts = []
        live = set()
        for record in running:
            declared = record.gpu_mem_mib
            over = {i: m for i, m in observed.get(record.id, {}).items() if declared and m > declared * self.tolerance}
            if not over:
                continue
            live.add(record.id)
            since = self.over_since.setdefault(record.id, now)
            if now - since < self.after_s or record.id in self.current:
                continue
            index, used = max(over.items(), key=lambda kv: kv[1])
            why = (
                f"uses {format_mib(used)} of GPU memory on GPU {index}, declared {format_mib(declared)} "
                f"(+{round((self.tolerance - 1) * 100)}% tolerated)"
            )
            self.current[record.id] = why
            acts.append(Overuse(record.id, why, self.kill))
        for job_id in set(self.over_since) - live:  # cleared, or the job ended
            self.over_since.pop(job_id, None)
            self.current.pop(job_id, None)
        return acts
