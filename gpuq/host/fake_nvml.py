"""A fake NVML backed by a JSON file that is re-read on every call, so tests, demos and
benchmarks run the real probe code with no GPU. Selected by `--fake-gpus SPEC` or
GPUQ_FAKE_GPUS=SPEC, where SPEC is `4x80GiB` or a path to such a JSON file:

    {"gpus": [{"name": "...", "uuid": "...", "memory_total_mib": 81920,
               "memory_used_mib": 0, "utilization": 0, "temperature": 35}],
     "processes": [{"pid": 123, "gpu": 0, "used_mib": 20480, "util": 60}]}

Processes count as memory users while their pid is alive. `gpuq fake-use` registers the
calling job for its lifetime (see `use`): a file `use/<pid>.json` beside the GPUs' file, in a
sticky directory every user may create in, since under a root worker a job runs as its owner,
who may not write the worker's files. A registration counts only for a live pid of the file's
own owner: nobody makes another's process look like a GPU user.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpuq.host.files import atomic_write
from gpuq.host.hostinfo import ensure_private_dir
from gpuq.model.units import parse_size_mib
from gpuq.single_instance import fake_gpus_dir

_SHAPE_RE = re.compile(r"^(\d+)x(\S+)$")


class NVMLError(Exception):
    pass


def materialize(spec: str, local_dir: Path) -> Path:
    """`4x80GiB` -> a JSON file in the host's fake dir (kept if it has that shape), with its
    `use/` directory; a path -> that path."""
    match = _SHAPE_RE.match(spec)
    if not match:
        path = Path(spec)
        if not path.is_file():
            raise NVMLError(f"--fake-gpus {spec!r}: neither COUNTxSIZE (like 4x80GiB) nor a JSON file")
        return path.resolve()
    count, total = int(match.group(1)), parse_size_mib(match.group(2))
    path = ensure_private_dir(Path(fake_gpus_dir(local_dir)), "the fake GPUs' directory", others_read=True) / (
        f"fake-gpus-{count}x{total}MiB.json"
    )
    use_dir(path).mkdir(exist_ok=True)
    os.chmod(use_dir(path), 0o1777)  # every job's owner registers its use; the sticky bit keeps them apart
    if not path.exists():
        import hashlib

        tag = hashlib.sha1(str(local_dir).encode()).hexdigest()[:8]  # distinct per stand-in host
        gpus = [
            {
                "name": f"Fake GPU {match.group(2)}",
                "uuid": f"GPU-fake-{tag}-{i}",
                "memory_total_mib": total,
                "memory_used_mib": 0,
                "utilization": 0,
                "temperature": 35,
            }
            for i in range(count)
        ]
        _write(path, {"gpus": gpus, "processes": []})
    return path


def use_dir(path: Path) -> Path:
    return path.parent / "use"


def _write(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(data, indent=1).encode(), mode=0o644)  # the jobs read it (fake-use)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; it holds no GPU memory.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


class FakeNvml:
    """The pynvml functions gpuq calls, answering from the JSON file."""

    NVMLError = NVMLError

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    def _load(self) -> dict[str, Any]:
        """The file as it is now: re-checked on every call, re-parsed when it changed."""
        try:
            st = os.stat(self.path)
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            if self._cache is None or self._cache[0] != key:
                self._cache = (key, json.loads(self.path.read_bytes()))
            return self._cache[1]
        except (OSError, ValueError) as e:
            raise NVMLError(f"fake GPU file {self.path}: {e}") from None

    def nvmlInit(self) -> None:
        self._load()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._load()["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise NVMLError("invalid argument")
        return index

    def _gpu(self, handle: int) -> dict[str, Any]:
        return self._load()["gpus"][handle]

    def _procs(self, handle: int) -> list[dict[str, Any]]:
        listed = self._load().get("processes", []) + registered(use_dir(self.path))
        return [p for p in listed if p.get("gpu") == handle and _alive(int(p["pid"]))]

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpu(handle)["name"]

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle)["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        gpu = self._gpu(handle)
        used = gpu.get("memory_used_mib", 0) + sum(p.get("used_mib", 0) for p in self._procs(handle))
        total = gpu["memory_total_mib"]
        return SimpleNamespace(total=total * 2**20, used=min(used, total) * 2**20, free=max(0, total - used) * 2**20)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        util = self._gpu(handle).get("utilization", 0) + sum(p.get("util", 0) for p in self._procs(handle))
        return SimpleNamespace(gpu=min(100, util), memory=0)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._gpu(handle).get("temperature", 35)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int(self._gpu(handle).get("power_w", 60) * 1000)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [
            SimpleNamespace(pid=int(p["pid"]), usedGpuMemory=p.get("used_mib", 0) * 2**20) for p in self._procs(handle)
        ]


def _mps_limit_mib(value: str) -> int | None:
    """Device 0's limit in CUDA_MPS_PINNED_DEVICE_MEM_LIMIT ("0=20480M"), in MiB."""
    for part in value.split(","):
        device, _, size = part.partition("=")
        if device.strip() == "0" and size.strip():
            try:
                return parse_size_mib(size.strip())
            except ValueError:
                return None
    return None


