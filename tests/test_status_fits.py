"""A status that fits the terminal: 80 columns by default (wider when the terminal is, whole
with -w), an array folded to one line in PENDING as in FINISHED, HOSTS left out when the
screen is narrowed to a state, and squeue's -o as --format. Through the real CLI and worker."""

from __future__ import annotations

import subprocess

import pytest

from conftest import PY, REPO

pytestmark = pytest.mark.slow  # a worker pass expands the array


def _a_busy_queue(queue) -> None:
    """120 jobs and a 30-member array waiting on a drained box (nothing starts)."""
    once = [PY, str(REPO / "worker.py"), "--root", str(queue.root), "--host", "a", "--fake-gpus", "4x24GiB", "--once"]
    subprocess.run(once, env=queue.env(), check=True, capture_output=True, timeout=120)
    queue.gpuq("drain", "a", "--reason", "driver update at 18:00 while the team is at the all-hands meeting")
    for i in range(60):
        queue.drop(f"train-{i}.yaml", f"command: python train.py --lr 3e-4 --seed {i} --data /shared/imagenet\n")
    queue.gpuq("submit", "--gpu-mem", "10GiB", "--id", "sweep", "--array", "0-29", "--", "python eval.py")
    for i in range(60):
        queue.drop(f"big-{i}.yaml", f"command: python big.py --seed {i}\ngpus: 2\n")
    subprocess.run(once, env=queue.env(), check=True, capture_output=True, timeout=120)  # expands the array


def test_status_fits_80_columns_folds_an_array_and_takes_squeues_format(queue):
    _a_busy_queue(queue)
    narrow = {**queue.env(), "COLUMNS": "80"}
    shown = queue.gpuq("status", "--all", env=narrow).stdout.splitlines()
    assert max(len(line) for line in shown) <= 80, [line for line in shown if len(line) > 80]
    assert shown[-1] == "(lines cut at 80 columns: gpuq status -w shows them whole)"
    folded = [line for line in shown if "sweep_" in line]
    assert len(folded) == 1 and "61-90" in folded[0] and "sweep_* (30 of 30)" in folded[0], folded
    assert "PENDING (150)" in shown
    whole = queue.gpuq("status", "-w", env=narrow).stdout
    assert "driver update at 18:00 while the team is at the all-hands meeting" in whole
    wider = queue.gpuq("status", env={**queue.env(), "COLUMNS": "200"}).stdout
    assert "all-hands meeting" in wider and "lines cut" not in wider
    default = queue.gpuq("status", env=narrow).stdout.splitlines()
    assert "  ... and 130 more (gpuq status --all). All 150 wait for:" in default  # 20 rows shown
    pending_only = queue.gpuq("status", "--state", "pending", env=narrow).stdout
    assert "HOSTS" not in pending_only and "PENDING (150)" in pending_only
    jobs = queue.gpuq("status", "-o", "id,state,reason", env=narrow).stdout.splitlines()
    assert jobs[0].split() == ["ID", "STATE", "REASON"] and len(jobs) == 1 + 150
    assert jobs[1].split()[:2] == ["train-0", "pending"]
    letters = queue.gpuq("status", "--format", "%i %T", env=narrow).stdout.splitlines()
    assert letters[0].split() == ["ID", "STATE"]
    bad = queue.gpuq("status", "-o", "id,nope", check=False)
    assert bad.returncode == 2 and "--format 'id,nope': choose columns from" in bad.stderr


def test_a_held_array_is_one_line_in_held_and_comes_back_whole(queue):
    _a_busy_queue(queue)
    held = queue.gpuq("hold", "sweep")
    assert "sweep_29" in held.stdout + held.stderr
    shown = queue.gpuq("status", "--state", "held").stdout.splitlines()
    assert "HELD (30; gpuq release ID puts one back at its place)" in shown, shown
    rows = [line for line in shown if "sweep_" in line]
    assert len(rows) == 1 and "sweep_* (30 of 30)" in rows[0], shown
    queue.gpuq("release", "sweep")
    again = queue.gpuq("status", "--all", "-w").stdout
    assert "HELD" not in again and "sweep_* (30 of 30)" in again


def test_status_narrows_to_jobs_and_names_as_squeue_j_and_n(queue):
    _a_busy_queue(queue)
    by_id = queue.gpuq("status", "-j", "train-3,sweep", "-o", "id").stdout.split()
    assert by_id == ["ID", "train-3", *[f"sweep_{i}" for i in range(30)]]  # a group's id: its members
    assert queue.gpuq("status", "train-3", "big-7", "-o", "id").stdout.split() == ["ID", "train-3", "big-7"]
    named = queue.gpuq("status", "-n", "big-1*", "-o", "id").stdout.split()
    assert named == ["ID", "big-1", *[f"big-1{i}" for i in range(10)]]
    assert "PENDING (1)" in queue.gpuq("status", "-j", "train-3").stdout
    assert queue.gpuq("status", "train-3", "-o", "id").stdout == "ID\ntrain-3\n"  # one column, not indented
