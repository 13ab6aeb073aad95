"""A stand-in for NVIDIA's nvidia-cuda-mps-control, for the tests that run a worker with
config gpu_sharing: mps (the mps extra's, the root audit's, bench/gpu_check.py's)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

STAND_IN = r"""#!/bin/bash
# A stand-in for nvidia-cuda-mps-control: it records each call and its environment, and its
# "daemon" is a process named as the real one whose pid it writes where the real one does.
log="$(dirname "$0")/mps-calls.log"
if [ "$1" = "-d" ]; then
  echo "start CVD=$CUDA_VISIBLE_DEVICES PIPE=$CUDA_MPS_PIPE_DIRECTORY LOG=$CUDA_MPS_LOG_DIRECTORY" >> "$log"
  ( exec -a nvidia-cuda-mps-control sleep 600 ) </dev/null >/dev/null 2>&1 &
  echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
  echo $! >> "$(dirname "$0")/daemons"  # for the test's clean-up
  exit 0
fi
read -r command
echo "$command PIPE=$CUDA_MPS_PIPE_DIRECTORY" >> "$log"
[ "$command" = quit ] && kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
exit 0
"""


def end_stand_in_daemons(bin_dir: Path) -> None:
    """Every daemon the stand-in in `bin_dir` started that still runs (by its pid, if that
    pid is still a stand-in daemon)."""
    listed = bin_dir / "daemons"
    for pid in listed.read_text().split() if listed.exists() else ():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"nvidia-cuda-mps-control\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
