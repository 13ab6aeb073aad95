"""README's first command must stay true: the demo runs the whole flow on fake GPUs."""

import re
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.slow  # every test here starts processes


def test_demo_runs_the_whole_flow(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "gpuq.py"), "demo", "--quick", "--dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "12/12 jobs finished: 11 done, 1 cancelled (as asked), 0 failed or lost" in out
    assert f"rm -rf {tmp_path / 'd'} removes it" in out  # a root it was given stays, and it says so
    assert "needs 30GiB on one GPU" in out and "cancelled (was pending)" in out
    assert "no GPU in the team can ever hold this job" in out  # submit refused it first
    assert re.search(r"training on GPUs \[\d\] with 20480 MiB each", out)


def test_the_demo_removes_the_temp_root_it_made_unless_kept(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "gpuq.py"), "demo", "--quick"], capture_output=True, text=True, timeout=180, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "removed the demo's queue root" in proc.stdout and not list(tmp_path.glob("gpuq-demo-*"))
    kept = subprocess.run(
        [sys.executable, str(REPO / "gpuq.py"), "demo", "--quick", "--keep"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert kept.returncode == 0, kept.stdout + kept.stderr
    (root,) = tmp_path.glob("gpuq-demo-*")
    assert f"rm -rf {root} removes it" in kept.stdout and (root / "state" / "finished").is_dir()
    assert f"--root {root} --host box-a --fake-gpus 4x24GiB starts box-a again" in kept.stdout, kept.stdout
