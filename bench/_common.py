"""Helpers shared by the benchmarks: a fresh queue root and the real worker.py."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def make_root(prefix: str, **config: object) -> Path:
    """A fresh queue root with the default config, except `config`. Its local directories
    are the default ones (see `remove_root`)."""
    root = Path(tempfile.mkdtemp(prefix=f"gpuq-bench-{prefix}-"))
    (root / "jobs").mkdir()
    if os.geteuid() == 0:  # a bench run as root drops root's specs
        config = {"allow_root_jobs": True, **config}
    (root / "config.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    return root


def remove_root(root: Path, *hosts: str) -> None:
    """Remove a root made by `make_root` and the default local directories of `hosts`."""
    sys.path.insert(0, str(REPO))
    from gpuq.single_instance import fake_gpus_dir
    from gpuq.spool.layout import Layout

    for host in hosts:
        local_dir = Layout(root).default_local_dir(host)
        shutil.rmtree(local_dir, ignore_errors=True)
        shutil.rmtree(f"{local_dir}-mps", ignore_errors=True)  # MPS daemons' (the mps extra)
        shutil.rmtree(fake_gpus_dir(local_dir), ignore_errors=True)  # the fake GPUs' (no real ones)
    shutil.rmtree(root, ignore_errors=True)


def compile_code() -> None:
    """Compile gpuq's modules to bytecode, as installing the package does (pip compiles them;
    README's shared setup installs with pip). A checkout run where Python may not write
    bytecode (a member's read-only checkout, or PYTHONDONTWRITEBYTECODE) compiles every module
    at every command instead: ~0.1 s of a command's start that timings of gpuq's own work
    should not carry."""
    import compileall

    compileall.compile_dir(str(REPO / "gpuq"), quiet=1)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}


def start_worker(root: Path, host: str, fake: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [PY, str(REPO / "worker.py"), "--root", str(root), "--host", host, "--fake-gpus", fake, "--foreground", *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=clean_env(),
    )


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        time.sleep(0.02)


def timed(cmd: list[str], repeat: int = 5) -> float:
    """Median wall seconds of `cmd` over `repeat` runs."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=clean_env())
        times.append(time.perf_counter() - t)
    return statistics.median(times)
