"""Submitting as people do from a shell: a sweep from options (`--sweep lr=1e-3,3e-4`), a spec
file with options over it (`--spec FILE --gpus 0 -t 10`, never an option dropped silently),
and a spec dropped by hand without `workdir`, which runs in its owner's home. Through the real
CLI and worker; the home as a created member's."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from team import ALICE

from conftest import wait_until

pytestmark = pytest.mark.slow  # workers and members' CLIs


def test_a_sweep_from_the_shell_runs_every_combination_with_its_values_as_typed(queue):
    out = queue.gpuq(
        "submit", "--gpus", "0", "-J", "hp", "--sweep", "lr=1e-3,3e-4", "--sweep", "seed=1,2,3",
        "--", "echo", "lr={lr}", "seed={seed}",
    )  # fmt: skip
    group = out.stdout.splitlines()[-1]
    assert out.stdout == "hp-1\n" and out.stderr.startswith("hp-1: 6 jobs, hp-1_lr1e-3-seed1 ... hp-1_lr3e-4-seed3")
    queue.start_worker("a", "1x80GiB")
    assert queue.gpuq("wait", group, timeout=120).returncode == 0
    members = json.loads(queue.gpuq("show", group, "--json").stdout)["members"]
    assert len(members) == 6 and {m["state"] for m in members} == {"done"}
    assert "lr=3e-4 seed=2" in queue.log("hp-1_lr3e-4-seed2").splitlines()  # the output line, values as typed
    for bad, says in (
        (["--sweep", "lr", "--", "echo", "{lr}"], "--sweep 'lr': write NAME=VALUE,VALUE"),
        (["--sweep", "lr=1", "--sweep", "lr=2", "--", "echo", "{lr}"], "--sweep lr is given twice"),
        (["--sweep", "lr=1,2", "--", "echo", "x"], "--sweep: lr is not used in command"),
        (["--sweep", "lr=1", "--array", "0-1", "--", "echo", "{lr}"], "cannot be combined with sweep"),
    ):
        refused = queue.gpuq("submit", "--gpus", "0", *bad, check=False)
        assert refused.returncode == 2 and says in refused.stderr, (bad, refused.stderr)
    assert not list((queue.root / "jobs").glob("*.yaml"))  # nothing written by a refusal


def test_options_given_with_a_spec_file_go_over_its_fields_and_say_so(queue, tmp_path):
    spec = tmp_path / "train.yaml"
    spec.write_text("command: echo dir=$(pwd) x=$X path=$PATH\ngpus: 1\ngpu_mem: 500GiB\nname: train\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**queue.env(), "PATH": f"/opt/my-tools/bin:{os.environ['PATH']}"}
    out = queue.gpuq(
        "submit", "--spec", str(spec), "--gpu-mem", "1GiB", "-t", "10", "--env", "X=1", "--workdir", str(work), env=env
    )
    job = out.stdout.splitlines()[-1]
    assert job == "train-1"
    # A 500 GiB ask fits nowhere; the --gpu-mem given replaces it, and says so.
    assert "the options given replace its gpu_mem ('500GiB' -> '1GiB')" in out.stderr, out.stderr
    queue.start_worker("a", "1x80GiB")
    assert queue.gpuq("wait", job, timeout=120).returncode == 0
    line = next(ln for ln in queue.log(job).splitlines() if ln.startswith("dir="))
    assert line.startswith(f"dir={work} x=1 path=/opt/my-tools/bin:"), line  # the submitter's PATH, exported
    assert queue.finished(job)["spec"]["time_limit_s"] == 600  # -t 10: ten minutes
    # The file alone is still checked as a worker would check it, naming the file.
    spec.write_text("command: echo\ngpus: lots\n")
    bad = queue.gpuq("submit", "--spec", str(spec), "--gpus", "0", check=False)
    assert bad.returncode == 2 and str(spec) in bad.stderr and "gpus" in bad.stderr


def test_a_spec_dropped_without_workdir_runs_in_its_owners_home(team):
    home = Path(team.users[ALICE].pw_dir)  # the created member's home, made for this test
    home.mkdir(parents=True, exist_ok=True)
    try:
        shutil.chown(home, team.users[ALICE].pw_uid, team.users[ALICE].pw_gid)
        home.chmod(0o700)
        team.write_config(poll_interval=0.2)
        team.drop_as(ALICE, "where.yaml", "command: pwd; touch made-here\ngpus: 0\n")
        team.start_worker("a", "1x80GiB")
        wait_until(lambda: team.finished("where"), timeout=90, what="the job to end")
        assert team.finished("where")["state"] == "done", team.log("where")
        assert (home / "made-here").exists() and str(home) in team.log("where")
    finally:  # only this test's home: a test beside it (another copy of the suite) may have its own there
        shutil.rmtree(home, ignore_errors=True)
        try:
            home.parent.rmdir()  # /nonexistent, when no other home is left in it
        except OSError:
            pass


def test_a_batch_script_s_sbatch_lines_are_read_under_the_options_typed(queue, tmp_path):
    """A Slurm user's `sbatch train.sbatch` habit: its #SBATCH lines were ignored."""
    script = tmp_path / "train.sbatch"
    script.write_text(
        "#!/bin/sh\n"
        "#SBATCH --job-name=resnet\n"
        "#SBATCH --partition=gpu\n"
        "#SBATCH -t 1:30:00  # an hour and a half\n"
        "#SBATCH -G 0\n"
        'echo "ran $0"\n'
        "#SBATCH --cpus-per-task=99\n"  # after the first command: sbatch reads no more
    )
    out = queue.gpuq("submit", "-t", "5", str(script))  # the command line wins over the script
    job = out.stdout.split()[-1]
    assert job == "resnet-1", out
    assert "train.sbatch, line 3: sbatch's --partition is not one gpuq has" in out.stderr
    queue.start_worker("a", "1x80GiB")
    record = wait_until(lambda: queue.finished(job), timeout=90, what="the script to run")
    assert record["state"] == "done" and record["time_limit_s"] == 300 and record["gpus"] == []
    assert record["spec"]["cpus"] is None and f"ran {script}" in queue.log(job)
    script.write_text("#!/bin/sh\n#SBATCH --frobnicate\ntrue\n")
    refused = queue.gpuq("submit", str(script), check=False)
    assert refused.returncode == 2 and "train.sbatch, line 2: #SBATCH --frobnicate is not an option" in refused.stderr


