"""A GPU as one NVML read saw it: a frozen snapshot, published in heartbeats and fed to plan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NA = None  # a value NVML could not give


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mib: int | None


@dataclass(frozen=True)
class GpuSnapshot:
    index: int
    uuid: str
    name: str
    mem_total_mib: int
    mem_used_mib: int
    util_pct: int | None = None
    temp_c: int | None = None
    power_w: float | None = None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "mem_total_mib": self.mem_total_mib,
            "mem_used_mib": self.mem_used_mib,
            "util_pct": self.util_pct,
            "temp_c": self.temp_c,
            "power_w": self.power_w,
            "processes": [[p.pid, p.used_mib] for p in self.processes],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GpuSnapshot":
        procs = tuple(GpuProcess(pid, used) for pid, used in d.get("processes", []))
        return cls(
            d["index"],
            d["uuid"],
            d["name"],
            d["mem_total_mib"],
            d["mem_used_mib"],
            d.get("util_pct"),
            d.get("temp_c"),
            d.get("power_w"),
            procs,
        )
