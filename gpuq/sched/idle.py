"""Is a person (or anything outside gpuq) using a GPU? The worker's record of since when
each GPU has been free of non-gpuq use: what `plan` needs to start opportunistic jobs only
on idle GPUs, and to make them yield the moment someone comes back."""

from __future__ import annotations

from typing import Iterable, Mapping

from gpuq.model.gpu import GpuSnapshot


class IdleTracker:
    def __init__(self, util_threshold_pct: int) -> None:
        self.threshold = util_threshold_pct
        self.since: dict[int, float | None] = {}  # GPU index -> idle since (None: in use now)

    def update(
        self, gpus: Iterable[GpuSnapshot], foreign_mib: Mapping[int, int], gpus_with_jobs: set[int], now: float
    ) -> dict[int, float | None]:
        """`foreign_mib`: memory of processes on each GPU that belong to no gpuq job. A GPU is
        in use by others when such a process holds memory on it, or when no gpuq job runs
        there and its utilization is at the threshold or above (processes NVML cannot show,
        e.g. in another container, still count)."""
        for gpu in gpus:
            busy = foreign_mib.get(gpu.index, 0) > 0 or (
                gpu.index not in gpus_with_jobs and (gpu.util_pct or 0) >= self.threshold
            )
            if busy:
                self.since[gpu.index] = None
            elif self.since.get(gpu.index, 0.0) is None or gpu.index not in self.since:
                self.since[gpu.index] = now
        return dict(self.since)
