#!/usr/bin/env python3
"""Idle cost: worker CPU (share of one core) and RSS over a window, with an empty queue
(targets <= 1% of a core, <= 60 MiB) and with 10,000 pending jobs that fit nowhere
(target <= 5% of a core). Default config (poll_interval 1.0).

    python bench/idle_cost.py [--seconds 60] [--pending 10000]
"""

from __future__ import annotations

import argparse
import time

import psutil
from _common import make_root, remove_root, start_worker, wait_for


def measure(root, seconds: float) -> tuple[float, float]:
    proc = start_worker(root, "idle", "4x80GiB")
    try:
        wait_for(root / "state" / "workers" / "idle.json", timeout=120)
        time.sleep(3)  # past start-up and the first full scan
        p = psutil.Process(proc.pid)
        before = p.cpu_times()
        t = time.monotonic()
        time.sleep(seconds)
        after = p.cpu_times()
        cpu = (after.user + after.system - before.user - before.system) / (time.monotonic() - t)
        return cpu * 100, p.memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait()


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--pending", type=int, default=10000)
    args = p.parse_args()
    print(f"idle cost over {args.seconds:.0f} s, default config")
    root = make_root("idle")
    cpu, rss = measure(root, args.seconds)
    print(
        f"  empty queue           CPU {cpu:5.2f}% of a core   RSS {rss:5.1f} MiB   (targets <= 1%: "
        f"{_verdict(cpu <= 1)}, <= 60 MiB: {_verdict(rss <= 60)})"
    )
    for i in range(args.pending):
        (root / "jobs" / f"p{i:05d}.yaml").write_text(f"command: train --seed {i}\ngpus: 1\ngpu_mem: 100GiB\n")
    cpu, rss = measure(root, args.seconds)
    print(
        f"  {args.pending} unplaceable  CPU {cpu:5.2f}% of a core   RSS {rss:5.1f} MiB   (target <= 5%: "
        f"{_verdict(cpu <= 5)})"
    )
    remove_root(root, "idle")


if __name__ == "__main__":
    main()