MAX_USE_BYTES = 4096
MAX_USERS = 1000


def registered(directory: Path) -> list[dict[str, Any]]:
    """The uses `gpuq fake-use` registered in `directory` (`<pid>.json`, each a list of
    {gpu, used_mib, util}): only plain files, only for a live pid whose owner is the file's
    (a member's file is hostile input to the worker that reads it), at most MAX_USERS."""
    found: list[dict[str, Any]] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    # Only names of this form, and only then at most MAX_USERS: junk named to sort first
    # must not hide the registrations (a security review, 2026-12-06).
    names = sorted(n for n in names if n.endswith(".json") and n[: -len(".json")].isdigit())[:MAX_USERS]
    for name in names:
        stem = name[: -len(".json")]
        try:
            fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or os.stat(f"/proc/{stem}").st_uid != st.st_uid:
                continue
            uses = json.loads(os.read(fd, MAX_USE_BYTES))
        except (OSError, ValueError, RecursionError):  # [[[[...: nested past what json reads
            continue
        finally:
            os.close(fd)
        if isinstance(uses, list):
            found += [
                {"pid": int(stem), "gpu": u["gpu"], "used_mib": u["used_mib"], "util": u["util"]}
                for u in uses
                if isinstance(u, dict) and all(type(u.get(k)) is int and u[k] >= 0 for k in ("gpu", "used_mib", "util"))
            ]
    return found


def use(mem_mib: int, util: int, seconds: float | None, command: list[str]) -> int:
    """Make this process (and so its job) use fake memory on its CUDA_VISIBLE_DEVICES for
    its lifetime: sleep `seconds`, or run `command` and return its exit code."""
    import subprocess

    spec = os.environ.get("GPUQ_FAKE_GPUS")
    if not spec or not Path(spec).is_file():
        raise NVMLError(
            "GPUQ_FAKE_GPUS does not name a fake GPU file; run this inside a gpuq job "
            "on a worker started with --fake-gpus"
        )
    path = Path(spec)
    by_uuid = {g["uuid"]: i for i, g in enumerate(json.loads(path.read_bytes()).get("gpus", []))}
    visible = [
        int(i) if i.strip().isdigit() else by_uuid[i.strip()]
        for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        if i.strip() and (i.strip().isdigit() or i.strip() in by_uuid)
    ]
    limit = _mps_limit_mib(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""))
    if limit is not None and mem_mib > limit:  # as the driver refuses an MPS client beyond its limit
        print(
            f"CUDA error: out of memory: {mem_mib} MiB asked, MPS pinned device memory limit {limit} MiB",
            file=sys.stderr,
        )
        return 2
    # Inside a docker/podman container the job's GPUs are numbered from 0, and the NVIDIA
    # container runtime names the host's in NVIDIA_VISIBLE_DEVICES: fake memory goes there.
    host_gpus = os.environ.get("NVIDIA_VISIBLE_DEVICES", "").split(",")
    if all(g.strip().isdigit() for g in host_gpus) and all(i < len(host_gpus) for i in visible):
        visible = [int(host_gpus[i]) for i in visible]
    if not use_dir(path).is_dir():  # a fake GPUs' file named by its path (tests): its use/ is made here
        use_dir(path).mkdir(mode=0o1777)
    mine = use_dir(path) / f"{os.getpid()}.json"  # this process's, as its owner: a file of its own
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump([{"gpu": gpu, "used_mib": mem_mib, "util": util} for gpu in visible], f)
    try:
        if command:
            return subprocess.call(command)
        time.sleep(seconds or 0)
        return 0
    finally:
        mine.unlink(missing_ok=True)
