"""The mps extra's GPU sharing (gpuq/hooks.py GpuSharing), as a worker runs it: a job that
runs under MPS (model/sharing.py uses_mps) is made a client of its GPU's control daemon
(daemons.py) within its compute share; each pass stops the daemons of GPUs that emptied a
while ago; the heartbeat says whether MPS is usable (`gpuq doctor` reads it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpuq.extras.mps.daemons import LINGER_S, MpsDaemons, MpsError
from gpuq.host import rootorders
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.sharing import compute_pct, uses_mps
from gpuq.model.spec import JobSpec


@dataclass
class MpsSharing:
    daemons: MpsDaemons
    config: Config
    report_once: Callable[[str, str], None]

    def client(self, spec: JobSpec, gpu: GpuSnapshot) -> tuple[str, int] | None:
        """(pipe directory, compute share) for a job that runs under MPS, its GPU's daemon
        started if need be; None for any other job, and where the daemon cannot start (the
        job is then time-sliced, as without MPS, and the problem is logged once)."""
        if not uses_mps(spec, self.config):
            return None
        try:
            pipe = self.daemons.ensure(gpu.index, gpu.uuid)
        except MpsError as e:
            self.report_once(f"mps/{gpu.index}/{e}", f"MPS on GPU {gpu.index} unusable, its jobs are time-sliced: {e}")
            return None
        return str(pipe), compute_pct(spec, gpu.mem_total_mib)

    def settle(self, in_use: set[int], now: float, final: bool) -> None:
        """Stop the daemons of GPUs no running job here is a client of any more: `LINGER_S`
        after the last one ended, one per pass; all at once as the worker stops."""
        self.daemons.settle(in_use, now, 0.0 if final else LINGER_S, None if final else 1)

    def state(self) -> dict | None:
        if self.config.gpu_sharing != "mps":
            return None
        daemons = self.daemons
        return {"problem": daemons.problem(), "daemons": sorted(daemons.running()), "dir": str(daemons.base)}


def start(
    local_dir: Path, root_part: rootorders.Orders | None, config: Config, report_once: Callable[[str, str], None]
) -> MpsSharing:
    """The daemons beside the worker's local directory, made and used with gpu_sharing: mps;
    without it, only daemons an earlier worker left are stopped."""
    daemons = MpsDaemons.beside(local_dir, root_part)
    daemons.open(create=config.gpu_sharing == "mps")
    return MpsSharing(daemons, config, report_once)
