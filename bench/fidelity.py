#!/usr/bin/env python3
"""Does `gpuq simulate` predict the real thing? A scaled cut of a real trace runs through
real workers on three stand-in boxes with fake GPUs, and through the simulator; the waits
and the GPU sharing are printed side by side.

    python bench/fidelity.py [--traces DIR] [--jobs 150] [--load 0.9]

The cut: the first JOBS jobs of the Alibaba dense window, durations scaled by one factor and
clamped to 2-30 s, arrivals by the factor that gives the cluster (3 boxes x 2 GPUs x 32 GiB)
the offered load LOAD. Each job is `sleep <duration>` with the trace's GPUs and memory share,
and a `time_limit` as people declare one: its duration rounded up to a step (LIMIT_STEPS_S,
the trace's hour-to-month steps scaled as the durations are), so the plan's reservations and
backfill run on both sides.
Target: the mean wait within 10% + 1 s of the simulator's; the same number of jobs that
shared a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from _common import PY, REPO, clean_env, make_root, remove_root

sys.path.insert(0, str(REPO))

from gpuq.extras.sim.simulate import plan_policy, replay  # noqa: E402
from gpuq.extras.sim.timing import PassTiming  # noqa: E402
from gpuq.extras.sim.trace import TraceJob, load_trace, parse_cluster  # noqa: E402
from gpuq.model.config import load as load_config  # noqa: E402

CLUSTER = "3x2x32GiB"
BOXES = ("box0", "box1", "box2")


LIMIT_STEPS_S = (5, 10, 15, 20, 30, 45, 60)


def limit_for(duration_s: float) -> float:
    """A limit a person would type for a job of this length: the first step with room to
    spare (a loaded machine's `sleep 30` takes a little over 30 s)."""
    return next(step for step in LIMIT_STEPS_S if step >= 1.1 * duration_s + 1)


def scaled_cut(trace: Path, jobs: int, load: float) -> list[TraceJob]:
    cluster = parse_cluster(CLUSTER)
    cut = load_trace(trace, cluster, since_s=9655000)[:jobs]
    median = statistics.median(j.duration_s for j in cut)
    k = 8.0 / median  # the median job runs 8 s
    durations = [min(30.0, max(2.0, j.duration_s * k)) for j in cut]
    work = sum(
        d * j.spec.gpus * (1.0 if j.spec.gpu_mem_mib is None else min(1.0, j.spec.gpu_mem_mib / cluster.mem_mib))
        for j, d in zip(cut, durations)
    )
    span = work / (load * cluster.gpus)
    first, last = cut[0].submit_s, cut[-1].submit_s
    stretch = span / max(1.0, last - first)
    return [
        replace(
            j,
            submit_s=round((j.submit_s - first) * stretch, 2),
            duration_s=round(d, 2),
            util=0.0,
            spec=replace(j.spec, time_limit_s=limit),
            time_limit_s=limit,
        )
        for j, d in zip(cut, durations)
        for limit in (limit_for(d),)
    ]


Placed = list[tuple[str, str, tuple[int, ...], float, float]]  # job, host, GPUs, start, end


def shared_jobs(placed: Placed) -> set[str]:
    """The jobs that ran beside another job on one of their GPUs at some moment."""
    shared: set[str] = set()
    for a in placed:
        for b in placed:
            if a[0] < b[0] and a[1] == b[1] and set(a[2]) & set(b[2]) and a[3] < b[4] and b[3] < a[4]:
                shared.update((a[0], b[0]))
    return shared


SAME_START_S = 0.5


def same_starts(real_placed: Placed, sim_placed: Placed) -> tuple[int, tuple[str, float] | None]:
    """How many jobs started on the same box and GPUs within SAME_START_S on both sides, and
    the first job (in simulated start order) that did not, with its simulated start."""
    real_at = {p[0]: p for p in real_placed}
    same, parted = 0, None
    for job, host, gpus, start, _ in sorted(sim_placed, key=lambda p: p[3]):
        r = real_at.get(job)
        box = BOXES[int(host.removeprefix("h"))]  # the replay's h0, h1, h2 are box0, box1, box2
        if r is not None and (r[1], r[2]) == (box, gpus) and abs(r[3] - start) <= SAME_START_S:
            same += 1
        elif parted is None:
            parted = (job, start)
    return same, parted


def simulated(cut: list[TraceJob], config) -> tuple[dict[str, float], Placed]:
    """The simulator with the very config the real workers read."""
    decide = plan_policy(config)
    starts: dict[str, tuple[str, tuple[int, ...], float]] = {}

    def recording(pending, hosts, running, now, usage):
        decided = decide(pending, hosts, running, now, usage)
        for s in decided.starts:
            starts.setdefault(s.job_id, (s.host, s.gpus, now))
        return decided

    out = replay(
        cut, parse_cluster(CLUSTER), recording, config.grace_s, config=config, timing=PassTiming(config.poll_interval)
    )
    placed = [(j, h, g, t, out.ends[j]) for j, (h, g, t) in starts.items()]
    return dict(out.waits), placed


def spec_text(job: TraceJob) -> str:
    mem = f"gpu_mem: {job.spec.gpu_mem_mib}MiB\n" if job.spec.gpu_mem_mib is not None else ""
    compute = f"gpu_compute: {job.spec.gpu_compute_pct}%\n" if job.spec.gpu_compute_pct is not None else ""
    limit = f"time_limit: {job.spec.time_limit_s:g}s\n"
    return f"command: sleep {job.duration_s}\ngpus: {job.spec.gpus}\n{mem}{compute}{limit}"


def real(root: Path, cut: list[TraceJob]) -> tuple[dict[str, float], Placed]:
    workers = [
        subprocess.Popen(
            [PY, str(REPO / "worker.py"), "--root", str(root), "--host", box, "--fake-gpus", "2x32GiB", "--foreground"],
            env=clean_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for box in BOXES
    ]
    while not all((root / "state" / "workers" / f"{b}.json").exists() for b in BOXES):
        time.sleep(0.1)
    dropped: dict[str, float] = {}
    ids = {j.id: f"j{n:03d}" for n, j in enumerate(cut)}
    start = time.time()

    def feed() -> None:
        for job in cut:
            time.sleep(max(0.0, start + job.submit_s - time.time()))
            tmp = root / "jobs" / f".{ids[job.id]}.tmp"
            tmp.write_text(spec_text(job))
            dropped[job.id] = time.time()
            tmp.rename(root / "jobs" / f"{ids[job.id]}.yaml")

    feeder = threading.Thread(target=feed)
    feeder.start()
    feeder.join()
    finished = root / "state" / "finished"
    deadline = time.time() + 600
    while len(list(finished.glob("*.json"))) < len(cut) and time.time() < deadline:
        time.sleep(0.5)
    for w in workers:
        w.terminate()
        w.wait(timeout=30)
    waits, placed = {}, []
    for job in cut:
        path = finished / f"{ids[job.id]}.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        waits[job.id] = r["claimed_at"] - dropped[job.id]
        placed.append((job.id, r["host"], tuple(r["gpus"]), r["claimed_at"], r["ended_at"]))
    start = min((p[3] - waits[p[0]] for p in placed), default=0.0)  # the first drop: the trace's 0
    return waits, [(j, h, g, t - start, e - start) for j, h, g, t, e in placed]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    p.add_argument("--jobs", type=int, default=150)
    p.add_argument("--load", type=float, default=0.9)
    args = p.parse_args()
    cut = scaled_cut(args.traces / "alibaba_openb2023.csv", args.jobs, args.load)
    root = make_root("fidelity")
    config = load_config(root / "config.yaml")  # what the workers read: the defaults
    print(
        f"fidelity: {len(cut)} Alibaba jobs, durations 2-30 s, arriving over {cut[-1].submit_s:.0f} s, "
        f"on {CLUSTER} (3 real workers, fake GPUs)"
    )
    sim_waits, sim_placed = simulated(cut, config)
    real_waits, real_placed = real(root, cut)
    sim_shared, real_shared = len(shared_jobs(sim_placed)), len(shared_jobs(real_placed))
    both = [j.id for j in cut if j.id in real_waits and j.id in sim_waits]
    sim_mean = statistics.fmean(sim_waits[j] for j in both)
    real_mean = statistics.fmean(real_waits[j] for j in both)
    print(f"  {'':24s} {'real workers':>14s} {'gpuq simulate':>14s}")
    print(f"  {'jobs finished':24s} {len(real_waits):14d} {len(sim_waits):14d}")
    print(f"  {'mean wait':24s} {real_mean:13.1f}s {sim_mean:13.1f}s")
    for q in (50, 90):
        rq = statistics.quantiles([real_waits[j] for j in both], n=100, method="inclusive")[q - 1]
        sq = statistics.quantiles([sim_waits[j] for j in both], n=100, method="inclusive")[q - 1]
        print(f"  {f'wait p{q}':24s} {rq:13.1f}s {sq:13.1f}s")
    print(f"  {'jobs that shared a GPU':24s} {real_shared:14d} {sim_shared:14d}")
    ok = abs(real_mean - sim_mean) <= 0.1 * sim_mean + 1.0 and len(real_waits) == len(cut)
    print(
        f"  [{'met' if ok else 'MISSED'}] mean wait within 10% + 1 s of the simulator's "
        f"(difference {real_mean - sim_mean:+.1f} s)"
    )
    print(
        f"  [{'met' if real_shared == sim_shared else 'MISSED'}] the same GPU sharing "
        f"({real_shared} against {sim_shared} jobs)"
    )
    same, parted = same_starts(real_placed, sim_placed)
    print(
        f"  starts at the same place and moment (box, GPUs, within {SAME_START_S} s): {same} of {len(cut)}"
        + (f"; the first to differ: {parted[0]} at {parted[1]:.1f} s" if parted else "")
    )
    for job_id in sorted(shared_jobs(sim_placed) ^ shared_jobs(real_placed)):  # where they differ, and why
        for side, placed in (("real", real_placed), ("simulated", sim_placed)):
            here = next((p for p in placed if p[0] == job_id), None)
            if here is not None:
                print(f"    {job_id} {side:9s} {here[1]}:{list(here[2])} {here[3]:8.2f}-{here[4]:8.2f} s")
    remove_root(root, *BOXES)


if __name__ == "__main__":
    main()
