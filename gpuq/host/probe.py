"""The one place that talks to NVML. Returns a frozen snapshot per GPU.

Every NVML call goes through `_call`, which turns "not supported / not available" into the
`NA` sentinel instead of an exception, so one odd GPU or driver never breaks a worker pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from gpuq.host import fake_nvml
from gpuq.model.gpu import NA, GpuProcess, GpuSnapshot
from gpuq.single_instance import FAKE_GPUS_ENV

FAKE_ENV = FAKE_GPUS_ENV


class Probe:
    """Snapshots of this host's GPUs through real NVML or the fake (docs/design.md, "Testing")."""

    def __init__(self, fake_spec: str | None, local_dir: Path) -> None:
        self.error: str | None = None
        self.fake_file: Path | None = None
        self._nvml: Any = None
        fake_spec = fake_spec or os.environ.get(FAKE_ENV)
        try:
            if fake_spec:
                self.fake_file = fake_nvml.materialize(fake_spec, local_dir)
                self._nvml = fake_nvml.FakeNvml(self.fake_file)
            else:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as e:  # no driver, no library, bad fake spec: the worker runs CPU jobs only
            self.error = f"NVML not available: {e}"
            self._nvml = None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:
            return NA

    def snapshot(self) -> list[GpuSnapshot]:
        nvml = self._nvml
        if nvml is None:
            return []
        count = self._call(nvml.nvmlDeviceGetCount)
        if count is NA:
            self.error = "NVML could not count GPUs"
            return []
        gpus = []
        for index in range(count):
            handle = self._call(nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is NA:
                continue
            mem = self._call(nvml.nvmlDeviceGetMemoryInfo, handle)
            if mem is NA:
                continue  # a GPU whose memory we cannot see is not offered
            util = self._call(nvml.nvmlDeviceGetUtilizationRates, handle)
            temp = self._call(nvml.nvmlDeviceGetTemperature, handle, 0)  # NVML_TEMPERATURE_GPU
            power = self._call(nvml.nvmlDeviceGetPowerUsage, handle)
            procs = self._call(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            gpus.append(
                GpuSnapshot(
                    index=index,
                    uuid=_text(self._call(nvml.nvmlDeviceGetUUID, handle)) or f"GPU-{index}",
                    name=_text(self._call(nvml.nvmlDeviceGetName, handle)) or "GPU",
                    mem_total_mib=mem.total // 2**20,
                    mem_used_mib=mem.used // 2**20,
                    util_pct=util.gpu if util is not NA else NA,
                    temp_c=temp,
                    power_w=power / 1000 if power is not NA else NA,
                    processes=tuple(
                        GpuProcess(p.pid, p.usedGpuMemory // 2**20 if p.usedGpuMemory else None) for p in procs
                    ),
                )
            )
        return gpus

    def job_env(self) -> dict[str, str]:
        """What a job needs to find the same (fake) GPUs: nothing for real NVML."""
        return {FAKE_ENV: str(self.fake_file)} if self.fake_file else {}


def _text(value: Any) -> str | None:
    if value is NA:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)
