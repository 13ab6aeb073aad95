"""`gpuq demo`: the whole flow on fake GPUs, through the real worker.py and gpuq.py.

Two stand-in boxes with 4 fake 24 GiB GPUs each; a dozen jobs of mixed sizes submitted the
way a user would; the status screen while they are claimed, packed and run; a log; the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuq.host.files import atomic_write

REPO = Path(__file__).resolve().parents[2]


def _launchers() -> tuple[list[str], list[str]]:
    """How to run a worker and the CLI: a checkout's worker.py and gpuq.py, else (a venv with
    gpuq installed) the installed package itself."""
    if (REPO / "worker.py").exists() and (REPO / "gpuq.py").exists():
        return [sys.executable, str(REPO / "worker.py")], [sys.executable, str(REPO / "gpuq.py")]
    run = "import sys; from gpuq.{} import main; sys.exit(main())"
    return [sys.executable, "-c", run.format("worker_main")], [sys.executable, "-c", run.format("cli")]


JOBS = [  # (gpus, gpu_mem, seconds)
    (1, "20GiB", 4),
    (1, "20GiB", 4),
    (1, "10GiB", 3),
    (1, "10GiB", 3),
    (1, "6GiB", 2),
    (2, "16GiB", 5),
    (1, None, 3),
    (4, "8GiB", 3),
    (1, "12GiB", 2),
    (0, None, 2),
    (1, "4GiB", 2),
]
# Fits no GPU of the demo's boxes: `gpuq submit` refuses it; written by hand into jobs/, it
# waits, and status says why; the demo then cancels it.
TOO_BIG = "train-30GiB-1"


def run(root: Path | None = None, quick: bool = False, keep: bool = False) -> int:
    """The demo in `root` (default: a temp dir, removed at the end unless `keep`)."""
    made = root is None
    root = root or Path(tempfile.mkdtemp(prefix="gpuq-demo-"))
    try:
        return _run(root, quick)
    finally:
        if made and not keep:
            shutil.rmtree(root, ignore_errors=True)
            print(f"# removed the demo's queue root {root} (gpuq demo --keep keeps it to look around)")
        else:
            worker, cli = _launchers()
            print(
                f"# the queue root stays: {shlex.join([*cli, '--root', str(root), 'status'])} shows it;\n"
                f"# its boxes' workers have stopped: {shlex.join([*worker, '--root', str(root), '--host', 'box-a'])} "
                f"--fake-gpus 4x24GiB starts box-a again, to try more submits; rm -rf {root} removes it"
            )


def _run(root: Path, quick: bool) -> int:
    _write_config(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    worker, cli = _launchers()
    gpuq = [*cli, "--root", str(root)]
    print(f"# demo queue root: {root}\n# starting two workers: box-a and box-b, 4 fake 24GiB GPUs each")
    stderr = {host: root / f"worker-{host}.stderr" for host in ("box-a", "box-b")}
    workers = _start_workers(root, worker, stderr, env)
    try:
        if not _workers_reported(root, stderr, workers):  # submit judges sizes by the GPUs workers report
            return 1
        ids = _submit_jobs(root, gpuq, cli, env, quick)
        _show_status_until_done(root, gpuq, env, ids)
        return _show_the_rest(root, gpuq, env, ids)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()


def _write_config(root: Path) -> None:
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    # Run as root (a container, CI), the demo's own specs are root's: let them run.
    allow_root = "allow_root_jobs: true\n" if os.geteuid() == 0 else ""
    # No write through a link, even in a --dir someone else can write.
    config = f"poll_interval: 0.5\nlocal_dir: {root}/local-{{host}}\n{allow_root}"
    atomic_write(root / "config.yaml", config.encode(), 0o644)


def _start_workers(
    root: Path, worker: list[str], stderr: dict[str, Path], env: dict[str, str]
) -> list[subprocess.Popen]:
    """A worker for each box of `stderr`, on fake GPUs, its stderr in that file."""
    workers = []
    for host, path in stderr.items():
        with open(path, "wb") as err:
            workers.append(
                subprocess.Popen(
                    [*worker, "--root", str(root), "--host", host, "--fake-gpus", "4x24GiB", "--foreground"],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=env,
                )
            )
    return workers


def _workers_reported(root: Path, stderr: dict[str, Path], workers: list[subprocess.Popen]) -> bool:
    """Whether every worker wrote its heartbeat; if one did not, its stderr is shown."""
    for (host, path), proc in zip(stderr.items(), workers):
        deadline = time.monotonic() + 120
        while not (root / "state" / "workers" / f"{host}.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                print(
                    f"# the worker of {host} did not start:\n{path.read_text(errors='replace')[-2000:]}",
                    file=sys.stderr,
                )
                return False
            time.sleep(0.1)
    return True


def _submit_jobs(root: Path, gpuq: list[str], cli: list[str], env: dict[str, str], quick: bool) -> list[str]:
    """The demo's JOBS, a submit refused as too big, and the same job written by hand (it
    waits; TOO_BIG, last). Returns their ids."""
    ids = []
    scale = 0.3 if quick else 1.0
    for gpus, mem, seconds in JOBS:
        work = (
            f'echo "training on GPUs [$CUDA_VISIBLE_DEVICES] with $GPUQ_GPU_MEM_MIB MiB each"; '
            f"exec {shlex.join(cli)} fake-use --seconds {seconds * scale}"
        )
        args = (
            ["submit", "--gpus", str(gpus)]
            + (["--gpu-mem", mem] if mem else [])
            + ["--name", f"train-{mem or 'whole' if gpus else 'cpu'}", "--", "sh", "-c", work]
        )
        out = subprocess.run(gpuq + args, capture_output=True, text=True, env=env, check=True)
        ids.append(out.stdout.split()[-1])
    print(f"# submitted {len(ids)} jobs: gpuq submit --gpus N --gpu-mem SIZE -- COMMAND\n")
    print("$ gpuq submit --gpu-mem 30GiB -- python train.py")
    print(
        subprocess.run(
            gpuq + ["submit", "--gpu-mem", "30GiB", "--", "python", "train.py"],
            capture_output=True,
            text=True,
            env=env,
        ).stderr
    )
    print(f"# the same job written by hand as jobs/{TOO_BIG}.yaml waits; status says why\n")
    # (as an editor saves it: whole, under a temp name, then renamed in)
    atomic_write(root / "jobs" / f"{TOO_BIG}.yaml", b"command: python train.py\ngpus: 1\ngpu_mem: 30GiB\n", 0o644)
    ids.append(TOO_BIG)
    return ids


def _show_status_until_done(root: Path, gpuq: list[str], env: dict[str, str], ids: list[str]) -> None:
    """`gpuq status` twice while the jobs run, and once more when all but the waiting one
    ended (or two minutes passed)."""
    deadline = time.monotonic() + 120
    shown = 0
    while time.monotonic() < deadline:
        time.sleep(1.0 if shown else 1.5)
        finished = len(list((root / "state" / "finished").glob("*.json")))
        if shown < 2 or finished >= len(ids) - 1:
            print(f"$ gpuq status   (look {shown + 1})")
            print(subprocess.run(gpuq + ["status"], capture_output=True, text=True, env=env).stdout)
            shown += 1
        if finished >= len(ids) - 1:
            break


def _show_the_rest(root: Path, gpuq: list[str], env: dict[str, str], ids: list[str]) -> int:
    """Cancel the waiting job, show a log and a job, and count how the jobs ended: 0 when all
    but the cancelled one are done."""
    print(f"$ gpuq cancel {ids[-1]}")
    print(subprocess.run(gpuq + ["cancel", ids[-1]], capture_output=True, text=True, env=env).stdout)
    print(f"$ gpuq logs {ids[0]}")
    print(subprocess.run(gpuq + ["logs", ids[0]], capture_output=True, text=True, env=env).stdout)
    print(f"$ gpuq show {ids[5]}")
    print(subprocess.run(gpuq + ["show", ids[5]], capture_output=True, text=True, env=env).stdout)
    states = [json.loads(p.read_text())["state"] for p in (root / "state" / "finished").glob("*.json")]
    print(
        f"# {len(states)}/{len(ids)} jobs finished: {states.count('done')} done, "
        f"{states.count('cancelled')} cancelled (as asked), "
        f"{len(states) - states.count('done') - states.count('cancelled')} failed or lost"
    )
    return 0 if states.count("done") == len(ids) - 1 and states.count("cancelled") == 1 else 1


def cmd_demo(args: argparse.Namespace) -> int:

    return run(Path(args.dir) if args.dir else None, quick=args.quick, keep=args.keep)