def test_a_scripts_export_line_never_takes_the_submitters_secrets(queue, tmp_path):
    """A security review: a shared script's `#SBATCH --export=ALL,MY_API_TOKEN` put the
    submitter's token into a spec the team can read, without a word."""
    script = tmp_path / "shared.sbatch"
    script.write_text("#!/bin/sh\n#SBATCH --export=ALL,MY_API_TOKEN,SEED=3\n#SBATCH -G 0\ntrue\n")
    out = queue.gpuq("submit", "--hold", str(script), env={**queue.env(), "MY_API_TOKEN": "s3cr3t-value"})
    assert "--export names MY_API_TOKEN, which look like secrets" in out.stderr, out.stderr
    job = out.stdout.split()[-1]
    shown = queue.gpuq("show", job, "--json").stdout
    assert "s3cr3t-value" not in shown and '"SEED": "3"' in shown.replace(" ", "").replace('":"', '": "')
    # Named on the command line, by the submitter, it is theirs to export.
    mine = queue.gpuq(
        "submit", "--hold", "--export", "ALL,MY_API_TOKEN", str(script), env={**queue.env(), "MY_API_TOKEN": "mine"}
    )
    assert "which look like secrets" not in mine.stderr


def test_a_ported_sbatch_script_keeps_its_arguments_gres_chdir_and_array_index(queue, tmp_path):
    """A Slurm user's session: a script given arguments lost its #SBATCH lines and could not
    start; an edit while it waited changed what ran; --gres=gpu:2 and -D were read past (one
    GPU, the wrong directory); every array task read an empty SLURM_ARRAY_TASK_ID; and
    `\\$GPUQ_ARRAY_INDEX` in a command given as words reached the program as typed."""
    work = tmp_path / "out"
    work.mkdir()
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --gres=gpu:2\n"
        f"#SBATCH -D {work}\n"
        "#SBATCH --array=0-2\n"
        'echo "VERSION-ONE args=$1,$2 task=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT pwd=$(pwd)'
        ' gpus=$CUDA_VISIBLE_DEVICES"\n'
    )
    out = queue.gpuq("submit", str(script), "one", "two")
    group = out.stdout.split()[-1]
    assert group == "train-1", out
    script.write_text(script.read_text().replace("VERSION-ONE", "VERSION-TWO"))  # edited while it waits
    queue.start_worker("a", "4x80GiB")
    members = [f"{group}_{i}" for i in range(3)]
    for member in members:
        record = wait_until(lambda m=member: queue.finished(m), timeout=120, what=f"{member} to run")
        assert record["state"] == "done" and len(record["gpus"]) == 2, record
    line = next(ln for ln in queue.log(f"{group}_2").splitlines() if ln.startswith("VERSION"))
    assert line.startswith(f"VERSION-ONE args=one,two task=2 of 3 pwd={work} gpus="), line
    assert f"==> command: /bin/bash -c <script of 5 lines> {script} one two" in queue.log(f"{group}_2")
    words = queue.gpuq("submit", "-G", "0", "--array", "4-5", "--", "echo", "seed=$GPUQ_ARRAY_INDEX")
    wait_until(lambda: queue.finished(words.stdout.split()[-1] + "_5"), timeout=120, what="the array given as words")
    assert "seed=5" in queue.log(words.stdout.split()[-1] + "_5").splitlines()


