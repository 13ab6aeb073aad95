"""`gpuq export slurm`: the mapping of each field (pure), then the scripts against a real
one-node Slurm (tests/slurm_cluster.py): each passes `sbatch --test-only`, a job's exit code
and log come back, a sweep runs as an array, a dependency holds its dependent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, SlurmUnavailable
from team import ALICE, needs_root

from conftest import PY, REPO, wait_until
from gpuq.extras.slurm.export import ExportError, sbatch_script, slurm_time
from gpuq.host.faults import BRIDGE_CRASH_POINTS
from gpuq.model.config import Config
from gpuq.model.spec import validate_spec

DEFAULT_CONFIG = Config()


def script(data: dict, config: Config = DEFAULT_CONFIG, ids: dict | None = None, job_id: str = "j-1") -> str:
    return sbatch_script(job_id, validate_spec(data, "t.yaml"), config, f"/q/logs/{job_id}.log", "/q", ids or {})


def sbatch_lines(text: str) -> list[str]:
    return [line[len("#SBATCH ") :] for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_each_field_maps_to_its_sbatch_option():
    text = script(
        {
            "command": "python train.py",
            "name": "resnet",
            "gpus": 2,
            "gpu_mem": "20GiB",
            "time_limit": "90m",
            "cpus": 8,
            "mem": "64GiB",
            "workdir": "/home/ana/p",
            "env": {"WANDB_MODE": "offline", "NOTE": "a b,c"},
            "priority": "high",
            "after": ["prep-1"],
            "after_any": ["old-2"],
        },
        replace(Config(), slurm_partitions={"high": "gpu-high"}, slurm_qos={"high": "urgent"}),
        ids={"prep-1": "41", "old-2": "40"},
    )
    assert sbatch_lines(text) == [
        "--job-name=resnet",
        "--nodes=1",
        "--gres=gpu:2",
        "--time=0-01:30:00",
        "--cpus-per-task=8",
        "--mem=65536M",
        "--chdir=/home/ana/p",
        "--output=/q/logs/j-1.log",
        "--open-mode=append",
        "--partition=gpu-high",
        "--qos=urgent",
        "--dependency=afterok:41,afterany:40",
        "--export=ALL,WANDB_MODE=offline",
    ]
    assert "export NOTE='a b,c'" in text and text.rstrip().endswith("python train.py")
    assert "# gpu_mem 20480 MiB per GPU: Slurm cannot reserve part of a GPU's memory" in text
    missing = script({"command": "x", "after": ["prep-9"]})
    assert "--dependency" not in missing and "# afterok prep-9: not handed to Slurm (yet)" in missing
    assert slurm_time(1.5) == "0-00:00:02" and slurm_time(2 * 86400 + 61) == "2-00:01:01"


def test_gpu_mem_becomes_a_constraint_or_shards_as_config_says():
    types = replace(Config(), slurm_gpu_mem="constraint", slurm_gpu_types={"a10": 24576, "a100": 81920, "t4": 16384})
    assert "--constraint=a10|a100" in sbatch_lines(script({"command": "x", "gpu_mem": "20GiB"}, types))
    with pytest.raises(ExportError, match="no GPU type"):
        script({"command": "x", "gpu_mem": "100GiB"}, types)
    shards = replace(Config(), slurm_gpu_mem="shards", slurm_shard_mib=4096)
    assert "--gres=shard:5" in sbatch_lines(script({"command": "x", "gpu_mem": "20GiB"}, shards))


def test_a_sweep_is_one_array_script():
    text = script(
        {"command": "python hp.py --lr {lr} --seed {seed}", "sweep": {"lr": ["1e-3", "3e-4"], "seed": [1, 2]}},
        job_id="hp",
    )
    assert "--array=0-3" in sbatch_lines(text) and "--output=/q/logs/hp-%a.log" in sbatch_lines(text)
    assert "  3) export GPUQ_SWEEP_LR=3e-4 GPUQ_SWEEP_SEED=2; python hp.py --lr 3e-4 --seed 2 ;;" in text


@pytest.mark.slow
def test_the_cli_exports_files_and_pending_ids_and_names_what_it_cannot(queue, tmp_path):
    queue.write_config(slurm_partitions={"low": "scavenger"})
    queue.drop("train-1.yaml", "command: python train.py\ngpus: 1\npriority: low\n")
    spec = tmp_path / "eval.yaml"
    spec.write_text("command: python eval.py\ngpus: 0\n")
    out = queue.gpuq("export", "slurm", "train-1", str(spec))
    assert out.stdout.count("#!/bin/bash") == 2 and "#SBATCH --partition=scavenger" in out.stdout
    assert "#SBATCH --requeue" in out.stdout  # priority low is preemptible
    bad = queue.gpuq("export", "slurm", "nosuch", check=False)
    assert bad.returncode == 1 and "nosuch: neither a spec file nor a pending job" in bad.stderr


# --- against a real slurmctld and slurmd ---------------------------------------------------------


@pytest.fixture(scope="module")
def slurm():
    # Members read slurm.conf and reach munge's socket (a root bridge runs sbatch as the job's
    # owner): a directory others may enter, not pytest's own 0700 one.
    base = Path(tempfile.mkdtemp(prefix="gpuq-slurm-"))
    os.chmod(base, 0o755)
    cluster = SlurmCluster(base)
    try:
        try:
            cluster.start()
        except SlurmUnavailable as e:
            pytest.skip(f"no Slurm here: {e}")
        yield cluster
        cluster.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def export(root, *items: str) -> str:
    return subprocess.run(
        [PY, str(REPO / "gpuq.py"), "--root", str(root), "export", "slurm", *items],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_exported_scripts_run_on_slurm(slurm, tmp_path):
    root = tmp_path / "q"
    (root / "jobs").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "jobs" / "fails.yaml").write_text(
        "command: echo gpus=$CUDA_VISIBLE_DEVICES job=$GPUQ_JOB_ID; exit 3\n"
        "gpus: 1\ntime_limit: 5m\ncpus: 1\nmem: 200MiB\n"
    )
    (root / "jobs" / "hp.yaml").write_text("command: echo lr={lr}\ngpus: 0\nsweep: {lr: [1, 2, 3]}\n")
    for name in ("fails", "hp"):
        checked = slurm.sbatch(export(root, name), "--test-only")
        assert checked.returncode == 0 and "to start at" in checked.stderr, checked.stderr
    job = slurm.sbatch(export(root, "fails"), "--parsable").stdout.strip()
    assert slurm.wait_done(job) == ("FAILED", "3:0")
    log = wait_until(lambda: (root / "logs" / "fails.log").exists() and (root / "logs" / "fails.log").read_text())
    assert "gpus=0 job=fails" in log  # Slurm set CUDA_VISIBLE_DEVICES from the gres
    assert slurm.sbatch(export(root, "hp"), "--parsable").returncode == 0
    for i in range(3):
        wait_until(
            lambda i=i: (p := root / "logs" / f"hp-{i}.log").exists() and f"lr={i + 1}" in p.read_text(),
            timeout=60,
            what=f"array task {i}",
        )


def test_a_dependency_on_a_handed_over_job_waits_for_it(slurm, tmp_path):
    root = tmp_path / "q"
    (root / "jobs").mkdir(parents=True)
    (root / "logs").mkdir()
    (root / "jobs" / "prep.yaml").write_text(
        f"command: sleep 2; date +%s.%N > prep.done\ngpus: 0\nworkdir: {tmp_path}\n"
    )
    (root / "jobs" / "train.yaml").write_text(
        f"command: test -e prep.done && echo after\ngpus: 0\nworkdir: {tmp_path}\nafter: [prep]\n"
    )
    prep = slurm.sbatch(export(root, "prep"), "--parsable").stdout.strip()
    (root / "state" / "slurm").mkdir(parents=True)
    (root / "state" / "slurm" / "prep.json").write_text(json.dumps({"slurm_id": prep}))
    text = export(root, "train")
    assert f"#SBATCH --dependency=afterok:{prep}" in text
    train = slurm.sbatch(text, "--parsable").stdout.strip()
    assert slurm.wait_done(train, timeout=90) == ("COMPLETED", "0:0")
    assert "after" in (root / "logs" / "train.log").read_text()


def test_exported_container_jobs_run_on_slurm_and_scancel_stops_the_container(slurm, tmp_path):
    """Stand-in runtimes (tests/fake_runtime.py): the docker container belongs to a daemon
    outside Slurm's job, so only the script's trap can stop it when Slurm cancels the job."""
    import fake_runtime

    runtimes = fake_runtime.StandIns(tmp_path / "runtimes")
    env = {**slurm.env, **runtimes.worker_env()}
    try:
        root = tmp_path / "q"
        (root / "jobs").mkdir(parents=True)
        (root / "logs").mkdir()
        (root / "jobs" / "sif.yaml").write_text(
            "command: echo CVD=$CUDA_VISIBLE_DEVICES X=$X\ngpus: 1\nsetup: export X=7\n"
            "container: {image: /images/t.sif, runtime: apptainer}\n"
        )
        (root / "jobs" / "boxed.yaml").write_text(
            "command: \"trap '' TERM; echo up; while true; do sleep 0.2; done\"\ngpus: 1\ngrace: 2s\n"
            "container: {image: pytorch:2, runtime: docker}\n"
        )
        sif = subprocess.run(
            ["sbatch", "--parsable"], input=export(root, "sif"), capture_output=True, text=True, env=env, timeout=60
        ).stdout.strip()
        assert slurm.wait_done(sif) == ("COMPLETED", "0:0")
        assert "CVD=0 X=7" in (root / "logs" / "sif.log").read_text()
        boxed = subprocess.run(
            ["sbatch", "--parsable"], input=export(root, "boxed"), capture_output=True, text=True, env=env, timeout=60
        ).stdout.strip()
        name = f"gpuq-boxed-slurm-{boxed}"
        wait_until(lambda: name in runtimes.containers(), timeout=60, what="the container running under Slurm")
        run = runtimes.calls("run")[-1]["args"]
        assert run[run.index("--gpus") + 1] == '"device=0"'  # the GPU Slurm granted
        subprocess.run(["scancel", boxed], env=env, check=True, timeout=30)
        assert slurm.wait_done(boxed, timeout=60)[0] == "CANCELLED"
        wait_until(lambda: name not in runtimes.containers(), timeout=30, what="the container stopped")
        assert runtimes.calls("stop")[-1]["args"] == ["stop", "--time", "2", name]
    finally:
        runtimes.close()


# --- bridge mode: config backend: slurm ---------------------------------------------------------


@pytest.mark.long
def test_the_bridge_hands_jobs_to_slurm_and_keeps_gpuqs_records_true(slurm, queue):
    queue.write_config(backend="slurm")
    queue.start_worker("bridge", "1x80GiB", env=slurm.env)
    # Slurm's smallest time limit is a minute, checked every 30 s: this one runs alongside the rest
    queue.drop("slow.yaml", "command: sleep 600\ngpus: 0\ntime_limit: 1m\n")
    queue.drop("hp.yaml", "command: echo lr={lr} task $SLURM_ARRAY_TASK_ID\ngpus: 0\nsweep: {lr: [1, 2, 3]}\n")
    queue.drop("fails.yaml", "command: echo in slurm $SLURM_JOB_ID; exit 3\ngpus: 1\n")
    queue.drop("prep.yaml", "command: sleep 1; echo prepared\ngpus: 0\n")
    queue.drop("train.yaml", "command: echo trained\ngpus: 0\nafter: [prep]\n")
    failed = wait_until(lambda: queue.finished("fails"), timeout=60, what="fails to end in Slurm")
    assert (failed["state"], failed["exit_code"]) == ("failed", 3) and failed["slurm_id"]
    assert f"in slurm {failed['slurm_id']}" in queue.log("fails")
    prep = wait_until(lambda: queue.finished("prep"), timeout=60)
    train = wait_until(lambda: queue.finished("train"), timeout=60)
    assert prep["state"] == train["state"] == "done" and train["started_at"] >= prep["ended_at"]
    queue.drop("long.yaml", "command: sleep 120\ngpus: 0\n")
    row = wait_until(
        lambda: next((r for r in queue.status()["running"] if r["id"] == "long" and r["slurm_id"]), None),
        timeout=60,
        what="long to be handed over",
    )
    assert f"slurm job {row['slurm_id']}" in queue.gpuq("status").stdout
    queue.gpuq("cancel", "long")
    assert wait_until(lambda: queue.finished("long"), timeout=60)["state"] == "cancelled"
    assert slurm.job_state(row["slurm_id"])[0] == "CANCELLED"
    sweep = wait_until(lambda: queue.finished("hp"), timeout=60, what="the sweep's array to end")
    assert sweep["state"] == "done" and sweep["slurm_id"]
    assert [f"lr={i + 1} task {i}" in (queue.root / "logs" / f"hp-{i}.log").read_text() for i in range(3)] == [True] * 3
    assert queue.finished("hp_lr1") is None  # one array in Slurm, not three gpuq jobs
    slow = wait_until(lambda: queue.finished("slow"), timeout=180, what="Slurm to end slow at its time limit")
    assert slow["state"] == "timeout" and slow["reason"] == f"Slurm job {slow['slurm_id']}: TIMEOUT"


# Where a bridge killed at each point leaves the job (the record's state and Slurm id; None:
# no running record), and the attempt that runs it once the bridge is back.
BRIDGE_CRASH_LEAVES = {
    "bridge:planned": (None, 1),  # still a spec in jobs/
    "bridge:claimed": (None, 1),  # a claim with no record: put back at its place
    "bridge:recorded": (("running", None), 2),  # sbatch never ran: that attempt is requeued
    "bridge:submitted": (("running", None), 1),  # Slurm has it: the restarted bridge follows it
}


@pytest.mark.parametrize("point", BRIDGE_CRASH_POINTS)
def test_a_bridge_killed_at_each_step_of_a_hand_over_runs_the_job_once(slurm, queue, point):
    import signal as sig

    left, attempt = BRIDGE_CRASH_LEAVES[point]
    queue.write_config(backend="slurm")
    queue.start_worker("bridge", "1x80GiB", env={**slurm.env, "GPUQ_TEST_CRASH_AT": point})
    queue.drop("once.yaml", f"command: echo ran >> once.out\ngpus: 0\nworkdir: {queue.root}\n")
    assert queue.workers["bridge"].wait(timeout=60) == -sig.SIGKILL  # killed at the point
    orphan = queue.record("once")
    assert (orphan and (orphan["state"], orphan["slurm_id"])) == left, orphan
    queue.start_worker("bridge", "1x80GiB", env=slurm.env)
    done = wait_until(lambda: queue.finished("once"), timeout=60, what="the restarted bridge to run it")
    assert (done["state"], done["attempt"]) == ("done", attempt) and done["slurm_id"], done
    assert (queue.root / "once.out").read_text() == "ran\n"  # handed to Slurm once, run once
    left = lambda: list((queue.root / "jobs").glob("*.yaml")) + list((queue.root / "state" / "claims").iterdir())  # noqa: E731
    wait_until(lambda: not left(), what="nothing left behind")  # the claim goes after the record


def test_an_unreachable_controller_concludes_nothing(monkeypatch):
    import gpuq.extras.slurm.bridge as bridge

    def answer(stderr: str):
        return lambda *cmd: subprocess.CompletedProcess(cmd, 1, "", stderr)

    monkeypatch.setattr(bridge, "_slurm", answer("slurm_load_jobs error: Unable to contact slurm controller"))
    with pytest.raises(bridge.SlurmUnreachable):  # never "lost" because the controller was down
        bridge.scontrol_job("5")
    monkeypatch.setattr(bridge, "_slurm", answer("slurm_load_jobs error: Invalid job id specified"))
    assert bridge.scontrol_job("5") is None  # Slurm answered: it no longer knows the job


def test_a_job_waits_in_gpuq_while_sbatch_cannot_reach_the_controller(slurm, queue, tmp_path):
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: "
        "Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    (fake / "sbatch").chmod(0o755)
    queue.write_config(backend="slurm")
    queue.start_worker("bridge", "1x80GiB", env={**slurm.env, "PATH": f"{fake}:{os.environ['PATH']}"})
    queue.drop("patient.yaml", "command: echo made it\ngpus: 0\n")
    requeued = lambda: [
        e
        for e in queue.events()  # noqa: E731
        if e["job"] == "patient" and e["reason"] == "Slurm did not answer; requeued"
    ]
    wait_until(lambda: len(requeued()) >= 2, timeout=60, what="several passes, each refused by the fake sbatch")
    assert queue.finished("patient") is None  # never failed for it
    (fake / "sbatch").unlink()  # the controller is back: the real sbatch answers
    done = wait_until(lambda: queue.finished("patient"), timeout=60, what="patient to run once Slurm answers")
    assert done["state"] == "done" and done["attempt"] > 1 and "made it" in queue.log("patient")


@needs_root
def test_a_root_bridge_submits_each_job_as_its_spec_owner(slurm, users):  # noqa: F811
    """sbatch --uid/--gid: Slurm runs the job as the user who wrote the spec, and its log is
    theirs (created by the bridge before Slurm appends to it). The user is the session's own
    (a name of this run's: a fixed one was deleted under a copy of the suite running beside)."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from conftest import Queue

    ana = users[ALICE]
    base = Path(tempfile.mkdtemp(prefix="gpuq-bridge-"))
    os.chmod(base, 0o755)
    queue = Queue(base / "root", base / "local")
    try:
        queue.write_config(backend="slurm", allow_root_jobs=False)
        queue.start_worker("bridge", "1x80GiB", env=slurm.env)
        tmp = queue.root / "jobs" / ".who.yaml.tmp"
        tmp.write_text("command: id -u; echo USER=$USER HOME=$HOME\ngpus: 0\n")
        os.chown(tmp, ana.pw_uid, ana.pw_gid)
        os.rename(tmp, queue.root / "jobs" / "who.yaml")
        final = wait_until(lambda: queue.finished("who"), timeout=90, what="who, run by Slurm")
        log = queue.root / "logs" / "who.log"
        assert final["state"] == "done", (
            final.get("reason"),
            final.get("exit_code"),
            log.read_text() if log.exists() else "no log",
        )
        assert str(ana.pw_uid) in log.read_text().splitlines() and f"USER={ALICE} HOME={ana.pw_dir}" in log.read_text()
        assert (os.stat(log).st_uid, os.stat(log).st_mode & 0o777) == (ana.pw_uid, 0o640)
    finally:
        queue.close()
        shutil.rmtree(base, ignore_errors=True)


# sacct as slurmdbd would answer for one finished job: only the fields asked, in the order
# asked, '|'-separated with -P, no header with -n; an unknown field is sacct's error.
SACCT_STAND_IN = """#!{python}
import os, sys
if os.path.exists(sys.argv[0] + ".off"):
    os.execv("/usr/bin/sacct", ["sacct", *sys.argv[1:]])
import json
rows = json.loads(os.environ.get("SACCT_ROWS") or "null") or [
    {{"State": "FAILED", "ExitCode": "3:0", "Start": "2026-11-30T10:00:00", "End": "2026-11-30T10:00:02"}}]
job = rows[0]
args = sys.argv[1:]
fields = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "JobID,JobName,State").split(",")
unknown = [f for f in fields if f not in job]
if unknown:
    sys.exit(f"sacct: error: Invalid field requested: \\"{{unknown[0]}}\\"")
if "-j" not in args:
    sys.exit("sacct: this stand-in answers only for one job (-j)")
sep = "|" if "-P" in args else " "
if "-n" not in args:
    print(sep.join(fields))
for row in rows:  # an array job: one row per task (-X: no job steps)
    print(sep.join(row[f] for f in fields))
"""


@pytest.mark.slow
def test_the_sacct_stand_in_answers_only_the_fields_asked(tmp_path):
    stand_in = tmp_path / "sacct"
    stand_in.write_text(SACCT_STAND_IN.format(python=sys.executable))
    stand_in.chmod(0o755)
    ask = lambda fmt: subprocess.run(
        [str(stand_in), "-j", "7", "-X", "-n", "-P", f"--format={fmt}"],  # noqa: E731
        capture_output=True,
        text=True,
    )
    assert ask("State,ExitCode,Start,End").stdout == "FAILED|3:0|2026-11-30T10:00:00|2026-11-30T10:00:02\n"
    assert ask("ExitCode,State").stdout == "3:0|FAILED\n"  # a reordered format is answered as asked
    wrong = ask("State,Exitcode")
    assert wrong.returncode == 1 and "Invalid field requested" in wrong.stderr


@pytest.mark.slow
def test_an_array_jobs_accounting_is_its_worst_task_over_its_whole_span(tmp_path, monkeypatch):
    import os

    from gpuq.extras.slurm.bridge import sacct_job

    (tmp_path / "sacct").write_text(SACCT_STAND_IN.format(python=sys.executable))
    (tmp_path / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv(
        "SACCT_ROWS",
        json.dumps(
            [
                {"State": "COMPLETED", "ExitCode": "0:0", "Start": "2026-11-30T10:00:05", "End": "2026-11-30T10:00:09"},
                {"State": "FAILED", "ExitCode": "3:0", "Start": "2026-11-30T10:00:01", "End": "2026-11-30T10:00:04"},
                {"State": "COMPLETED", "ExitCode": "0:0", "Start": "2026-11-30T10:00:02", "End": "2026-11-30T10:00:03"},
            ]
        ),
    )
    assert sacct_job("7") == {
        "JobState": "FAILED",
        "ExitCode": "3:0",
        "StartTime": "2026-11-30T10:00:01",
        "EndTime": "2026-11-30T10:00:09",
        "Source": "sacct",
    }


def test_a_job_slurm_has_forgotten_is_settled_from_its_accounting(slurm, queue, tmp_path):
    """A bridge away longer than MinJobAge: scontrol no longer knows the job (a stand-in
    says so here); sacct, where slurmdbd keeps accounting, still does (a stand-in answers as
    it would); without accounting (this cluster's real sacct) the job is lost, exit unknown."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    (fake / "sacct").write_text(SACCT_STAND_IN.format(python=sys.executable))
    for tool in ("scontrol", "sacct"):
        (fake / tool).chmod(0o755)
    queue.write_config(backend="slurm")
    queue.start_worker("bridge", "1x80GiB", env={**slurm.env, "PATH": f"{fake}:{os.environ['PATH']}"})
    queue.drop("old.yaml", "command: exit 3\ngpus: 0\n")
    old = wait_until(lambda: queue.finished("old"), timeout=60, what="old settled from sacct")
    assert (old["state"], old["exit_code"]) == ("failed", 3) and "FAILED" in old["reason"]
    assert old["ended_at"] - old["started_at"] == 2  # Slurm's own times, from its accounting
    (fake / "sacct.off").touch()  # now the real sacct: this cluster keeps no accounting
    queue.drop("older.yaml", "command: exit 0\ngpus: 0\n")
    older = wait_until(lambda: queue.finished("older"), timeout=60, what="older settled")
    assert older["state"] == "lost" and "nor to its accounting or jobcomp log (exit unknown)" in older["reason"]


def test_a_second_bridge_adopts_a_dead_bridges_jobs_and_runs_none_twice(slurm, queue):
    """bridge-a dies twice over: once right after an sbatch (no Slurm id noted), and with a
    job it had noted. bridge-b adopts both once a-'s heartbeat has stood still lost_after_s:
    each runs in Slurm exactly once and its record ends with b."""
    import signal as sig

    queue.write_config(backend="slurm", lost_after_s=10)
    queue.start_worker("bridge-a", "1x80GiB", env=slurm.env)
    queue.drop("noted.yaml", f"command: sleep 12; echo ran >> noted.out\ngpus: 0\nworkdir: {queue.root}\n")
    wait_until(lambda: (queue.record("noted") or {}).get("slurm_id"), timeout=60, what="noted handed over")
    queue.stop_worker("bridge-a", sig.SIGKILL)
    queue.start_worker("bridge-a", "1x80GiB", env={**slurm.env, "GPUQ_TEST_CRASH_AT": "bridge:submitted"})
    queue.drop("unnoted.yaml", f"command: echo ran >> unnoted.out\ngpus: 0\nworkdir: {queue.root}\n")
    assert queue.workers.pop("bridge-a").wait(timeout=60) == -sig.SIGKILL  # killed right after sbatch
    assert queue.record("unnoted")["slurm_id"] is None
    queue.start_worker("bridge-b", "1x80GiB", env=slurm.env)
    for job_id in ("noted", "unnoted"):
        done = wait_until(
            lambda job_id=job_id: queue.finished(job_id), timeout=90, what=f"{job_id} followed by bridge-b"
        )
        assert (done["state"], done["host"], done["attempt"]) == ("done", "bridge-b", 1)
        assert (queue.root / f"{job_id}.out").read_text() == "ran\n"  # handed to Slurm once, run once
    adopted = [e for e in queue.events() if e.get("reason") == "adopted from bridge bridge-a (dead)"]
    assert sorted(e["job"] for e in adopted) == ["noted", "unnoted"]


def test_a_bridge_paused_before_its_sbatch_submits_nothing_once_its_job_was_requeued(slurm, queue):
    """bridge-a stops (SIGSTOP, as a paused VM) between writing a record and its sbatch;
    bridge-b finds that Slurm never got the job, requeues and hands it over itself. When a
    resumes, its lease is stale: it submits nothing, so the job runs once."""
    import signal as sig

    import psutil

    queue.write_config(backend="slurm", lost_after_s=10)
    queue.start_worker("bridge-a", "1x80GiB", env={**slurm.env, "GPUQ_TEST_PAUSE_AT": "bridge:recorded"})
    queue.drop("once.yaml", f"command: echo ran >> once.out\ngpus: 0\nworkdir: {queue.root}\n")
    paused = queue.worker_process("bridge-a")  # the worker, under its starter
    wait_until(lambda: paused.status() == psutil.STATUS_STOPPED, timeout=30, what="bridge-a paused")
    queue.start_worker("bridge-b", "1x80GiB", env=slurm.env)
    done = wait_until(lambda: queue.finished("once"), timeout=90, what="once, handed over by bridge-b")
    assert (done["state"], done["host"], done["attempt"]) == ("done", "bridge-b", 2)
    paused.send_signal(sig.SIGCONT)
    queue.wait_passes("bridge-a")  # a's pass went on (any sbatch of it is synchronous) and another one after
    queue_left = subprocess.run(["squeue", "-h", "-o", "%i %k"], capture_output=True, text=True, env=slurm.env)
    assert queue_left.returncode == 0 and queue_left.stdout.strip() == ""  # no stale attempt waiting in Slurm
    assert (queue.root / "once.out").read_text() == "ran\n"
    assert queue.finished("once")["attempt"] == 2 and queue.record("once")["state"] == "done"
    requeued = [e["reason"] for e in queue.events() if e["job"] == "once" and e.get("to") == "pending"]
    assert requeued == ["bridge bridge-a died before handing it to Slurm; requeued"]


def test_without_accounting_a_forgotten_job_is_settled_from_the_jobcomp_log(slurm, queue, tmp_path):
    """No slurmdbd (this cluster's real sacct says so), the controller has forgotten the job
    (a stand-in scontrol), but Slurm's jobcomp/filetxt log (config slurm_jobcomp_file) has it."""
    import os

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    (fake / "scontrol").chmod(0o755)
    queue.write_config(backend="slurm", slurm_jobcomp_file=str(slurm.base / "log" / "jobcomp.txt"))
    queue.start_worker("bridge", "1x80GiB", env={**slurm.env, "PATH": f"{fake}:{os.environ['PATH']}"})
    queue.drop("late.yaml", "command: sleep 1; exit 5\ngpus: 0\n")
    queue.drop("hp.yaml", "command: exit {code}\ngpus: 0\nsweep: {code: [0, 6, 0]}\n")
    late = wait_until(lambda: queue.finished("late"), timeout=60, what="late settled from the jobcomp log")
    assert (late["state"], late["exit_code"]) == ("failed", 5) and late["reason"].endswith("FAILED")
    hp = wait_until(lambda: queue.finished("hp"), timeout=60, what="the array settled from the jobcomp log")
    assert (hp["state"], hp["exit_code"]) == ("failed", 6)  # the task that did not complete speaks


@pytest.mark.slow
def test_export_of_a_job_that_is_not_there_names_its_verb_and_exits_1(queue):
    missing = queue.gpuq("export", "slurm", "no-such-job", check=False)  # not found: 1, as docs/reference.md says
    assert missing.returncode == 1 and missing.stderr.startswith("gpuq export: "), missing.stderr
