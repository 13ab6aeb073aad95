"""gpu_sharing: mps, the extra's part: the worker with a stand-in nvidia-cuda-mps-control
(tests/fake_mps.py), its daemons, planted directories, bench/gpu_check.py --mps. The plan's
rule and the client's variables are the core's: tests/test_sharing.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_mps import STAND_IN, end_stand_in_daemons
from team import ALICE, BOB, needs_root

from conftest import PY, REPO, fake_job, remove_local_dir, wait_until
from gpuq.model.config import Config

MPS = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=4, cpu_slots=1, gpu_sharing="mps", spread=False)


# --- through the real worker, with a stand-in nvidia-cuda-mps-control --------------------------

SHOW_ENV = (
    "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY THREADS=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
    "LIMIT=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT CVD=$CUDA_VISIBLE_DEVICES; "
)


@pytest.fixture
def stand_in(tmp_path):
    """A bin directory with the stand-in control program; its daemons are ended afterwards
    (real ones outlive the worker too, by design)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(STAND_IN)
    control.chmod(0o755)
    yield bin_dir
    end_stand_in_daemons(bin_dir)


def calls(bin_dir) -> list[str]:
    log = bin_dir / "mps-calls.log"
    return log.read_text().splitlines() if log.exists() else []


def daemon_alive(pid_file) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def mps_worker(queue, stand_in, fake: str = "2x16GiB"):
    queue.write_config(gpu_sharing="mps", spread=False)
    return queue.start_worker("box", fake, env={"PATH": f"{stand_in}:{os.environ['PATH']}"})


@pytest.mark.slow
def test_jobs_sharing_a_gpu_run_as_clients_of_its_mps_daemon_held_to_their_memory(queue, stand_in):
    mps_worker(queue, stand_in)
    queue.drop("a.yaml", f"command: '{SHOW_ENV}{fake_job(1.5)}'\ngpu_mem: 4GiB\n")
    queue.drop("b.yaml", f"command: '{SHOW_ENV}{fake_job(1.5)}'\ngpu_mem: 4GiB\ngpu_compute: 60%\n")
    # asks the fake GPU for more than it declared: under MPS the driver refuses it
    greedy = f"{PY} {REPO / 'gpuq.py'} fake-use --mem 6GiB --seconds 1"
    queue.drop("greedy.yaml", f"command: '{SHOW_ENV}{greedy}'\ngpu_mem: 4GiB\nretries: 0\n")  # once: no OOM retry
    queue.drop("whole.yaml", f"command: '{SHOW_ENV}sleep 0.5'\ngpus: 1\n")  # takes a GPU whole: no MPS
    for job_id in ("a", "b", "greedy", "whole"):
        wait_until(lambda j=job_id: queue.finished(j), timeout=90, what=f"{job_id} finished")
    records = {j: queue.finished(j) for j in ("a", "b", "greedy", "whole")}
    assert records["a"]["state"] == records["b"]["state"] == "done", records
    assert records["greedy"]["state"] == "failed" and "out of memory" in queue.log("greedy")
    shared = {records[j]["gpus"][0] for j in ("a", "b", "greedy")}
    assert len(shared) == 1, records  # packed (spread: false): the three share one GPU
    index = shared.pop()
    pipe = str(queue.local_base / "box-mps" / str(index) / "pipe")
    uuid = records["a"]["gpu_uuids"][0]
    starts = [c for c in calls(stand_in) if c.startswith("start")]
    assert starts == [f"start CVD={uuid} PIPE={pipe} LOG={queue.local_base / 'box-mps' / str(index) / 'log'}"]
    assert f"PIPE={pipe} THREADS=25 LIMIT=0=4096M CVD={uuid}" in queue.log("a")  # 4 of 16 GiB
    assert f"PIPE={pipe} THREADS=60 LIMIT=0=4096M CVD={uuid}" in queue.log("b")
    assert "PIPE= THREADS= LIMIT= CVD=" in queue.log("whole")  # not a client
    assert records["a"]["mps_pipe"] == pipe and records["b"]["mps_compute_pct"] == 60
    shown = queue.gpuq("show", "b").stdout
    assert f"mps_pipe:         {pipe}" in shown and "mps_compute:      60%" in shown, shown
    # Its GPU empty, the daemon is told to quit (after a short linger) and its pipes go; its log stays.
    wait_until(lambda: f"quit PIPE={pipe}" in calls(stand_in), timeout=60, what="the daemon told to quit")
    wait_until(lambda: not Path(pipe).exists(), timeout=30, what="its pipe directory removed")
    assert (queue.local_base / "box-mps" / str(index) / "log").is_dir()


