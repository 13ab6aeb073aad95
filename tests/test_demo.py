"""README's first command must stay true: the demo runs the whole flow on fake GPUs."""
import re
import subprocess
import sys

from conftest import REPO


def test_demo_runs_the_whole_flow(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "gpuq.py"), "demo", "--quick", "--dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "12/12 jobs finished" in out
    assert "needs 30GiB on one GPU" in out and "cancelled (was pending)" in out
    assert "no GPU in the team can ever hold this job" in out  # submit refused it first
    assert re.search(r"training on GPUs \[\d\] with 20480 MiB each", out)
