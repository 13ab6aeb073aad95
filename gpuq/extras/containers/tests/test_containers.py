"""Containers, venv/conda activation and setup lines: the exact command lines per runtime
(golden files), and real runs through worker.py with stand-in runtimes (tests/fake_runtime.py)
that behave like docker's daemon: a killed client leaves its container running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fake_runtime
import psutil
import pytest
import real_runtimes
from golden_launch import GOLDEN_CLAIM, check_golden, golden_text

from conftest import PY, REPO, Queue, wait_until
from gpuq import hooks
from gpuq.extras.containers.client import Owner, container_name, container_run, probe_runtimes
from gpuq.extras.containers.spec import ALLOWED_OPTIONS, Container
from gpuq.model.config import Config
from gpuq.model.errors import SpecError
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import HostView, PendingJob
from gpuq.model.spec import parse_spec_text
from gpuq.sched.plan import plan

GOLDEN = Path(__file__).resolve().parent / "golden"

SPECS = {
    "docker": "container: {image: 'nvcr.io/nvidia/pytorch:24.05-py3', runtime: docker, "
    "mounts: ['/data:/data:ro', /scratch], options: [--shm-size=8g, --ulimit, memlock=-1]}\n",
    "podman": "container: {image: 'docker.io/pytorch/pytorch:2.3.0', runtime: podman, mounts: ['/data:/data:ro']}\n",
    "podman-rootless": "container: {image: 'docker.io/pytorch/pytorch:2.3.0', runtime: podman}\n",
    "apptainer": "container: {image: /shared/images/torch.sif, runtime: apptainer, mounts: ['/data:/data:ro']}\n",
    "docker-venv": "container: 'pytorch/pytorch:2.3.0'\nvenv: /shared/envs/proj\n",
}


def _golden_text(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The client's command line and environment for train-7 in each runtime (tests/golden_launch.py);
    podman-rootless: started by ana's own worker."""
    return golden_text(name, SPECS[name], monkeypatch, as_owner=name == "podman-rootless")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_command_lines_match_the_golden_files(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check_golden(GOLDEN, name, _golden_text(name, monkeypatch))


def test_what_each_runtime_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The promises behind the golden files, checked by name so a regenerated file cannot
    quietly drop one."""
    docker = _golden_text("docker", monkeypatch)
    assert "--gpus\n'\"device=1,3\"'\n" in docker and "--user\n1001:1001\n--group-add\n2000\n" in docker
    assert "--volume\n/home/ana/proj:/home/ana/proj\n--workdir\n/home/ana/proj\n" in docker
    assert (
        "--cpuset-cpus\n4,5\n--memory\n8192m\n" in docker
        and f"--name\n{container_name('train-7', 2, GOLDEN_CLAIM)}\n" in docker
    )
    assert "--security-opt\nno-new-privileges\n--cap-drop\nALL\n" in docker  # docker's privileges are root's
    assert "CUDA_VISIBLE_DEVICES=0,1\n" in docker  # renumbered inside: only the two GPUs exist there
    # The spec's env reaches the container through the env file on the client's stdin: never
    # on the command line (where `ps` shows it) nor in the client's own environment.
    argv, client_env, env_file = (
        docker.split("# client environment")[0],
        *docker.split("# client environment")[1].split("# client stdin (its --env-file)"),
    )
    assert "\n--env-file\n/dev/stdin\n" in argv and "offline" not in argv and "--env\n" not in argv
    assert (
        "WANDB_MODE=offline\n" in env_file
        and "WANDB_MODE" not in client_env
        and "CUDA_VISIBLE_DEVICES" not in client_env
    )
    assert "client runs as ana" in docker and docker.splitlines()[1] == "/usr/bin/docker"  # the admin's client, as ana
    # The spec's options, one argument each as checked, come first: gpuq's own flags win a repeat.
    assert "\nrun\n--shm-size=8g\n--ulimit=memlock=-1\n--rm\n" in docker
    podman = _golden_text("podman", monkeypatch)
    assert "--device\nnvidia.com/gpu=1\n--device\nnvidia.com/gpu=3\n" in podman and "--gpus" not in podman
    rootless = _golden_text("podman-rootless", monkeypatch)
    assert "--userns=keep-id\n" in rootless and "--user\n" not in rootless
    apptainer = _golden_text("apptainer", monkeypatch)
    assert "exec\n--cleanenv\n--nv\n--bind\n/home/ana/proj\n--pwd\n/home/ana/proj\n" in apptainer
    assert "APPTAINERENV_CUDA_VISIBLE_DEVICES=1,3\n" in apptainer and "client runs as ana" in apptainer


# --- options: an allow-list, read as the runtime reads them ---------------------------------------


def _container(text: str):
    return Container.from_json(
        parse_spec_text(f"command: x\ncontainer: {text}\n".encode(), "t.yaml").extras["container"]
    )


def test_allowed_options_are_kept_one_argument_each_as_the_runtime_will_read_them() -> None:
    c = _container("{image: i, options: [--shm-size, 8g, --ulimit=memlock=-1, --read-only, --network, host]}")
    assert c.options == ("--shm-size=8g", "--ulimit=memlock=-1", "--read-only", "--network=host")
    assert _container("{image: i, options: [--tmpfs=/dev/shm:size=8g]}").options == ("--tmpfs=/dev/shm:size=8g",)
    assert _container("{image: i, options: '--shm-size 8g --label a=b'}").options == ("--shm-size=8g", "--label=a=b")
    assert _container("{image: i, runtime: apptainer, options: [--writable-tmpfs, --contain]}").options == (
        "--writable-tmpfs",
        "--contain",
    )


@pytest.mark.parametrize(
    "options, said",
    [
        ("[-iu0]", "option '-iu0' is a short flag"),
        ("[--hostname, x, y]", "option 'y' is not an option"),
        ("['--', img]", "option '--' is not an option"),
        ("[--shm-size=lots]", "option --shm-size value 'lots' is not SIZE"),
        ("[--ulimit=nproc=-1]", "option --ulimit value 'nproc=-1' is not memlock|stack|nofile|core=SOFT[:HARD]"),
        ("[--tmpfs=/t:suid]", "option --tmpfs value '/t:suid' is not PATH"),
        # security review (Low): over the kernel's file systems, or a label with a C1 byte
        ("[--tmpfs=/proc]", "option --tmpfs value '/proc' is not PATH"),
        ("[--tmpfs=/sys/fs/cgroup]", "option --tmpfs value '/sys/fs/cgroup' is not PATH"),
        ("[--tmpfs=/dev]", "option --tmpfs value '/dev' is not PATH"),
        ('["--label=a=b\\x9bc"]', "option --label value"),
        ("[--label=gpuq=2]", "option --label value 'gpuq=2' is not KEY=VALUE"),
        ("[--read-only=false]", "option '--read-only=false' takes no value"),
        ("[--shm-size]", "option '--shm-size' needs a value"),
        ("[--env=A=1]", "option '--env=A=1' is not allowed"),
        ("'--shm-size \"8g'", "options '--shm-size \"8g' cannot be split into words"),
    ],
)
def test_refused_options_name_the_option_and_the_fix(options: str, said: str) -> None:
    with pytest.raises(SpecError) as refused:
        _container(f"{{image: i, runtime: docker, options: {options}}}")
    assert str(refused.value).startswith(f"t.yaml: field 'container': {said}") and "Fix: " in str(refused.value)


def test_an_option_is_checked_again_for_the_runtime_the_host_uses() -> None:
    """A spec without a runtime may carry any runtime's options (config decides at the host);
    so may a record written before the allow-list: the command line is never built with one
    the host's runtime is not allowed."""
    c = _container("{image: i, options: [--writable-tmpfs]}")
    assert c.options == ("--writable-tmpfs",)
    with pytest.raises(PermissionError) as refused:
        container_run(c, "docker", "/usr/bin/docker", ["true"], {}, "/w", [], Owner(1001, 1001), True, "gpuq-j-1")
    assert refused.value.strerror == "container option not allowed for docker"
    assert "option '--writable-tmpfs' is for apptainer, not docker" in refused.value.filename
    old = Container.from_json({"image": "i", "options": ["--gpus", "all", "-iu0"]})
    with pytest.raises(PermissionError):
        container_run(old, "podman", "/usr/bin/podman", ["true"], {}, "/w", [], Owner(1001, 1001), True, "gpuq-j-1")


def test_mount_paths_are_written_in_their_plain_form() -> None:
    for mount in ("/data/../etc:/d", "/data/:/d", "//data:/d", "/data:/d/./x"):
        with pytest.raises(SpecError, match="not in its plain form"):
            _container(f"{{image: i, mounts: ['{mount}']}}")


def test_readme_documents_every_allowed_option() -> None:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text[text.index("**Options.**") : text.index("**Mounts.**")]
    for name in ALLOWED_OPTIONS:
        assert f"`{name}" in section, f"README.md's Options paragraph does not mention {name}"


# --- real runs through worker.py ----------------------------------------------------------------


@pytest.fixture
def runtimes(tmp_path: Path):
    r = fake_runtime.StandIns(tmp_path / "runtimes")
    yield r
    r.close()


def _name(record: dict | None) -> str | None:
    """The container name of the attempt (and restart) a record describes."""
    if record is None:
        return None
    return container_name(record["id"], record["attempt"], record["claim"])


def _container_up(queue, runtimes, job_id: str, attempt: int = 1, restarts: int = 0) -> str:
    """Waits for that attempt's container to run; returns its name."""

    def up() -> str | None:
        record = queue.record(job_id)
        if (
            record
            and (record["attempt"], record.get("restarts", 0)) == (attempt, restarts)
            and _name(record) in runtimes.containers()
        ):
            return _name(record)
        return None

    # generous: two suites side by side on 2 cores took over 20 s to restart one container
    return wait_until(up, timeout=60, what=f"{job_id} attempt {attempt} (restart {restarts}) in its container")


def _kill_supervisor_and_client(queue: Queue, name: str) -> None:
    """SIGKILL the container's client, its keeper and its supervisor at once, as a power cut
    would: the container (the stand-in daemon's) is left running, and nobody kept an exit."""
    client = next(
        p
        for p in psutil.process_iter(["cmdline"])
        if "run" in (p.info["cmdline"] or []) and name in (p.info["cmdline"] or [])
    )
    keeper = client.parent()
    job_id = name.rsplit("-", 2)[0].removeprefix("gpuq-")  # gpuq-<id>-<attempt>-<tag>
    supervisors = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "gpuq.run.spawner" in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()
    ]
    for p in (keeper, client, *(s for s in supervisors if _supervises(s, queue, job_id))):
        p.kill()