@pytest.mark.slow
def test_a_daemon_left_by_a_crashed_worker_is_kept_for_its_jobs_then_stopped(queue, stand_in):
    import signal

    mps_worker(queue, stand_in, "1x16GiB")
    queue.drop("long.yaml", f"command: '{fake_job(600)}'\ngpu_mem: 4GiB\n")
    wait_until(lambda: (queue.record("long") or {}).get("state") == "running", timeout=60, what="long running")
    pid_file = queue.local_base / "box-mps" / "0" / "pipe" / "nvidia-cuda-mps-control.pid"
    wait_until(lambda: daemon_alive(pid_file), what="its daemon")
    daemon = pid_file.read_text()
    queue.stop_worker("box", signal.SIGKILL)  # the job and its daemon run on
    mps_worker(queue, stand_in, "1x16GiB")
    queue.wait_passes("box", 3)
    assert daemon_alive(pid_file) and pid_file.read_text() == daemon, "a running job's daemon was stopped"
    assert not any(c.startswith("quit") for c in calls(stand_in))
    queue.gpuq("cancel", "long")
    wait_until(lambda: f"quit PIPE={pid_file.parent}" in calls(stand_in), timeout=60, what="the daemon told to quit")
    wait_until(lambda: not pid_file.exists(), timeout=30, what="its dirs removed")
    # The heartbeat says so at the box's next publication, after the removal: waited for.
    beat = queue.root / "state" / "workers" / "box.json"
    mps = wait_until(
        lambda: (m := json.loads(beat.read_text())["mps"]) and not m["daemons"] and m,
        timeout=30,
        what="the heartbeat to list no daemon",
    )
    assert mps == {"problem": None, "daemons": [], "dir": str(queue.local_base / "box-mps")}


@pytest.mark.slow
def test_without_the_control_program_jobs_are_time_sliced_and_doctor_says_why(queue, tmp_path):
    queue.write_config(gpu_sharing="mps")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    path = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "nvidia-cuda-mps-control").exists())
    queue.start_worker("box", "1x16GiB", env={"PATH": f"{empty}:{path}"})
    queue.drop("a.yaml", f"command: '{SHOW_ENV}{fake_job(0.2)}'\ngpu_mem: 4GiB\n")
    wait_until(lambda: queue.finished("a"), timeout=60, what="a finished")
    assert queue.finished("a")["state"] == "done" and "PIPE= THREADS=" in queue.log("a")
    assert "MPS on GPU 0 unusable" in (queue.root / "logs" / "workers" / "box.log").read_text()
    doctor = queue.gpuq("doctor", check=False).stdout
    assert "box: MPS unusable" in doctor and "nvidia-cuda-mps-control is not on the worker's PATH" in doctor, doctor


