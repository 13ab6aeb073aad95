#!/usr/bin/env python3
"""`gpuq history` over a year of a team's events: 100,000 jobs on four hosts' logs (a start and
an end each, one in twenty preempted once and one in fifty retried), nine users. Prints the
median wall time of the CLI for the questions people ask, and how many rows each gave
(counted from --json, so a figure is never for an empty answer).

    python bench/history_scale.py [--jobs 100000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

from _common import PY, REPO, clean_env, compile_code, make_root, remove_root, timed

YEAR_S = 365 * 86400
USERS = [f"user{i}" for i in range(9)]


def populate(root, jobs: int, now: float) -> None:
    events = root / "state" / "events"
    events.mkdir(parents=True)
    logs = [open(events / f"box{h}.jsonl", "w") for h in range(4)]
    try:
        for i in range(jobs):
            start = now - YEAR_S + i * (YEAR_S / jobs)
            host = i % 4
            job = {"job": f"train-{i}", "user": USERS[i % len(USERS)], "name": "train" if i % 3 else "eval"}
            attempts = 2 if i % 50 == 0 else 1
            for attempt in range(1, attempts + 1):
                begun = start + (attempt - 1) * 600
                placed = {"host": f"box{host}", "gpus": [i % 8], "gpu_mem_mib": 20480, "attempt": attempt}
                _line(
                    logs[host], begun, host, {**job, **placed, "from": "pending", "to": "running", "started_at": begun}
                )
                if i % 20 == 0 and attempt == 1:
                    _line(
                        logs[host],
                        begun + 60,
                        host,
                        {**job, **placed, "from": "running", "to": "pending", "cause": "preempted"},
                    )
                    _line(
                        logs[host],
                        begun + 90,
                        host,
                        {**job, **placed, "from": "pending", "to": "running", "started_at": begun + 90},
                    )
                failed = attempt < attempts or i % 31 == 7
                state, code = ("failed", 1) if failed else ("done", 0)
                ended = begun + 300
                _line(
                    logs[host],
                    ended,
                    host,
                    {
                        **job,
                        **placed,
                        "from": "running",
                        "to": state,
                        "exit_code": code,
                        "started_at": begun,
                        "ended_at": ended,
                    },
                )
    finally:
        for log in logs:
            log.close()


def _line(log, t: float, host: int, event: dict) -> None:
    log.write(json.dumps({"t": t, "by": f"box{host}", **event}, separators=(",", ":")) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=100_000)
    args = ap.parse_args()
    compile_code()
    root = make_root("history")
    try:
        populate(root, args.jobs, time.time())
        size = sum(p.stat().st_size for p in (root / "state" / "events").iterdir())
        print(f"{args.jobs} jobs over a year, {size / 2**20:.0f} MiB of event logs on 4 hosts")
        base = [PY, str(REPO / "gpuq.py"), "--root", str(root), "history"]
        for label, extra in (
            ("the last day (default)", []),
            ("a week, one user", ["--since", "7d", "--user", "user3"]),
            ("a year, one user, failed", ["--since", "365d", "--user", "user3", "--state", "failed"]),
            ("a year, every job", ["--since", "365d"]),
            ("a year, every job, --json", ["--since", "365d", "--json"]),
        ):
            rows = len(
                json.loads(
                    subprocess.run([*base, *extra, "--json"], capture_output=True, env=clean_env(), check=True).stdout
                )["jobs"]
            )
            print(f"  {label:<28} {timed([*base, *extra], repeat=3):6.2f} s  ({rows} rows)")
    finally:
        remove_root(root)


if __name__ == "__main__":
    main()
