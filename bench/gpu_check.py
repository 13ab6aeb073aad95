#!/usr/bin/env python3
"""GPU check, for a real NVIDIA box with PyTorch: a worker against the real NVML runs two
PyTorch jobs that allocate known amounts, and this script checks that

  1. the probe sees their memory (observed per job >= what each allocated),
  2. the accounting holds (usable memory on their GPU <= total - reserve - declared sum,
     and no GPU ever held more declared memory than it has),
  3. each job's CUDA_VISIBLE_DEVICES is the GPU its record names: the UUID torch reports
     inside the job equals NVML's UUID of the GPU in the record.

    python bench/gpu_check.py            # exit 0 when every check passes
    python bench/gpu_check.py --fake     # the same checks on fake GPUs, no torch (keeps it ready)
    python bench/gpu_check.py --container pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime [--runtime podman]

With --container the jobs run inside that image (it must have python and torch; docker needs
the NVIDIA Container Toolkit, podman a CDI spec from `nvidia-ctk cdi generate`), and the checks
add: torch inside sees exactly one GPU, and the container's memory counts as its job's.

    python bench/gpu_check.py --mps      # config gpu_sharing: mps (run as root, as the worker is)

With --mps the two jobs share one GPU as clients of the MPS control daemon the worker starts
for it (nvidia-cuda-mps-control must be on PATH), and the checks add: each job saw its pipe
directory, compute share and memory limit; a third job that allocates more than its gpu_mem
is refused by the driver (CUDA out of memory); the daemon stops once the GPU is empty.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from _common import PY, REPO, clean_env, make_root, remove_root

sys.path.insert(0, str(REPO))
from gpuq.model.config import Config  # noqa: E402

JOB = r"""
import os, time, torch
mps = ("PIPE_DIRECTORY", "ACTIVE_THREAD_PERCENTAGE", "PINNED_DEVICE_MEM_LIMIT")
print("MPS", *(os.environ.get("CUDA_MPS_" + k, "-") for k in mps), flush=True)
mib = int(os.environ["ALLOC_MIB"])
x = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("UUID", str(torch.cuda.get_device_properties(0).uuid))
print("CVD", os.environ["CUDA_VISIBLE_DEVICES"], "ORDER", os.environ["CUDA_DEVICE_ORDER"], flush=True)
print("COUNT", torch.cuda.device_count(), flush=True)
time.sleep(float(os.environ.get("HOLD_S", "12")))
"""
FAKE_JOB = r"""
import json, os, sys
sys.path.insert(0, os.environ["GPUQ_REPO"])
from gpuq.host import fake_nvml
mps = ("PIPE_DIRECTORY", "ACTIVE_THREAD_PERCENTAGE", "PINNED_DEVICE_MEM_LIMIT")
print("MPS", *(os.environ.get("CUDA_MPS_" + k, "-") for k in mps), flush=True)
gpus = json.load(open(os.environ["GPUQ_FAKE_GPUS"]))["gpus"]
cvd = os.environ["CUDA_VISIBLE_DEVICES"]
print("UUID", cvd if cvd.startswith("GPU-") else gpus[int(cvd)]["uuid"])
print("CVD", cvd, "ORDER", os.environ["CUDA_DEVICE_ORDER"], flush=True)
# Held until the check has seen it run (RELEASE appears) or HOLD_S, + a context's memory.
wait = "import os, sys, time\nend = time.monotonic() + float(sys.argv[2])\n" \
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < end: time.sleep(0.1)"
hold = [sys.executable, "-c", wait, os.environ["RELEASE"], os.environ["HOLD_S"]]
sys.exit(fake_nvml.use(int(os.environ["ALLOC_MIB"]) + 300, 50, None, hold))
"""
JOBS = {"torch-a": (2048, "4GiB"), "torch-b": (3072, "5GiB")}  # allocate MiB, declare
GREEDY = ("torch-greedy", (6144, "4GiB"))  # --mps: allocates beyond its gpu_mem


def _together(views: list[dict], job_ids: set[str]) -> bool:
    """Three views in a row in which all of `job_ids` run, and every running job (theirs and
    any other, as --mps's greedy one that comes and is refused) on the same GPUs throughout:
    the middle view is one check_accounting checks exactly. Released on their own three, a
    loaded machine once let the jobs go while the greedy one came and went, and no view was."""
    placed = [{r["id"]: (r["host"], tuple(r["gpus"])) for r in v["running"]} for v in views]
    return len(views) == 3 and all(p == placed[0] for p in placed) and job_ids <= set(placed[0])


def check(ok: bool, what: str, failures: list[str]) -> None:
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def check_accounting(views: list[dict], reserve_mib: int, failures: list[str], exact: bool = False) -> None:
    """In every snapshot, on every GPU: the declared memory of the jobs on it fits the GPU, and
    the usable memory status offers is at most total - reserve - declared (`exact`: equal to
    it, where nothing but gpuq's jobs uses the GPUs and each uses less than it declared, as on
    fake GPUs: a double charge shows). Vacuous unless some snapshot had a job on a GPU, so
    that is checked too."""
    worst: dict[tuple, tuple[int, int, int, int]] = {}  # (host, GPU) -> (excess, usable, total, declared)
    with_jobs = steady_with_jobs = 0

    def on_gpu(view: dict, host: str, index: int) -> frozenset:
        return frozenset(r.get("id") for r in view["running"] if r["host"] == host and index in r["gpus"])

    for k, view in enumerate(views):
        for host in view.get("hosts", []):
            for g in host["gpus"]:
                mine = [r for r in view["running"] if r["host"] == host["host"] and g["index"] in r["gpus"]]
                # Exact only where the GPU's jobs are the same in the views before and after: a
                # job's memory is freed a moment after its record goes (and a status view reads
                # the GPUs and the records at different moments).
                around = [on_gpu(v, host["host"], g["index"]) for v in views[max(0, k - 1) : k + 2]]
                steady = len(set(around)) == 1
                steady_with_jobs += bool(mine) and steady
                declared = sum(r["gpu_mem_mib"] or g["mem_total_mib"] for r in mine)
                with_jobs += bool(mine)
                bound = max(0, g["mem_total_mib"] - reserve_mib - declared)
                excess = max(
                    g["usable_mib"] - bound,
                    declared - g["mem_total_mib"],
                    bound - g["usable_mib"] if exact and mine and steady else 0,
                )
                key = (host["host"], g["index"])
                if key not in worst or excess > worst[key][0]:
                    worst[key] = (excess, g["usable_mib"], g["mem_total_mib"], declared)
    check(
        with_jobs > 0 and (steady_with_jobs > 0 or not exact),
        f"the accounting was seen with jobs running ({with_jobs} GPU snapshots of {len(views)} status views"
        + (f", {steady_with_jobs} of them between views with the same jobs: checked exactly)" if exact else ")"),
        failures,
    )
    for (host, index), (excess, usable, total, declared) in sorted(worst.items()):
        check(
            excess <= 0,
            f"GPU {host}:{index}, in each of {len(views)} snapshots: declared <= total and "
            f"usable {'==' if exact else '<='} max(0, total - reserve {reserve_mib} - declared) "
            f"(worst: usable {usable}, total {total}, declared {declared} MiB)",
            failures,
        )


def main() -> int:
    fake = "--fake" in sys.argv[1:]
    mps = "--mps" in sys.argv[1:]
    image = sys.argv[sys.argv.index("--container") + 1] if "--container" in sys.argv else None
    runtime = sys.argv[sys.argv.index("--runtime") + 1] if "--runtime" in sys.argv else "docker"
    if image and fake:
        print("--container needs a GPU box (tests/test_containers.py covers containers on fake GPUs)")
        return 2
    if not fake:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # noqa: BLE001 - any NVML failure means: not a GPU box
            print(f"no NVIDIA GPU visible through NVML ({e}); run this on a GPU box (or --fake)")
            return 2
        print(f"NVML sees {count} GPU(s); driver {pynvml.nvmlSystemGetDriverVersion()}")
    root = make_root("gpucheck", poll_interval=0.5, **({"gpu_sharing": "mps", "spread": False} if mps else {}))
    jobs = {**JOBS, **dict([GREEDY])} if mps else JOBS
    script = root / "alloc.py"
    script.write_text(FAKE_JOB if fake else JOB)
    # On fake GPUs the jobs hold until the check has seen them run together in three status
    # views in a row (the exact accounting needs one between two alike), however slow a busy
    # machine makes each view; 60 s at most. A real GPU's jobs hold 12 s.
    hold = "60" if fake else "12"
    release = root / "release"
    worker = subprocess.Popen(
        [PY, str(REPO / "worker.py"), "--root", str(root), "--host", "gpucheck", "--foreground"]
        + (["--fake-gpus", "2x80GiB"] if fake else []),
        env=clean_env(),
        stderr=subprocess.DEVNULL,
        text=True,
    )
    failures: list[str] = []
    try:
        for job_id, (alloc, declared) in jobs.items():
            boxed = f"container: {{image: {image!r}, runtime: {runtime}}}\n" if image else ""
            # retries: 0: each job runs once (the greedy one's refusal must not be retried with more memory)
            (root / "jobs" / f"{job_id}.yaml").write_text(
                f"command: [{'python' if image else PY!r}, {str(script)!r}]\ngpus: 1\ngpu_mem: {declared}\n"
                f"env: {{ALLOC_MIB: '{alloc}', HOLD_S: '{hold}', GPUQ_REPO: {str(REPO)!r}, "
                f"RELEASE: {str(release)!r}}}\nretries: 0\n{boxed}"
            )
        observed: dict[str, int] = {}
        views: list[dict] = []  # every status snapshot while the jobs run: "ever" is checked on all
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
            (root / "state" / "finished" / f"{j}.json").exists() for j in jobs
        ):
            time.sleep(1)
            view = json.loads(
                subprocess.run(
                    [PY, str(REPO / "gpuq.py"), "--root", str(root), "status", "--json"],
                    capture_output=True,
                    text=True,
                    env=clean_env(),
                ).stdout
            )
            views.append(view)
            if fake and _together(views[-3:], set(JOBS)):
                release.touch()
            for r in view["running"]:
                if r["observed_gpu_mem_mib"]:
                    observed[r["id"]] = r["observed_gpu_mem_mib"]
        for job_id, (alloc, _) in JOBS.items():
            check(
                observed.get(job_id, 0) >= alloc,
                f"probe sees {job_id}'s memory: observed {observed.get(job_id)} MiB >= allocated {alloc} MiB",
                failures,
            )
        check_accounting(views, Config().gpu_mem_reserve_mib, failures, exact=fake)
        for job_id in jobs:
            record = json.loads((root / "state" / "finished" / f"{job_id}.json").read_text())
            log = (root / "logs" / f"{job_id}.log").read_text()
            print(
                f"--- {job_id}: {record['state']} exit {record['exit_code']} on GPUs {record['gpus']} "
                f"{record['gpu_uuids']}\n{log}"
            )
            torch_uuid = next((line.split()[1] for line in log.splitlines() if line.startswith("UUID ")), "")
            nvml_uuid = record["gpu_uuids"][0] if record["gpu_uuids"] else ""
            if job_id == GREEDY[0]:
                check(
                    record["state"] == "failed" and "out of memory" in log.lower(),
                    f"{job_id}: allocating {GREEDY[1][0]} MiB beyond its gpu_mem {GREEDY[1][1]} under MPS is refused "
                    f"(state {record['state']})",
                    failures,
                )
                continue
            check(record["state"] == "done", f"{job_id} finished done", failures)
            check(
                bool(torch_uuid) and nvml_uuid.removeprefix("GPU-") == torch_uuid.removeprefix("GPU-"),
                f"{job_id}: torch UUID {torch_uuid} == NVML UUID {nvml_uuid} of GPU {record['gpus']}",
                failures,
            )
            inside = (
                record["gpu_uuids"][0]
                if mps
                else "0"
                if image and runtime != "apptainer"
                else ",".join(map(str, record["gpus"]))
            )
            check(
                f"CVD {inside} ORDER PCI_BUS_ID" in log,
                f"{job_id}: CUDA_VISIBLE_DEVICES is {inside} (the record's GPUs, as numbered where the job runs)",
                failures,
            )
            if image:
                check("COUNT 1" in log, f"{job_id}: torch in the container sees exactly one GPU", failures)
            if mps:
                mib = int(float(jobs[job_id][1].removesuffix("GiB")) * 1024)
                shown = f"MPS {record.get('mps_pipe')} {record.get('mps_compute_pct')} 0={mib}M"
                check(
                    bool(record.get("mps_pipe")) and shown in log,
                    f"{job_id}: an MPS client with its pipe, compute share and memory limit ({shown})",
                    failures,
                )
        if mps:
            pipes = {json.loads((root / "state" / "finished" / f"{j}.json").read_text()).get("mps_pipe") for j in JOBS}
            check(len(pipes) == 1, f"the jobs shared one GPU's MPS daemon ({pipes})", failures)
            pid_file = Path(str(next(iter(pipes)))) / "nvidia-cuda-mps-control.pid"
            deadline = time.monotonic() + 60
            while pid_file.exists() and time.monotonic() < deadline:
                time.sleep(1)
            check(not pid_file.exists(), "the MPS daemon stopped once its GPU was empty", failures)
        events = [
            json.loads(line) for p in (root / "state" / "events").glob("*.jsonl") for line in p.read_text().splitlines()
        ]
        check(
            sum(1 for e in events if e.get("to") == "running") == len(jobs), "each job started exactly once", failures
        )
    finally:
        worker.terminate()
        worker.wait()
    print(f"{len(failures)} check(s) failed" if failures else "all checks passed")
    remove_root(root, "gpucheck")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