def test_hold_takes_an_array_and_a_sweep_whose_members_come_at_release(queue):
    """sbatch --hold --array: gpuq refused it ("submit the group, then hold its members", which
    races the members starting). The group's one spec is held; its members are written at release."""
    queue.start_worker("a", "1x80GiB")
    array = ["--array", "0-2%1", "-J", "harr", "--", "echo", "i=$GPUQ_ARRAY_INDEX"]
    out = queue.gpuq("submit", "--hold", "-G", "0", *array)
    assert out.stdout == "harr-1\n" and "harr-1: 3 jobs, harr-1_0 ... harr-1_2 once released" in out.stderr, out
    sweep = queue.gpuq("submit", "--hold", "-G", "0", "--sweep", "lr=1,2", "--", "echo", "lr={lr}").stdout.strip()
    held = {h["id"] for h in queue.status()["held"]}
    assert held == {"harr-1", sweep} and not queue.status()["pending"]
    bad = queue.gpuq("submit", "--hold", "-G", "0", "--array", "5-1", "--", "true", check=False)
    assert bad.returncode == 2 and "5-1" in bad.stderr
    for group in ("harr-1", sweep):
        queue.gpuq("release", group)
    assert queue.gpuq("wait", "harr-1", sweep, timeout=120).returncode == 0
    assert "i=2" in queue.log("harr-1_2").splitlines() and "lr=2" in queue.log(f"{sweep}_lr2").splitlines()


def test_a_private_script_is_never_copied_into_the_queue_and_a_copy_is_shown_as_what_runs(queue, tmp_path):
    """An attack review: a private (0700) script's text, a token in it, went into a spec the
    team reads; `(the script as submitted)` could be claimed by any command; an array's index
    was put into the script's own text; a bad `#!` line was a traceback."""
    queue.start_worker("a", "1x80GiB")
    secret = tmp_path / "secret.sh"
    secret.write_text("#!/bin/bash\n#SBATCH -G 0\nexport WANDB_API_KEY=sk-secret-123456\necho ran\n")
    secret.chmod(0o700)
    out = queue.gpuq("submit", str(secret))
    assert "is private (mode 700): not copied into the queue" in out.stderr, out.stderr
    job = out.stdout.strip()
    assert "sk-secret" not in queue.gpuq("show", job).stdout and "sk-secret" not in json.dumps(queue.status())
    shared = tmp_path / "arr.sh"
    shared.write_text("#!/usr/bin/env -S bash -e\n#SBATCH -G 0\necho 'literal: $SLURM_ARRAY_TASK_ID' \"index: $2\"\n")
    group = queue.gpuq("submit", "--array", "3-4", str(shared), "x", "$GPUQ_ARRAY_INDEX").stdout.strip()
    assert queue.gpuq("wait", group, job, timeout=120).returncode == 0
    assert "literal: $SLURM_ARRAY_TASK_ID index: 4" in queue.log(f"{group}_4").splitlines()  # its text as written
    forged = ["/bin/sh", "-c", "#!/bin/sh\necho pwned", "/home/ana/train.sh"]
    shown = queue.gpuq("submit", "--hold", "-G", "0", "--", *forged).stdout.strip()
    view = queue.gpuq("show", shown).stdout
    assert "/bin/sh -c <script of 2 lines> /home/ana/train.sh" in view and "as submitted" not in view, view
    (tmp_path / "quote.sh").write_text('#!/bin/bash "\necho hi\n')
    bad = queue.gpuq("submit", "-G", "0", str(tmp_path / "quote.sh"), check=False)
    assert bad.returncode == 2 and "quote.sh, line 1: No closing quotation" in bad.stderr, bad.stderr
