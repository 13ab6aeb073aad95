"""What a job used, sampled while it runs and kept in its record: GPU memory (peak, mean)
and GPU utilization (mean) from the worker's NVML samples; host RAM (peak) and CPU (peak
cores, total seconds) from its supervisor's samples of the job's process tree."""

from __future__ import annotations

import json
from pathlib import Path

from gpuq.host.files import atomic_write

GPU_USAGE_WRITE_EVERY_S = 2.0


class GpuUsage:
    """Worker side: running sums per job, written to the job's local usage file now and then
    (and whenever the peak rises), for its supervisor to put in the record at the end."""

    def __init__(self) -> None:
        self.stats: dict[str, dict] = {}
        self.written_at: dict[str, float] = {}

    def sample(self, job_id: str, mem_by_gpu: dict[int, int], util_pcts: list[int], now: float, path: Path) -> None:
        s = self.stats.setdefault(job_id, {"peak_gpu_mem_mib": 0, "mem_sum": 0, "util_sum": 0, "samples": 0})
        mem = max(mem_by_gpu.values(), default=0)
        rose = mem > s["peak_gpu_mem_mib"]
        s["peak_gpu_mem_mib"] = max(s["peak_gpu_mem_mib"], mem)
        s["mem_sum"] += mem
        s["util_sum"] += sum(util_pcts) / len(util_pcts) if util_pcts else 0
        s["samples"] += 1
        if rose or now - self.written_at.setdefault(job_id, now) >= GPU_USAGE_WRITE_EVERY_S:
            self.written_at[job_id] = now
            atomic_write(path, json.dumps(s).encode(), mode=0o600, durable=False)  # read whole at settling

    def forget(self, job_id: str) -> None:
        self.stats.pop(job_id, None)
        self.written_at.pop(job_id, None)


def read_gpu_usage(path: Path) -> dict:
    """The record's GPU usage fields from the worker's usage file (empty if never sampled)."""
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    n = s.get("samples") or 0
    return {
        "peak_gpu_mem_mib": s.get("peak_gpu_mem_mib") or None,
        "mean_gpu_mem_mib": round(s["mem_sum"] / n) if n else None,
        "mean_gpu_util_pct": round(s["util_sum"] / n, 1) if n else None,
    }


class TreeSampler:
    """Supervisor side: the job's process tree (every descendant of its keeper: the job, its
    children and the orphans the keeper adopted), read from /proc, which anyone may read."""

    def __init__(self) -> None:
        self.peak_rss_mib = 0
        self.peak_cpus = 0.0
        self.root_pid: int | None = None  # the keeper's (host/keeper.py)
        self._last: tuple[float, float] | None = None  # (monotonic time, tree CPU seconds)

    def sample(self, now: float) -> int:
        """Returns the tree's resident memory now (MiB)."""
        import psutil

        rss = cpu = 0.0
        try:
            tree = psutil.Process(self.root_pid).children(recursive=True) if self.root_pid else []
        except psutil.Error:
            tree = []
        for proc in tree:
            try:
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    times = proc.cpu_times()
                    cpu += times.user + times.system
            except psutil.Error:
                pass
        if self._last is not None and now > self._last[0]:
            self.peak_cpus = max(self.peak_cpus, max(0.0, cpu - self._last[1]) / (now - self._last[0]))
        self._last = (now, cpu)
        mib = int(rss // 2**20)
        self.peak_rss_mib = max(self.peak_rss_mib, mib)
        return mib

    def result(self, cpu_s: float | None) -> dict:
        """After the job and its leftovers were reaped: their CPU time, as their keeper's
        rusage counted it (`cpu_s`)."""
        return {
            "peak_rss_mib": self.peak_rss_mib or None,
            "peak_cpus": round(self.peak_cpus, 2) or None,
            "cpu_s": round(cpu_s, 2) if cpu_s is not None else None,
        }


def suggest_gpu_mem(peaks: list[int]) -> int | None:
    """A right-sized gpu_mem from past peaks: the largest, plus 10%, rounded up to a GiB."""
    if not peaks or not max(peaks):
        return None
    return -(-int(max(peaks) * 1.1) // 1024) * 1024
