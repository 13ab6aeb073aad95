#!/usr/bin/env python3
"""Dispatch: N trivial jobs (`true`), two at a time (2 fake GPUs, one job per GPU), submitted
and run to the end; side by side with task-spooler (`tsp -S 2`) on the same commands (see
run_tsp for how it is fed). Target: gpuq <= 3x tsp (stretch 2x). Each side is timed from its
first submission (a spec written and renamed into jobs/, as a script would drop it, not the
`gpuq submit` command; `tsp true`) to its last job's end, with its server or worker already
up: each side's submissions are in its figure.

    python bench/dispatch.py [--jobs 1000] [--rounds 5] [--dir DIR]

Both tools keep their state under DIR (default: the system's temporary directory), so both
pay the same file system. A small shared VM is noisy: each round runs both tools (which one
goes first alternates, so neither always follows the other's clean-up), the median of the
rounds' ratios is the figure, and each round first times 200 file creates there: gpuq
creates three files per job (its record, its log, its result) where tsp creates one, so a
disk whose creates are slow (cold metadata on a shared VM) weighs on gpuq's figure most.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from _common import clean_env, make_root, remove_root, start_worker, wait_for


def run_gpuq(n: int) -> float:
    """The worker is started and up first (as tsp's server is); then timed from the first
    spec dropped into jobs/ (written beside it and renamed in, as `gpuq submit` does) to the
    last job's finished record: gpuq's submissions are in its figure, as tsp's are in its."""
    root = make_root("dispatch")  # default config: poll_interval 1.0
    worker = start_worker(root, "bench", "2x16GiB")
    wait_for(root / "state" / "workers" / "bench.json")
    staging, jobs, finished = root / "staging", root / "jobs", root / "state" / "finished"
    staging.mkdir()
    t = time.perf_counter()
    for i in range(n):
        (staging / f"t{i:04d}.yaml").write_text('command: "true"\ngpus: 1\n')  # whole GPU each
        os.rename(staging / f"t{i:04d}.yaml", jobs / f"t{i:04d}.yaml")
    # Watched as cheaply as tsp's `tsp -w` blocks: the first job not yet seen finished is
    # looked up, and the ones after it while they are (jobs end about in order). A listing of
    # finished/ every 10 ms took ~0.8 ms of CPU per job from the two cores the jobs share.
    done = 0
    while True:
        while done < n and os.path.exists(finished / f"t{done:04d}.json"):  # renamed in whole
            done += 1
        if done == n:
            break
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited ({worker.returncode}) with {done} of {n} finished")
        time.sleep(0.01)
    elapsed = time.perf_counter() - t
    worker.terminate()
    worker.wait(timeout=60)
    remove_root(root, "bench")
    return elapsed


def run_tsp(n: int) -> float | None:
    """tsp keeps one waiting client process per queued job on a select() loop, so it cannot
    hold 1000 jobs queued up front (it stalls past ~1000 sockets). It gets the same
    commands submitted as fast as its client allows, timed from the first submission to
    the last job's end: tsp's submission cost is in its figure, as gpuq's is in its own."""
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        print("task-spooler not installed (Debian: apt-get install task-spooler); skipping it")
        return None
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-tsp-"))  # its socket and output files
    env = {**clean_env(), "TS_SOCKET": str(work / "socket"), "TMPDIR": str(work), "TS_MAXFINISHED": str(n + 10)}

    def ts(*args: str) -> str:
        return subprocess.run([tsp, *args], env=env, capture_output=True, text=True, check=True).stdout

    ts("-S", "2")
    t = time.perf_counter()
    last = ""
    for _ in range(n):
        last = ts("true").strip()
    subprocess.run([tsp, "-w", last], env=env, check=False, capture_output=True)
    while any(w in ts("-l") for w in ("running", "queued")):
        time.sleep(0.01)
    elapsed = time.perf_counter() - t
    subprocess.run([tsp, "-K"], env=env, capture_output=True)
    shutil.rmtree(work, ignore_errors=True)
    return elapsed


def file_create_us(count: int = 200) -> float:
    """Median microseconds to create (and close) one empty file where both tools keep state."""
    work = Path(tempfile.mkdtemp(prefix="gpuq-bench-create-"))
    times = []
    for i in range(count):
        t = time.perf_counter()
        os.close(os.open(work / f"f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        times.append(time.perf_counter() - t)
    shutil.rmtree(work, ignore_errors=True)
    return statistics.median(times) * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", help="where both tools keep their state (default: system temp dir)")
    args = p.parse_args()
    n = args.jobs
    if args.dir:
        tempfile.tempdir = args.dir
    print(f"dispatch: {n} x `true`, 2 slots, {os.cpu_count()} CPUs, state under {tempfile.gettempdir()}")
    ratios = []
    for r in range(1, args.rounds + 1):
        create_us = file_create_us()
        if r % 2:
            g, s = run_gpuq(n), run_tsp(n)
        else:
            s, g = run_tsp(n), run_gpuq(n)
        line = f"  round {r}: create {create_us:5.0f} us   gpuq {g:6.2f} s ({g / n * 1000:4.1f} ms/job)"
        if s is not None:
            ratios.append(g / s)
            line += f"   tsp {s:6.2f} s ({s / n * 1000:4.1f} ms/job)   ratio {g / s:.2f}"
        print(line, flush=True)
    if ratios:
        median = statistics.median(ratios)
        verdict = "met" if median <= 3 else "NOT MET"
        print(f"  median ratio gpuq/tsp = {median:.2f}  (target <= 3: {verdict}; stretch <= 2)")


if __name__ == "__main__":
    main()
