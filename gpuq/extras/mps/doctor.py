"""What `gpuq doctor` says of each live box under config gpu_sharing: mps (gpuq/hooks.py
DoctorCheck): MPS usable, and its daemons; or unusable, why, and the fix; or the box's worker
runs without it (started before the config said mps)."""

from __future__ import annotations

from gpuq.cli.doctor import Finding, fix_on
from gpuq.model.config import Config


def findings(host: str, hb: dict, config: Config, owner: bool) -> list[Finding]:
    """The box's MPS, as its heartbeat's `mps` says (sharing.py MpsSharing.state)."""
    return [_finding(host, hb.get("mps"), owner)] if config.gpu_sharing == "mps" else []


def _finding(host: str, mps: object, owner: bool) -> Finding:
    """config gpu_sharing: mps, as the box's worker found it."""
    if not isinstance(mps, dict):
        fix = "restart its worker (pkill -f worker.py; cron starts it again) to read the config"
        return Finding("warn", "mps", f"{host}: its worker runs without gpu_sharing: mps", fix_on(host, owner, fix))
    if problem := mps.get("problem"):
        if "not on the worker's PATH" in problem:
            fix = "install the NVIDIA compute utilities (nvidia-cuda-mps-control), or set gpu_sharing: time-slicing"
        elif "Fix:" in problem or ": set local_dir" in problem:
            fix = "as the message says"
        else:
            logs = f"{mps.get('dir') or '<local_dir>-mps'}/<GPU>/log/control.log"
            fix = f"read the daemon's log, {logs}, and check the driver with nvidia-smi"
        return Finding(
            "warn",
            "mps",
            f"{host}: MPS unusable: {problem}; jobs sharing its GPUs are time-sliced",
            fix_on(host, owner, fix),
        )
    daemons = mps.get("daemons") or []
    return Finding(
        "ok", "mps", f"{host}: MPS usable" + (f"; daemons on GPU {', '.join(map(str, daemons))}" if daemons else "")
    )
