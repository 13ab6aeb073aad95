"""How jobs placed on one GPU share it (config `gpu_sharing`; docs/scheduling.md, "MPS").

time-slicing, the driver's default: the GPU runs one job's kernels at a time, so jobs whose
kernels keep it busy slow each other down. mps: a one-GPU job that declares gpu_mem is a
client of an NVIDIA MPS control daemon the worker runs for its GPU (the mps extra): kernels of
its jobs run side by side, each job on at most its compute share of the SMs, and the driver
refuses it memory beyond its gpu_mem. MPS runs one server per user on a GPU and makes a
second user's client wait for the first user's to end, so the plan never puts two users'
MPS jobs on one GPU.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the supervisor imports this module (run/launch.py): it needs no config
    from gpuq.model.config import Config
    from gpuq.model.spec import JobSpec


def uses_mps(spec: "JobSpec", config: "Config") -> bool:
    """Whether the job runs as an MPS client. A job of several GPUs would need one daemon
    for all of them (a client talks to one); a job an extra starts otherwise (in a container,
    a spec field of the containers extra) would need the daemon's pipes inside it: both are
    time-sliced, as a job that takes its GPU whole needs no MPS."""
    return config.gpu_sharing == "mps" and spec.gpus == 1 and spec.gpu_mem_mib is not None and not spec.extras


def compute_pct(spec: "JobSpec", gpu_total_mib: int) -> int:
    """The job's share of the GPU's SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): its spec's
    gpu_compute, else its share of the GPU's memory, rounded up."""
    if spec.gpu_compute_pct is not None:
        return spec.gpu_compute_pct
    return max(1, min(100, math.ceil(100 * (spec.gpu_mem_mib or gpu_total_mib) / max(1, gpu_total_mib))))


def pinned_mem_limit(gpu_mem_mib: int) -> str:
    """CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for a client that sees its one GPU as device 0."""
    return f"0={gpu_mem_mib}M"