@needs_root
@pytest.mark.slow
def test_two_members_on_a_shared_root_never_share_an_mps_gpu_and_reach_their_daemon(team, stand_in):
    """On README's setup (a root worker, two members): bob's MPS job waits while alice's runs
    on the only GPU, status tells bob why, and once hers ends his job runs as a client of the
    daemon, whose pipe directory he can reach as himself."""
    team.write_config(gpu_sharing="mps")
    team.start_worker("box", "1x16GiB", env={"PATH": f"{stand_in}:{os.environ['PATH']}"})
    team.drop_as(ALICE, "al.yaml", "command: sleep 120\ngpu_mem: 4GiB\nworkdir: /\n")
    wait_until(lambda: (team.record("al") or {}).get("state") == "running", timeout=60, what="alice's job running")
    reach = "ls $CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid && echo THREADS=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
    team.drop_as(BOB, "bo.yaml", f"command: '{reach}'\ngpu_mem: 4GiB\nworkdir: /\n")

    def bobs_reason() -> str:
        shown = json.loads(team.as_user(BOB, "status", "--json").stdout)
        return next((j.get("reason") or "" for j in shown["pending"] if j["id"] == "bo"), "")

    wait_until(lambda: f"runs {ALICE}'s jobs under MPS" in bobs_reason(), timeout=60, what="bob told why he waits")
    assert (team.record("bo") or {}).get("state") is None  # still pending: not running beside alice's
    assert team.as_user(ALICE, "cancel", "al").returncode == 0
    wait_until(lambda: team.finished("bo"), timeout=90, what="bob's job finished")
    assert team.finished("bo")["state"] == "done", team.log("bo")
    assert "nvidia-cuda-mps-control.pid" in team.log("bo") and "THREADS=25" in team.log("bo")


@pytest.mark.slow
def test_a_control_program_that_fails_is_reported_and_not_retried_at_every_start(tmp_path, monkeypatch):
    from gpuq.extras.mps import daemons as mps

    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\necho 'no MPS on this GPU' >&2\nexit 3\n")
    silent = tmp_path / "silent"  # says it started, writes no pid file
    silent.write_text("#!/bin/sh\nexit 0\n")
    for program in (failing, silent):
        program.chmod(0o755)
    daemons = mps.MpsDaemons(tmp_path / "local-mps", control=str(failing))
    daemons.open(create=True)
    with pytest.raises(mps.MpsError, match="exited 3: no MPS on this GPU"):
        daemons.ensure(0, "GPU-x")
    assert daemons.problem() == "nvidia-cuda-mps-control -d exited 3: no MPS on this GPU"
    with pytest.raises(mps.MpsError, match="tried again 60 s after the last failure"):
        daemons.ensure(0, "GPU-x")  # within a minute: not run again (a hanging one would stall starts)
    monkeypatch.setattr(mps, "START_WAIT_S", 0.3)
    quiet = mps.MpsDaemons(tmp_path / "other-mps", control=str(silent))
    quiet.open(create=True)
    with pytest.raises(mps.MpsError, match="wrote no nvidia-cuda-mps-control.pid"):
        quiet.ensure(1, "GPU-y")
    assert mps.MpsDaemons(tmp_path / "x-mps", control=None).problem().startswith("nvidia-cuda-mps-control is not on")


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize(
    "planted, sharing", [("link", "mps"), ("dir-with-pid", "mps"), ("chowned-dir", "mps"), ("link", "time-slicing")]
)
def test_an_mps_directory_a_member_planted_before_the_worker_is_never_trusted(team, stand_in, planted, sharing):
    """local_dir in the sticky /tmp: bob makes its `-mps` sibling before the worker's first
    start, as a link to a directory of numbered runs, or as his own directory whose pid file
    names a root process that looks like a control daemon (also once an admin has made the
    top directory root's, as a message once advised). The root worker neither removes the
    runs, nor signals the process, nor hands alice's job bob's pipe directory."""
    import signal
    import subprocess

    local = f"/tmp/gqt-mpslocal-{os.getpid()}-{{host}}"
    mps_dir = Path(local.replace("{host}", "box") + "-mps")
    victim = team.base / "runs"
    (victim / "7").mkdir(parents=True)
    (victim / "7" / "model.pt").write_text("weeks of work")
    bystander = subprocess.Popen(["bash", "-c", "exec -a nvidia-cuda-mps-control sleep 300"])
    try:
        if planted == "link":
            assert team.run_as(BOB, ["ln", "-s", str(victim), str(mps_dir)]).returncode == 0
        else:
            made = team.run_as(
                BOB,
                [
                    "sh",
                    "-c",
                    f"mkdir -p {mps_dir}/0/pipe && chmod -R 777 {mps_dir} && "
                    f"echo {bystander.pid} > {mps_dir}/0/pipe/nvidia-cuda-mps-control.pid",
                ],
            )
            assert made.returncode == 0, made.stderr
            if planted == "chowned-dir":
                os.chown(mps_dir, 0, 0)
                os.chmod(mps_dir, 0o755)
        team.write_config(gpu_sharing=sharing, local_dir=local)
        team.start_worker("box", "1x16GiB", env={"PATH": f"{stand_in}:{os.environ['PATH']}"})
        team.drop_as(ALICE, "al.yaml", "command: 'echo PIPE=$CUDA_MPS_PIPE_DIRECTORY.'\ngpu_mem: 4GiB\nworkdir: /\n")
        wait_until(lambda: team.finished("al"), timeout=60, what="alice's job finished")
        assert "PIPE=." in team.log("al"), team.log("al")  # not a client of anything bob made
        team.wait_passes("box", 80, timeout=120)  # beyond the 10 s a daemon lingers: a stop would have come
        assert (victim / "7" / "model.pt").read_text() == "weeks of work"
        assert bystander.poll() is None, "the root worker killed a process a member's pid file named"
        assert not any(c.startswith("start") for c in calls(stand_in))
        if sharing == "mps":
            doctor = team.gpuq("doctor", check=False).stdout
            assert "box: MPS unusable" in doctor and str(mps_dir) in doctor, doctor
    finally:
        bystander.send_signal(signal.SIGKILL)
        bystander.wait()
        remove_local_dir(local.replace("{host}", "box"))  # with its -mps sibling and the fake GPUs' directory


