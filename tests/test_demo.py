"""README's first command must stay true: the demo runs the whole flow on fake GPUs."""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO
from gpuq.cli import demo


@pytest.mark.slow
def test_demo_runs_the_whole_flow_and_removes_the_temp_root_it_made(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "gpuq.py"), "demo", "--quick"], capture_output=True, text=True, timeout=180, env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "12/12 jobs finished: 11 done, 1 cancelled (as asked), 0 failed or lost" in out
    # Its workers stopped, nothing of the flow is left in the temp root it made: it is gone.
    assert "removed the demo's queue root" in out and not list(tmp_path.glob("gpuq-demo-*"))
    assert "needs 30GiB on one GPU" in out and "cancelled (was pending)" in out
    assert "no GPU in the team can ever hold this job" in out  # submit refused it first
    assert re.search(r"training on GPUs \[\d\] with 20480 MiB each", out)


def test_the_demo_keeps_a_root_it_was_given_or_told_to_keep_and_says_how_to_use_it(tmp_path, monkeypatch, capsys):
    """What becomes of the root is decided around the flow (demo.run), whatever the flow did
    in it: here a stand-in flow leaves a finished record where the real one would (the real
    flow, in a temp root it made and then removed, is the test above)."""
    seen: list[Path] = []

    def flow(root: Path, quick: bool) -> int:
        assert quick
        (root / "state" / "finished").mkdir(parents=True)
        seen.append(root)
        return 0

    monkeypatch.setattr(demo, "_run", flow)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    assert demo.run(quick=True, keep=True) == 0
    kept = capsys.readouterr().out
    (root,) = (tmp_path / "tmp").glob("gpuq-demo-*")
    assert root == seen[0] and (root / "state" / "finished").is_dir()
    assert f"rm -rf {root} removes it" in kept and "removed" not in kept
    assert f"--root {root} --host box-a --fake-gpus 4x24GiB starts box-a again" in kept, kept
    given = tmp_path / "d"
    assert demo.run(given, quick=True) == 0  # a root it was given stays, and it says so
    assert given == seen[1] and (given / "state" / "finished").is_dir()
    assert f"rm -rf {given} removes it" in capsys.readouterr().out
