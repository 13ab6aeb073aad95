"""NVIDIA MPS, an extra: under config `gpu_sharing: mps` the worker runs an MPS control daemon
for each GPU that has a one-GPU job declaring gpu_mem (daemons.py), started by the root part
as root in a team's queue (host/privsep.py, the core's), and makes each such job a client of
its GPU's daemon within its compute share (sharing.py: a GpuSharing hook); `gpuq doctor`
says whether MPS is usable on each box (doctor.py: a DoctorCheck). README.md here is its page.

Every gpuq process imports this module, root's `gpuq` too (docs/security.md, "What runs as
root"): it imports nothing but the registry's types, and names the rest by "module:function",
loaded only when a worker starts or `gpuq doctor` runs (as the queue's account).
"""

from __future__ import annotations

from gpuq.hooks import DoctorCheck, GpuSharing, Registry


def register(registry: Registry) -> None:
    registry.gpu_sharing.append(GpuSharing("mps", "extras.mps.sharing:start"))
    registry.doctor_checks.append(DoctorCheck("mps", "extras.mps.doctor:findings"))
