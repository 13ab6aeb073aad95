#!/usr/bin/env python3
"""How far users can trust the expected starts `gpuq status` shows (sched/estimate.py).

    python bench/start_estimates.py [--traces DIR] [--every K]

Replays windows of the shared traces through gpuq's plan (bench/vs_slurm.py's scenarios);
when a box first sees a job, it asks for that job's expected start, as a user running
`gpuq status` right after submitting would; the replay goes on, and the job's real start is
compared with it. An estimate is a latest start: jobs end by their limits or before, so it is
met when the job starts by then (a minute's slack: the passes' timing). Printed per scenario:
jobs asked about, the share with an estimate, the share of those that started by it, the share
within a minute of it (what Slurm's `squeue --start` is judged by), and the median of
|estimate - start| beside the median wait.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _common import REPO

sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from vs_slurm import DAY, SCENARIOS, Scenario, offered_work  # noqa: E402

from gpuq.extras.sim.simreport import SIM_CONFIG  # noqa: E402
from gpuq.extras.sim.simulate import replay  # noqa: E402
from gpuq.extras.sim.timing import PassTiming  # noqa: E402
from gpuq.extras.sim.trace import load_trace, parse_cluster  # noqa: E402
from gpuq.sched.estimate import replay_starts  # noqa: E402
from gpuq.sched.plan import plan  # noqa: E402

SLACK_S = 60.0


def run(traces: Path, scenario: Scenario, every: int) -> dict:
    cluster = parse_cluster(scenario.cluster)
    path = traces / scenario.trace
    raw = load_trace(path, cluster, scenario.since_d * DAY, 1.0, scenario.jobs)
    stretch = offered_work(raw) / (cluster.gpus * (raw[-1].submit_s - raw[0].submit_s) * scenario.load)
    jobs = load_trace(path, cluster, scenario.since_d * DAY, stretch, scenario.jobs)
    asked = {j.id for n, j in enumerate(jobs) if n % every == 0}
    predicted: dict[str, float | None] = {}

    def decide(pending, hosts, running, now, usage):
        new = [p.id for p in pending if p.id in asked and p.id not in predicted]
        if new:
            expected = replay_starts(pending, hosts, running, SIM_CONFIG, now, usage).starts
            for job_id in new:
                predicted[job_id] = expected.get(job_id)
        decided = plan(pending, hosts, running, SIM_CONFIG, now, explain=False, usage=usage)
        return decided.starts, decided.preempts

    out = replay(
        jobs, cluster, decide, SIM_CONFIG.grace_s, config=SIM_CONFIG, timing=PassTiming(SIM_CONFIG.poll_interval)
    )
    submit = {j.id: j.submit_s for j in jobs}
    estimated = {i: t for i, t in predicted.items() if t is not None and i in out.waits}
    starts = {i: submit[i] + out.waits[i] for i in estimated}
    errors = [abs(estimated[i] - starts[i]) for i in estimated]
    waits = [out.waits[i] for i in estimated]
    waited = [i for i in estimated if out.waits[i] > SLACK_S]  # those a user would look up
    return {
        "waited": len(waited),
        "waited_by_it": sum(1 for i in waited if starts[i] <= estimated[i] + SLACK_S),
        "waited_within_minute": sum(1 for i in waited if abs(estimated[i] - starts[i]) <= SLACK_S),
        "scenario": scenario.name,
        "asked": len(predicted),
        "estimated": len(estimated),
        "by_it": sum(1 for i in estimated if starts[i] <= estimated[i] + SLACK_S),
        "within_minute": sum(1 for e in errors if e <= SLACK_S),
        "median_error_s": statistics.median(errors) if errors else 0.0,
        "median_wait_s": statistics.median(waits) if waits else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    p.add_argument("--every", type=int, default=5, help="ask about every K-th job (default 5)")
    p.add_argument("--jobs", type=int, default=2, help="replays at once (default 2)")
    args = p.parse_args()
    heads = ("asked", "with one", "started by it", "within 1 min", "median error", "median wait")
    print(f"{'scenario':24s} " + " ".join(f"{h:>{w}s}" for h, w in zip(heads, (6, 9, 14, 13, 13, 12))))
    totals = {"estimated": 0, "by_it": 0, "within_minute": 0, "waited": 0, "waited_by_it": 0, "waited_within_minute": 0}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(run, [args.traces] * len(SCENARIOS), SCENARIOS, [args.every] * len(SCENARIOS)):
            n = max(1, r["estimated"])
            print(
                f"{r['scenario']:24s} {r['asked']:6d} {r['estimated'] / max(1, r['asked']):9.0%} "
                f"{r['by_it'] / n:14.0%} {r['within_minute'] / n:13.0%} "
                f"{r['median_error_s']:12,.0f}s {r['median_wait_s']:11,.0f}s",
                flush=True,
            )
            for key in totals:
                totals[key] += r[key]
    n, w = max(1, totals["estimated"]), max(1, totals["waited"])
    print(
        f"\nall: {totals['estimated']:,} estimates; {totals['by_it'] / n:.0%} started by theirs, "
        f"{totals['within_minute'] / n:.0%} within a minute of it. Of the {totals['waited']:,} jobs that waited "
        f"over a minute: {totals['waited_by_it'] / w:.0%} started by theirs, {totals['waited_within_minute'] / w:.0%} "
        "within a minute of it"
    )


if __name__ == "__main__":
    main()