def test_a_pid_file_that_is_not_a_plain_file_is_no_daemon(tmp_path):
    from gpuq.extras.mps import daemons as mps

    daemons = mps.MpsDaemons(tmp_path / "box-mps", control="/bin/true")
    daemons.open(create=True)
    pipe = daemons.pipe_dir(0)
    pipe.mkdir(parents=True)
    os.mkfifo(pipe / mps.PID_FILE)  # a read would block, or fail with EAGAIN while a writer holds it
    assert daemons.running() == {} and daemons._pid(0) is None
    os.unlink(pipe / mps.PID_FILE)
    (pipe / mps.PID_FILE).mkdir()
    assert daemons._pid(0) is None


@pytest.mark.slow
def test_one_pass_stops_one_daemon_at_most_a_stopping_worker_all(tmp_path, stand_in):
    """A `quit` that hangs costs seconds: a pass that stopped every GPU's daemon would hold the
    heartbeat for all of them together."""
    from gpuq.extras.mps import daemons as mps

    daemons = mps.MpsDaemons(tmp_path / "box-mps", control=str(stand_in / "nvidia-cuda-mps-control"))
    daemons.open(create=True)
    for i in range(3):
        daemons.ensure(i, f"GPU-{i}")
    assert sorted(daemons.running()) == [0, 1, 2]
    daemons.settle(set(), 0.0, linger_s=0.0)
    wait_until(lambda: len(daemons.running()) == 2, what="one daemon stopped")
    daemons.settle(set(), 0.0, linger_s=0.0, most=None)
    wait_until(lambda: daemons.running() == {}, what="the rest stopped")


@pytest.mark.slow
def test_gpu_check_mps_mode_passes_on_fake_gpus_with_a_stand_in_control_program(tmp_path):
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(STAND_IN)
    control.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--fake", "--mps"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "under MPS is refused" in proc.stdout and "daemon stopped" in proc.stdout, proc.stdout
    assert "start CVD=GPU-" in (tmp_path / "mps-calls.log").read_text()