def _supervises(process: psutil.Process, queue: Queue, job_id: str) -> bool:
    """Whether this spawner child is the supervisor of `job_id` in this queue: it holds the
    job's lock file under the queue's local directories. Not any supervisor of a job of that
    id: another queue's (a second copy of the suite beside this one runs the same tests and
    ids) was killed in the middle of its service's restart."""
    base = os.path.realpath(queue.local_base)  # as /proc gives open files' paths
    try:
        return any(
            f.path.startswith(f"{base}/") and f.path.endswith(f"/jobs/{job_id}.lock") for f in process.open_files()
        )
    except psutil.Error:
        return False


def _workdir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return work


@pytest.mark.slow
def test_a_docker_job_runs_inside_with_exactly_its_gpus(queue, runtimes, tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    queue.start_worker("box-a", "4x24GiB", env=runtimes.worker_env())
    queue.gpuq("submit", "--id", "blocker", "--gpus", "1", "--gpu-mem", "20GiB", "--", "sleep 30")
    wait_until(lambda: queue.record("blocker"), what="blocker running")
    inside = (
        "echo CVD=$CUDA_VISIBLE_DEVICES NVD=$NVIDIA_VISIBLE_DEVICES PWD=$(pwd) JOB=$GPUQ_JOB_ID "
        "MODE=$WANDB_MODE HOSTPATH=${VIRTUAL_ENV:-none}; exit 3"
    )
    queue.gpuq(
        "submit",
        "--id",
        "boxed",
        "--gpus",
        "2",
        "--gpu-mem",
        "10GiB",
        "--container",
        "pytorch:2",
        "--workdir",
        str(work),
        "--env",
        "WANDB_MODE=offline",
        "--",
        inside,
    )
    final = wait_until(lambda: queue.finished("boxed"), what="boxed finished")
    gpus = ",".join(map(str, final["gpus"]))
    assert final["state"] == "failed" and final["exit_code"] == 3
    assert f"CVD=0,1 NVD={gpus} PWD={work} JOB=boxed MODE=offline HOSTPATH=none" in queue.log("boxed")
    run = runtimes.calls("run")[-1]
    assert run["runtime"] == "docker" and run["args"][run["args"].index("--gpus") + 1] == f'"device={gpus}"'
    assert run["args"][run["args"].index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    client = runtimes.worker_env()["PATH"].split(":")[0] + "/docker"  # by its absolute path, as the worker found it
    assert f"==> container: {client} run --rm --init --name {_name(final)}" in queue.log("boxed")
    assert runtimes.containers() == {}  # removed with the job
    queue.gpuq("cancel", "blocker")


@pytest.mark.slow
def test_the_stand_in_inspect_answers_only_what_docker_answers(runtimes, tmp_path: Path) -> None:
    """gpuq finds a container's main process with `inspect --format {{.State.Pid}}`: the stand-in
    must answer the format asked, so a wrong one fails here as it would with docker."""
    env = {**os.environ, **runtimes.worker_env(), "FAKE_RUNTIME_DIR": str(runtimes.state)}
    docker = lambda *a: subprocess.run(
        ["docker", *a],
        env=env,
        capture_output=True,
        text=True,  # noqa: E731
        timeout=30,
    )
    run = subprocess.Popen(
        ["docker", "run", "--rm", "--name", "probe", "img", "sleep", "30"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pid = wait_until(
            lambda: (
                (out := docker("inspect", "--format", "{{.State.Pid}}", "probe")).returncode == 0 and out.stdout.strip()
            ),
            what="the container to run",
        )
        assert psutil.Process(int(pid)).is_running()
        assert docker("inspect", "--format", "{{.State.Status}}", "probe").stdout.strip() == "running"
        assert docker("inspect", "--format", "{{.State.Running}}", "probe").stdout.strip() == "true"
        wrong = docker("inspect", "--format", "{{.State.Pidd}}", "probe")
        assert wrong.returncode == 1 and "can't evaluate field Pidd" in wrong.stderr
        assert json.loads(docker("inspect", "probe").stdout)[0]["State"]["Pid"] == int(pid)
    finally:
        docker("rm", "--force", "probe")
        run.wait(timeout=30)


@pytest.mark.slow
def test_a_containers_gpu_memory_is_the_jobs_own(queue, runtimes, tmp_path: Path) -> None:
    """Its processes are the runtime daemon's children, not the supervisor's: gpuq still counts
    their memory as the job's, not as a person's use of the GPU (which would charge it twice)."""
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.gpuq(
        "submit",
        "--id",
        "holder",
        "--gpus",
        "1",
        "--gpu-mem",
        "10GiB",
        "--container",
        "pytorch:2",
        "--workdir",
        str(_workdir(tmp_path)),
        "--",
        f"{PY} {REPO / 'gpuq.py'} fake-use --seconds 60",
    )

    def observed() -> tuple | None:
        view = queue.status()
        rows = [r for r in view["running"] if r["id"] == "holder" and r.get("observed_gpu_mem_mib")]
        gpu = view["hosts"][0]["gpus"][0] if view["hosts"] else None
        return (rows[0], gpu) if rows and gpu and gpu["mem_used_mib"] >= 10240 else None

    row, gpu = wait_until(observed, timeout=30, what="the container's memory observed as the job's")
    assert row["observed_gpu_mem_mib"] == 10240
    assert gpu["usable_mib"] == 24 * 1024 - 256 - 10240  # charged once: the job's, not a stranger's
    queue.gpuq("cancel", "holder")
    wait_until(lambda: queue.finished("holder"), what="holder cancelled")


@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_cancel_stops_the_container_not_just_its_client(queue, runtimes, tmp_path: Path, runtime: str) -> None:
    """The container ignores SIGTERM (as a python PID 1 would): gpuq's stop must reach it
    through the runtime, or it would outlive its killed client."""
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.gpuq(
        "submit",
        "--id",
        "stubborn",
        "--container",
        "img",
        "--runtime",
        runtime,
        "--workdir",
        str(_workdir(tmp_path)),
        "--",
        "trap '' TERM; echo up; while true; do sleep 0.2; done",
    )
    wait_until(lambda: "up" in queue.log("stubborn"), what="container up")
    name = _container_up(queue, runtimes, "stubborn")
    pid = runtimes.containers()[name]["pid"]
    queue.gpuq("cancel", "stubborn")
    final = wait_until(lambda: queue.finished("stubborn"), timeout=30, what="stubborn cancelled")
    assert final["state"] == "cancelled"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert runtimes.containers() == {}
    stop = runtimes.calls("stop")
    assert stop and stop[-1]["runtime"] == runtime and stop[-1]["args"] == ["stop", "--time", "2", name]
    assert f"stopping container {name} ({runtime} stop --time 2)" in queue.log("stubborn")


@pytest.mark.slow
def test_a_container_left_by_a_killed_supervisor_is_removed(queue, runtimes, tmp_path: Path) -> None:
    """Supervisor and client die at once (SIGKILL): the worker that settles the attempt
    removes the container, which would otherwise hold its GPU for nobody."""
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.gpuq(
        "submit",
        "--id",
        "orphan",
        "--container",
        "img",
        "--workdir",
        str(_workdir(tmp_path)),
        "--",
        "echo up; sleep 300",
    )
    wait_until(lambda: "\nup" in queue.log("orphan"), what="container up")
    name = _container_up(queue, runtimes, "orphan")
    pid = runtimes.containers()[name]["pid"]
    _kill_supervisor_and_client(queue, name)
    final = wait_until(lambda: queue.finished("orphan"), timeout=30, what="orphan settled")
    assert final["state"] == "lost" and "exit unknown" in final["reason"]
    wait_until(lambda: runtimes.containers() == {}, what="container removed")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert runtimes.calls("rm")[-1]["args"] == ["rm", "--force", name]


@pytest.mark.slow
def test_two_roots_on_one_box_run_the_same_job_id_in_containers_of_their_own(queue, runtimes, tmp_path: Path) -> None:
    """Two queues on one box (two teams, or a test copy beside a real one) both run job
    `twin`: neither's container name is taken by the other, and a worker removing the
    container its killed supervisor left removes its own, not the other root's."""
    other = Queue(tmp_path / "root2", tmp_path / "local2")
    try:
        for q in (queue, other):
            q.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
            q.gpuq(
                "submit",
                "--id",
                "twin",
                "--gpus",
                "0",
                "--container",
                "img",
                "--workdir",
                str(_workdir(tmp_path)),
                "--",
                "echo up; sleep 300",
            )
        mine, theirs = (_container_up(q, runtimes, "twin") for q in (queue, other))
        assert mine != theirs
        _kill_supervisor_and_client(queue, mine)
        assert wait_until(lambda: queue.finished("twin"), timeout=30, what="mine settled")["state"] == "lost"
        wait_until(lambda: mine not in runtimes.containers(), what="my leftover container removed")
        assert theirs in runtimes.containers() and other.record("twin")["state"] == "running"
        assert mine in [c["args"][-1] for c in runtimes.calls("rm")]
        assert theirs not in [c["args"][-1] for c in runtimes.calls("rm")]
    finally:
        other.close()


@pytest.mark.slow
def test_preemption_stops_the_container_and_the_next_attempt_gets_its_own(queue, runtimes, tmp_path: Path) -> None:
    queue.write_config(idle_after_s=0.5, grace_s=20, lost_after_s=120)  # the job's own grace is 1 s
    queue.start_worker("box-a", "1x80GiB", env=runtimes.worker_env())
    work = _workdir(tmp_path)
    queue.drop(
        "soak.yaml",
        "command: \"trap '' TERM; echo attempt=$GPUQ_ATTEMPT; while true; do sleep 0.2; done\"\n"
        f"gpus: 1\ngpu_mem: 60GiB\npriority: low\ngrace: 1s\nworkdir: {work}\ncontainer: img\n",
    )
    first = _container_up(queue, runtimes, "soak")
    queue.drop("real.yaml", f"command: echo real\ngpus: 1\ngpu_mem: 40GiB\nworkdir: {work}\n")
    assert wait_until(lambda: queue.finished("real"), timeout=20, what="the real job")["state"] == "done"
    assert ["stop", "--time", "1", first] in [c["args"] for c in runtimes.calls("stop")]
    second = _container_up(queue, runtimes, "soak", attempt=2)
    assert second != first and first not in runtimes.containers()
    wait_until(lambda: "attempt=2" in queue.log("soak"), what="attempt 2's output")  # it starts a moment later
    queue.gpuq("cancel", "soak")
    wait_until(lambda: runtimes.containers() == {}, timeout=20, what="attempt 2 stopped")


@pytest.mark.slow
def test_a_service_restarts_in_a_fresh_container(queue, runtimes, tmp_path: Path) -> None:
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.drop(
        "svc.yaml",
        'command: "echo start $GPUQ_RESTARTS; test -e ran || { touch ran; exit 1; }; sleep 60"\n'
        f"gpus: 0\nrestart: on-failure\nworkdir: {_workdir(tmp_path)}\ncontainer: img\n",
    )
    name = _container_up(queue, runtimes, "svc", restarts=1)
    # one name per attempt: the first run's container was removed before the restart's ran
    calls = [c["args"] for c in runtimes.calls() if c["args"][:1] in (["run"], ["rm"])]
    runs = [i for i, c in enumerate(calls) if c[0] == "run"]
    assert [calls[i][calls[i].index("--name") + 1] for i in runs] == [name, name]
    assert ["rm", "--force", name] in calls[runs[0] : runs[1]], calls
    assert "start 1" in queue.log("svc")  # GPUQ_RESTARTS reaches the container
    queue.gpuq("cancel", "svc")
    assert wait_until(lambda: queue.finished("svc"), what="svc cancelled")["state"] == "cancelled"
    # the record is written, then the container removed: on a busy machine, wait for it
    wait_until(lambda: runtimes.containers() == {}, what="the cancelled service's container to go")


@pytest.mark.slow
def test_a_restarted_services_container_left_by_a_killed_supervisor_is_removed(queue, runtimes, tmp_path: Path) -> None:
    """A service's restart count reaches its record only where the disk has room (best
    effort): the container a dead supervisor leaves is found without it."""
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.drop(
        "svc.yaml",
        'command: "test -e ran || { touch ran; exit 1; }; echo up; sleep 300"\n'
        f"gpus: 0\nrestart: on-failure\nworkdir: {_workdir(tmp_path)}\ncontainer: img\n",
    )
    name = _container_up(queue, runtimes, "svc", restarts=1)
    wait_until(lambda: "\nup" in queue.log("svc"), what="the restart up")
    # as if the restart's record write had met a full disk: the record still says 0 restarts
    path = queue.root / "state" / "running" / "svc.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "restarts": 0}))
    _kill_supervisor_and_client(queue, name)
    assert wait_until(lambda: queue.finished("svc"), timeout=30, what="svc settled")["state"] == "lost"
    wait_until(lambda: runtimes.containers() == {}, what="the restart's container removed")
    assert runtimes.calls("rm")[-1]["args"] == ["rm", "--force", name]


@pytest.mark.slow
def test_a_time_limit_reaches_the_container(queue, runtimes, tmp_path: Path) -> None:
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.drop(
        "slow.yaml",
        f"command: \"trap '' TERM; while true; do sleep 0.2; done\"\ntime_limit: 2s\n"
        f"grace: 1s\nworkdir: {_workdir(tmp_path)}\ncontainer: {{image: img, runtime: podman}}\n",
    )
    final = wait_until(lambda: queue.finished("slow"), timeout=40, what="slow timed out")
    assert final["state"] == "timeout"
    assert runtimes.containers() == {}
    assert runtimes.calls("stop")[-1]["args"] == ["stop", "--time", "1", _name(final)]
    run = runtimes.calls("run")[-1]["args"]
    assert run[run.index("--device") + 1] == f"nvidia.com/gpu={final['gpus'][0]}"


@pytest.mark.slow
def test_apptainer_runs_in_the_jobs_tree_with_host_gpu_numbers(queue, runtimes, tmp_path: Path) -> None:
    queue.start_worker("box-a", "4x24GiB", env={**runtimes.worker_env(), "WORKER_ONLY": "1"})
    queue.gpuq("submit", "--id", "blocker", "--gpus", "1", "--gpu-mem", "20GiB", "--", "sleep 60")
    assert wait_until(lambda: queue.record("blocker"), what="blocker running")["gpus"] == [0]
    queue.gpuq(
        "submit",
        "--id",
        "sif",
        "--gpus",
        "1",
        "--gpu-mem",
        "4GiB",
        "--container",
        "/images/t.sif",
        "--runtime",
        "apptainer",
        "--workdir",
        str(_workdir(tmp_path)),
        "--",
        "echo CVD=$CUDA_VISIBLE_DEVICES WORKER_ONLY=${WORKER_ONLY:-unset}; sleep 60",
    )
    wait_until(lambda: "\nCVD=" in queue.log("sif"), what="sif started")
    record = queue.record("sif")
    assert record["gpus"] != [0] and f"\nCVD={record['gpus'][0]} WORKER_ONLY=unset" in queue.log("sif")  # --cleanenv
    assert runtimes.calls("exec")[-1]["args"][:4] == ["exec", "--cleanenv", "--nv", "--bind"]
    queue.gpuq("cancel", "sif")
    assert wait_until(lambda: queue.finished("sif"), what="sif cancelled")["state"] == "cancelled"
    assert not runtimes.calls("stop")  # its processes were the job's own: the process group stop was enough
    queue.gpuq("cancel", "blocker")


@pytest.mark.slow
def test_a_job_is_placed_only_where_its_runtime_is(queue, runtimes, tmp_path: Path) -> None:
    empty = tmp_path / "no-runtimes"
    empty.mkdir()
    queue.start_worker("box-a", "2x24GiB", env=runtimes.worker_env())
    queue.start_worker("box-b", "2x24GiB", env={"PATH": str(empty)})
    work = str(_workdir(tmp_path))
    queue.gpuq("submit", "--id", "anywhere", "--container", "img", "--workdir", work, "--", "sleep 30")
    queue.gpuq("submit", "--id", "on-b", "--hosts", "box-b", "--container", "img", "--workdir", work, "--", "true")
    assert wait_until(lambda: queue.record("anywhere"), what="anywhere started")["host"] == "box-a"

    def reason() -> str | None:
        rows = [p for p in queue.status()["pending"] if p["id"] == "on-b"]
        return rows[0]["reason"] if rows and "runtime" in rows[0]["reason"] else None

    assert (
        wait_until(reason, what="on-b's reason")
        == "needs container runtime docker, which no live host has (box-b: none)"
    )
    text = queue.gpuq("status", "-w").stdout  # jobs ask for containers: the host lines say what each box has
    assert "containers: apptainer 1.3.0-fake, docker 24.0.7-fake, podman 4.9.0-fake" in text
    queue.gpuq("cancel", "anywhere", "on-b")
    wait_until(lambda: not queue.status()["containers_asked"], what="no job to ask for a container")
    assert "containers:" not in queue.gpuq("status").stdout  # and once none does, they say nothing of it


@pytest.mark.slow
def test_probe_names_a_runtime_that_is_installed_but_unusable(runtimes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", runtimes.worker_env()["PATH"])
    monkeypatch.setenv("FAKE_RUNTIME_DIR", str(runtimes.state))
    found, problems = probe_runtimes()
    assert found == {"docker": "24.0.7-fake", "podman": "4.9.0-fake", "apptainer": "1.3.0-fake"} and not problems
    runtimes.daemon.terminate()
    runtimes.daemon.wait()
    found, problems = probe_runtimes()
    assert "docker" not in found and "Cannot connect to the Docker daemon" in problems["docker"]


def test_plan_keeps_container_jobs_off_hosts_without_their_runtime() -> None:
    gpus = (GpuSnapshot(0, "GPU-0", "g", 24576, 0),)
    spec = parse_spec_text(b"command: x\ncontainer: {image: i, runtime: apptainer}\n", "t")
    job = PendingJob("j", "ana", spec, 0.0)
    hosts = [HostView("a", gpus, 2, runtimes=frozenset({"docker"})), HostView("b", gpus, 2, runtimes=frozenset())]
    decided = plan([job], hosts, [], Config(), 10.0, needs=hooks.needs_of(Config()))
    assert (
        decided.starts == []
        and decided.reasons["j"] == "needs container runtime apptainer, which no live host has (a: docker; b: none)"
    )
    hosts.append(HostView("c", gpus, 2, runtimes=frozenset({"apptainer"})))
    assert [s.host for s in plan([job], hosts, [], Config(), 10.0, needs=hooks.needs_of(Config())).starts] == ["c"]
    plain = PendingJob("p", "ana", parse_spec_text(b"command: x\n", "t"), 0.0)
    assert (
        plan([plain], hosts[1:2], [], Config(), 10.0, needs=hooks.needs_of(Config())).starts[0].host == "b"
    )  # no container: any host


# --- venv, conda, setup ---------------------------------------------------------------------------


@pytest.mark.slow
def test_venv_conda_and_setup_run_before_the_command(queue, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    conda = tmp_path / "conda"  # a stand-in conda: prints what `conda shell.posix activate` would
    conda.write_text(
        "#!/bin/sh\n[ \"$1 $2\" = 'shell.posix activate' ] || exit 2\n"
        "echo \"export CONDA_DEFAULT_ENV='$3'; export CONDA_PREFIX='/opt/conda/envs/$3'\"\n"
    )
    conda.chmod(0o755)
    queue.start_worker("box-a", "1x24GiB")
    queue.drop(
        "envs.yaml",
        f'command: [python, -c, \'import os, sys; print(sys.prefix, os.environ["CONDA_DEFAULT_ENV"], '
        f'os.environ["SEED"])\']\ngpus: 0\nvenv: {venv}\nconda: torch-2.3\nenv: {{CONDA_EXE: {conda}}}\n'
        f"setup: ['SEED=$((40 + 2)); export SEED', 'test -d {venv}']\n",
    )
    final = wait_until(lambda: queue.finished("envs"), what="envs finished")
    assert final["state"] == "done", queue.log("envs")
    assert f"{venv} torch-2.3 42" in queue.log("envs")

    queue.drop("badsetup.yaml", "command: echo never\ngpus: 0\nsetup: ['true', 'sh -c \"exit 7\"', 'echo no']\n")
    final = wait_until(lambda: queue.finished("badsetup"), what="badsetup finished")
    assert final["state"] == "failed" and final["exit_code"] == 7
    assert '==> gpuq: setup line 2 failed: sh -c "exit 7"' in queue.log("badsetup")
    assert "\nnever" not in queue.log("badsetup") and "\nno" not in queue.log("badsetup")

    queue.drop("novenv.yaml", f"command: echo never\ngpus: 0\nvenv: {tmp_path / 'missing'}\n")
    final = wait_until(lambda: queue.finished("novenv"), what="novenv finished")
    assert final["state"] == "failed" and "no bin/activate (make it with: python -m venv" in queue.log("novenv")


@pytest.mark.slow
def test_a_venv_is_activated_inside_the_container(queue, runtimes, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    queue.start_worker("box-a", "1x24GiB", env=runtimes.worker_env())
    queue.gpuq(
        "submit",
        "--id",
        "both",
        "--gpus",
        "0",
        "--container",
        "img",
        "--venv",
        str(venv),
        "--mount",
        f"{venv}:{venv}:ro",
        "--workdir",
        str(_workdir(tmp_path)),
        "--",
        "python",
        "-c",
        "import sys; print('prefix', sys.prefix)",
    )
    final = wait_until(lambda: queue.finished("both"), what="both finished")
    assert final["state"] == "done" and f"prefix {venv}" in queue.log("both")
    run = runtimes.calls("run")[-1]["args"]
    assert f"{venv}:{venv}:ro" in run


# --- submit --export, show ------------------------------------------------------------------------


@pytest.mark.slow
def test_submit_records_the_environment_as_sbatch_export_does(queue, tmp_path: Path) -> None:
    env = {**queue.env(), "FOO": "1", "BAR": "2"}
    spec = lambda job_id: (queue.root / "jobs" / f"{job_id}.yaml").read_text()  # noqa: E731
    queue.gpuq("submit", "--id", "all", "--", "true", env=env)
    assert "FOO: '1'" in spec("all") and "BAR: '2'" in spec("all")
    queue.gpuq("submit", "--id", "some", "--export", "FOO,SEED=3", "--", "true", env=env)
    assert "FOO: '1'" in spec("some") and "SEED: '3'" in spec("some") and "BAR" not in spec("some")
    queue.gpuq("submit", "--id", "none", "--export", "NONE", "--", "true", env=env)
    assert "FOO" not in spec("none") and "PATH" not in spec("none")
    queue.gpuq("submit", "--id", "boxed", "--container", "img", "--", "true", env=env)
    assert "FOO" not in spec("boxed") and "PATH" not in spec("boxed")  # the image's PATH, not the host's
    queue.gpuq(
        "submit",
        "--id",
        "envs",
        "--conda",
        "torch-2.3",
        "--setup",
        "export A=1",
        "--setup",
        "./fetch.sh",
        "--",
        "true",
        env=env,
    )
    assert "conda: torch-2.3\nsetup:\n- export A=1\n- ./fetch.sh\n" in spec("envs")
    bad = queue.gpuq("submit", "--export", "1BAD", "--", "true", check=False)
    assert bad.returncode == 2 and "--export: '1BAD' is not a variable name" in bad.stderr
    shown = queue.gpuq("show", "some", "--env").stdout
    assert "will run:" in shown and "FOO=1" in shown and "SEED=3" in shown and "GPUQ_JOB_ID=some" in shown
    boxed = json.loads(queue.gpuq("show", "boxed", "--json").stdout)
    assert boxed["sees"]["argv"][:3] == ["docker", "run", "--rm"] and boxed["sees"]["runtime"] == "docker"


@pytest.mark.slow
def test_bad_environment_fields_are_rejected_with_the_fix(queue) -> None:
    queue.start_worker("box-a", "1x24GiB")
    queue.drop("gpus-opt.yaml", "command: x\ncontainer: {image: i, options: ['--gpus=all']}\n")
    error = wait_until(
        lambda: (
            (queue.root / "state" / "rejected" / "gpus-opt.error").exists()
            and (queue.root / "state" / "rejected" / "gpus-opt.error").read_text()
        ),
        what="rejection",
    )
    assert (
        "field 'container': option '--gpus=all' is not allowed" in error
        and "Fix: gpuq gives the container exactly" in error
    )
    refused = queue.gpuq(
        "submit", "--container", "img", "--runtime", "docker", "--mount", "data:/d", "--", "true", check=False
    )
    assert refused.returncode == 2 and "mount 'data:/d' is not host:container[:ro]" in refused.stderr
    alone = queue.gpuq("submit", "--runtime", "podman", "--", "true", check=False)
    assert alone.returncode == 2 and "--runtime and --mount are for a container: add --container IMAGE" in alone.stderr
    assert not list((queue.root / "jobs").glob("*.yaml"))


@pytest.mark.slow
def test_fake_use_inside_a_container_uses_the_host_gpus_it_was_given(tmp_path: Path) -> None:
    from gpuq.host.fake_nvml import materialize, registered

    fake = materialize("4x24GiB", tmp_path)
    proc = subprocess.Popen(
        [PY, str(REPO / "gpuq.py"), "fake-use", "--mem", "1GiB", "--seconds", "30"],
        env={**os.environ, "GPUQ_FAKE_GPUS": str(fake), "CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": "2,3"},
    )
    try:
        used = wait_until(lambda: registered(fake.parent / "use"), what="fake use registered")
        assert sorted(p["gpu"] for p in used) == [2, 3]
    finally:
        proc.kill()
        proc.wait()


# --- real runtimes: podman and docker (installed with apt-get where missing; CI runs as root) ------


@pytest.fixture(scope="module", params=["podman", "docker"])
def real(request, tmp_path_factory):
    """(runtime, the environment a worker needs to use it)."""
    try:
        if request.param == "podman":
            yield "podman", real_runtimes.podman_ready(tmp_path_factory.mktemp("podman"))
            return
        dockerd = real_runtimes.Dockerd()
    except real_runtimes.RuntimeUnavailable as e:
        pytest.skip(f"{request.param} cannot run containers here: {e}")
    yield "docker", dockerd.env
    dockerd.stop()


def test_a_real_container_runs_the_job_and_is_stopped_on_cancel(queue, real, tmp_path: Path) -> None:
    runtime, env = real
    work = _workdir(tmp_path)
    queue.start_worker("box-a", "1x24GiB", env=env)
    wait_until(lambda: any(runtime in h["runtimes"] for h in queue.status()["hosts"]), what=f"{runtime} probed")
    queue.gpuq(
        "submit",
        "--id",
        "real",
        "--gpus",
        "0",
        "--container",
        real_runtimes.IMAGE,
        "--runtime",
        runtime,
        "--workdir",
        str(work),
        "--env",
        "GREETING=hello",
        "--",
        "echo $GREETING from a container as $(id -u); echo written > out.txt; pwd; exit 4",
    )
    final = wait_until(lambda: queue.finished("real"), timeout=60, what=f"the {runtime} job")
    assert final["state"] == "failed" and final["exit_code"] == 4, queue.log("real")
    assert f"hello from a container as {os.getuid()}" in queue.log("real") and f"\n{work}\n" in queue.log("real")
    assert (work / "out.txt").read_text() == "written\n"  # the workdir was mounted, at its own path
    # this job's own container (podman's store is the machine's: another copy's may be there)
    assert real_runtimes.containers_named(runtime, _name(final), env) == []

    queue.gpuq(
        "submit",
        "--id",
        "real-stubborn",
        "--gpus",
        "0",
        "--container",
        real_runtimes.IMAGE,
        "--runtime",
        runtime,
        "--workdir",
        str(work),
        "--",
        "trap '' TERM; echo up; while :; do sleep 1; done",
    )
    wait_until(lambda: "\nup" in queue.log("real-stubborn"), timeout=60, what="the stubborn container up")
    name = _name(queue.record("real-stubborn"))
    assert real_runtimes.containers_named(runtime, name, env) == [name]
    queue.gpuq("cancel", "real-stubborn")
    final = wait_until(lambda: queue.finished("real-stubborn"), timeout=60, what="the stubborn container stopped")
    assert final["state"] == "cancelled"
    assert real_runtimes.containers_named(runtime, name, env) == []


def test_a_container_spec_keeps_its_field_through_json_and_the_shared_cache() -> None:
    """The core keeps an extra's field as JSON (JobSpec.extras), at the top of the spec's JSON
    as a spec writes it; a record from before the extra says `container: null`, which is none."""
    from gpuq.model.spec import JobSpec

    spec = parse_spec_text(b"command: x\ncontainer: {image: 'ubuntu:22.04'}\nsetup: ['a']\npriority: low\n", "f")
    assert JobSpec.from_cache(spec.to_cache()) == spec == JobSpec.from_json(spec.to_json())
    assert spec.to_json()["container"] == {"image": "ubuntu:22.04", "runtime": None, "mounts": [], "options": []}
    assert JobSpec.from_json({**JobSpec(command="x").to_json(), "container": None}).extras == {}
