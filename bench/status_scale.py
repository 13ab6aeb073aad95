#!/usr/bin/env python3
"""Status at scale: `gpuq status` with 10,000 pending and 100,000 finished jobs, two hosts
with heartbeats (one worker pass each, so the shared spec cache exists). Targets: <= 0.5 s
and <= 10x `python3 -c pass`, both measured here in the same run.

    python bench/status_scale.py [--pending 10000] [--finished 100000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time

from _common import PY, REPO, clean_env, compile_code, make_root, remove_root, timed


def populate(root, pending: int, finished: int) -> None:
    jobs = root / "jobs"
    for i in range(pending):  # 100 GiB on 80 GiB GPUs: fits nowhere, so the workers claim none
        (jobs / f"p{i:05d}.yaml").write_text(f"command: python train.py --seed {i}\ngpus: 1\ngpu_mem: 100GiB\n")
    fin = root / "state" / "finished"
    fin.mkdir(parents=True, exist_ok=True)
    (root / "state" / "events").mkdir(parents=True, exist_ok=True)
    now = time.time()
    with open(root / "state" / "events" / "old.jsonl", "w") as events:
        for i in range(finished):
            t = now - 86400 + i * 0.5
            record = {
                "id": f"f{i:06d}",
                "state": "done",
                "spec": {"command": "true", "gpus": 1, "gpu_mem_mib": 1024},
                "spec_text": "command: 'true'\n",
                "user": "ana",
                "uid": 1000,
                "attempt": 1,
                "queued_at": t - 5,
                "host": "old",
                "boot_id": "b",
                "gpus": [0],
                "gpu_uuids": ["GPU-0"],
                "gpu_mem_mib": 1024,
                "claim": None,
                "claimed_at": t - 2,
                "started_at": t - 2,
                "ended_at": t,
                "exit_code": 0,
                "signal": None,
                "reason": None,
                "job_pid": 1,
                "peak_gpu_mem_mib": None,
            }
            (fin / f"f{i:06d}.json").write_text(json.dumps(record))
            events.write(
                json.dumps(
                    {
                        "t": t,
                        "by": "old",
                        "job": f"f{i:06d}",
                        "from": "running",
                        "to": "done",
                        "host": "old",
                        "gpus": [0],
                        "exit_code": 0,
                    },
                    separators=(",", ":"),
                )
                + "\n"
            )
    for host in ("a", "b"):  # one pass each: heartbeat + spec cache, nothing claimed
        subprocess.run(
            [PY, str(REPO / "worker.py"), "--root", str(root), "--host", host, "--fake-gpus", "4x80GiB", "--once"],
            check=True,
            env=clean_env(),
        )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pending", type=int, default=10000)
    p.add_argument("--finished", type=int, default=100000)
    args = p.parse_args()
    root = make_root("status")
    t = time.perf_counter()
    populate(root, args.pending, args.finished)
    print(
        f"status at scale: {args.pending} pending, {args.finished} finished (built in {time.perf_counter() - t:.0f} s)"
    )
    compile_code()
    baseline = timed([PY, "-c", "pass"], repeat=7)
    status = timed([PY, str(REPO / "gpuq.py"), "--root", str(root), "status"], repeat=7)
    as_json = timed([PY, str(REPO / "gpuq.py"), "--root", str(root), "status", "--json"], repeat=7)
    out = subprocess.run(
        [PY, str(REPO / "gpuq.py"), "--root", str(root), "status", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        check=True,
    ).stdout
    view = json.loads(out)
    assert len(view["pending"]) == args.pending, len(view["pending"])
    print(f"  python3 -c pass      {baseline * 1000:7.1f} ms")
    print(
        f"  gpuq status          {status * 1000:7.1f} ms  ({status / baseline:.1f}x; targets <= 500 ms: "
        f"{'met' if status <= 0.5 else 'NOT MET'}, <= 10x: {'met' if status <= 10 * baseline else 'NOT MET'})"
    )
    print(f"  gpuq status --json   {as_json * 1000:7.1f} ms  ({as_json / baseline:.1f}x)")
    remove_root(root, "a", "b")


if __name__ == "__main__":
    main()
