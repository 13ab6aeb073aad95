#!/usr/bin/env python3
"""Requests: how long a cancel takes from the request to its outcome (target: median <= 1 s).

A member's `gpuq cancel` writes a request into requests/ and waits for the worker's reply
(docs/security.md). This measures, with one worker on fake GPUs:
- pending: a pending job's cancel, request written -> reply read (the job recorded cancelled);
- running: a running job's cancel, request written -> the job's record says cancelled (the
  worker applied the request, its job got SIGTERM and ended, the supervisor recorded it);
A member's whole `gpuq cancel` adds the start of an interpreter (about what `python3 -c pass`
takes; see bench/status_scale.py).
Requests are written with the same function the CLI uses (gpuq.spool.inbox.send), so the worker
path is measured even when this runs as the spool's owner (whose CLI applies its own).

    python bench/requests.py [--jobs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _common import REPO, make_root, remove_root, start_worker, wait_for

sys.path.insert(0, str(REPO))
from gpuq.spool.inbox import read_reply, send  # noqa: E402
from gpuq.spool.layout import Layout  # noqa: E402


def _record(root: Path, job_id: str) -> dict | None:
    p = root / "state" / "finished" / f"{job_id}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _wait(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.002)
    return value


def _drop(root: Path, job_id: str, gpus: int) -> None:
    tmp = root / "jobs" / f".{job_id}.tmp"
    tmp.write_text(f"command: sleep 600\ngpus: {gpus}\n" + ("gpu_mem: 1GiB\n" if gpus else ""))
    os.rename(tmp, root / "jobs" / f"{job_id}.yaml")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=20)
    args = p.parse_args()
    root = make_root("requests", poll_interval=1.0, grace_s=2, cpu_slots=0)
    layout = Layout(root)
    worker = start_worker(root, "a", "8x80GiB")
    try:
        wait_for(root / "state" / "workers" / "a.json")
        pending, running = [], []
        for i in range(args.jobs):  # pending: CPU jobs with no CPU slot wait for ever
            _drop(root, f"p{i}", 0)
        time.sleep(3)  # the worker has read them and sleeps, as a real queue does between requests
        for i in range(args.jobs):
            t = time.perf_counter()
            name = send(layout, "cancel", (f"p{i}",))
            reply = _wait(lambda name=name: read_reply(layout, name, os.geteuid()))
            pending.append(time.perf_counter() - t)
            assert reply.ok, reply
            time.sleep(0.3)
        for i in range(min(args.jobs, 8)):  # running: one per fake GPU
            _drop(root, f"r{i}", 1)
        for i in range(min(args.jobs, 8)):
            _wait(lambda i=i: (root / "state" / "running" / f"r{i}.json").exists())
        time.sleep(1.5)
        for i in range(min(args.jobs, 8)):
            t = time.perf_counter()
            send(layout, "cancel", (f"r{i}",))
            record = _wait(lambda i=i: _record(root, f"r{i}"))
            running.append(time.perf_counter() - t)
            assert record["state"] == "cancelled", record
            time.sleep(0.3)
    finally:
        worker.terminate()
        worker.wait()
    print(f"cancel, request -> outcome, one worker (poll_interval 1 s), {args.jobs} each; target: median <= 1 s")
    for what, times in (("pending job (reply)", pending), ("running job (recorded cancelled)", running)):
        if len(times) > 1:
            q = statistics.quantiles(times, n=10, method="inclusive")  # never beyond the data
            median = statistics.median(times)
            print(
                f"  {what:<36} median {median * 1000:7.1f} ms   p90 {q[-1] * 1000:7.1f} ms   "
                f"max {max(times) * 1000:7.1f} ms   ({'met' if median <= 1 else 'NOT MET'})"
            )
    remove_root(root, "a")


if __name__ == "__main__":
    main()
