"""A status that fits the terminal: 80 columns by default (wider when the terminal is, whole
with -w), an array folded to one line in PENDING as in FINISHED, HOSTS left out when the
screen is narrowed to a state, and squeue's -o as --format. In this process (tests/harness.py:
the CLI's main, and a box's passes where the real tests ran `worker.py --once`); COLUMNS is the
environment's, as a terminal's width reaches the CLI."""

from __future__ import annotations

from pathlib import Path

from harness import PassWorker, gpuq


def _a_busy_queue(tmp_path: Path) -> Path:
    """120 jobs and a 30-member array waiting on a drained box (nothing starts); the root."""
    box = PassWorker(tmp_path / "root", "a", "4x24GiB")
    box.run_pass()  # its heartbeat: the box is known to drain
    root = box.root
    gpuq(root, "drain", "a", "--reason", "driver update at 18:00 while the team is at the all-hands meeting")
    for i in range(60):
        box.drop(f"train-{i}.yaml", f"command: python train.py --lr 3e-4 --seed {i} --data /shared/imagenet\n")
    gpuq(root, "submit", "--gpu-mem", "10GiB", "--id", "sweep", "--array", "0-29", "--", "python eval.py")
    for i in range(60):
        box.drop(f"big-{i}.yaml", f"command: python big.py --seed {i}\ngpus: 2\n")
    box.run_pass(after_s=2)  # expands the array (past spec_settle_s, as a later --once run was)
    assert box.launched() == []  # drained: nothing starts
    return root


def test_status_fits_80_columns_folds_an_array_and_takes_squeues_format(tmp_path):
    root = _a_busy_queue(tmp_path)
    narrow = {"COLUMNS": "80"}
    shown = gpuq(root, "status", "--all", env=narrow).stdout.splitlines()
    assert max(len(line) for line in shown) <= 80, [line for line in shown if len(line) > 80]
    assert shown[-1] == "(lines cut at 80 columns: gpuq status -w shows them whole)"
    folded = [line for line in shown if "sweep_" in line]
    assert len(folded) == 1 and "61-90" in folded[0] and "sweep_* (30 of 30)" in folded[0], folded
    assert "PENDING (150)" in shown
    whole = gpuq(root, "status", "-w", env=narrow).stdout
    assert "driver update at 18:00 while the team is at the all-hands meeting" in whole
    wider = gpuq(root, "status", env={"COLUMNS": "200"}).stdout
    assert "all-hands meeting" in wider and "lines cut" not in wider
    default = gpuq(root, "status", env=narrow).stdout.splitlines()
    assert "  ... and 130 more (gpuq status --all). All 150 wait for:" in default  # 20 rows shown
    pending_only = gpuq(root, "status", "--state", "pending", env=narrow).stdout
    assert "HOSTS" not in pending_only and "PENDING (150)" in pending_only
    jobs = gpuq(root, "status", "-o", "id,state,reason", env=narrow).stdout.splitlines()
    assert jobs[0].split() == ["ID", "STATE", "REASON"] and len(jobs) == 1 + 150
    assert jobs[1].split()[:2] == ["train-0", "pending"]
    letters = gpuq(root, "status", "--format", "%i %T", env=narrow).stdout.splitlines()
    assert letters[0].split() == ["ID", "STATE"]
    bad = gpuq(root, "status", "-o", "id,nope", check=False)
    assert bad.returncode == 2 and "--format 'id,nope': choose columns from" in bad.stderr


def test_a_held_array_is_one_line_in_held_and_comes_back_whole(tmp_path):
    root = _a_busy_queue(tmp_path)
    held = gpuq(root, "hold", "sweep")
    assert "sweep_29" in held.stdout + held.stderr
    shown = gpuq(root, "status", "--state", "held").stdout.splitlines()
    assert "HELD (30; gpuq release ID puts one back at its place)" in shown, shown
    rows = [line for line in shown if "sweep_" in line]
    assert len(rows) == 1 and "sweep_* (30 of 30)" in rows[0], shown
    gpuq(root, "release", "sweep")
    again = gpuq(root, "status", "--all", "-w").stdout
    assert "HELD" not in again and "sweep_* (30 of 30)" in again


def test_status_narrows_to_jobs_and_names_as_squeue_j_and_n(tmp_path):
    root = _a_busy_queue(tmp_path)
    by_id = gpuq(root, "status", "-j", "train-3,sweep", "-o", "id").stdout.split()
    assert by_id == ["ID", "train-3", *[f"sweep_{i}" for i in range(30)]]  # a group's id: its members
    assert gpuq(root, "status", "train-3", "big-7", "-o", "id").stdout.split() == ["ID", "train-3", "big-7"]
    named = gpuq(root, "status", "-n", "big-1*", "-o", "id").stdout.split()
    assert named == ["ID", "big-1", *[f"big-1{i}" for i in range(10)]]
    assert "PENDING (1)" in gpuq(root, "status", "-j", "train-3").stdout
    assert gpuq(root, "status", "train-3", "-o", "id").stdout == "ID\ntrain-3\n"  # one column, not indented
