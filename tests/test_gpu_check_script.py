"""bench/gpu_check.py is for a real GPU box; its --fake mode runs the same checks on fake
GPUs so the script stays ready for the day a person runs it on one."""
import subprocess
import sys

from conftest import REPO


def test_gpu_check_passes_on_fake_gpus():
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--fake"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout and "FAIL" not in proc.stdout
