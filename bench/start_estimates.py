#!/usr/bin/env python3
"""How far users can trust the expected starts `gpuq status` shows (sched/estimate.py).

    python bench/start_estimates.py [--traces DIR] [--every K]

Replays windows of the shared traces through gpuq's plan (bench/vs_slurm.py's scenarios);
when a box first sees a job, it asks for that job's expected start, as a user running
`gpuq status` right after submitting would; the replay goes on, and the job's real start is
compared with it. An estimate is a range: the latest start (jobs end by their limits or
before) and the likely one (the jobs ahead end as their owners' earlier runs usually took: a
trace has no job names, so a user's jobs are one kind, coarser than a worker's kinds). Printed
per scenario: jobs asked about, the share with an estimate, the share that started by the
latest, inside the range (a minute's slack: the passes' timing), within a minute of the latest
(what Slurm's `squeue --start` is judged by), the median |latest - start| and |likely - start|
beside the median wait; then the same for the jobs that waited over a minute.
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
from gpuq.model.usage import RUNS_KEPT, kind_of  # noqa: E402
from gpuq.sched.estimate import replay_starts, typical_runs  # noqa: E402
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
    likely: dict[str, float | None] = {}
    runs_of: dict[str, list[float]] = {}  # each user's latest runs that ended, as a worker learns them
    began: dict[str, tuple[str, float]] = {}  # running now: user, start

    def learn(pending, running, now) -> None:
        """Runs that ended since the last pass: gone from `running` and not back in `pending`."""
        here = {r.id for r in running} | {p.id for p in pending}
        for job_id in [i for i in began if i not in here]:
            user, start = began.pop(job_id)
            runs_of.setdefault(user, []).append(now - start)
            del runs_of[user][:-RUNS_KEPT]
        began.update((r.id, (r.user, r.started_at)) for r in running if r.id not in began)

    def decide(pending, hosts, running, now, usage):
        learn(pending, running, now)
        new = [p.id for p in pending if p.id in asked and p.id not in predicted]
        if new:
            expected = replay_starts(pending, hosts, running, SIM_CONFIG, now, usage).starts
            # A trace has no job names: a user's jobs are one kind (coarser than a worker's kinds).
            durations = {kind_of(j.user, j.id): runs_of.get(j.user, []) for j in [*pending, *running]}
            usual = typical_runs(pending, running, durations, now)
            sooner = replay_starts(pending, hosts, running, SIM_CONFIG, now, usage, run_for=usual).starts
            for job_id in new:
                predicted[job_id] = expected.get(job_id)
                likely[job_id] = sooner.get(job_id)
        return plan(pending, hosts, running, SIM_CONFIG, now, explain=False, usage=usage)

    out = replay(
        jobs, cluster, decide, SIM_CONFIG.grace_s, config=SIM_CONFIG, timing=PassTiming(SIM_CONFIG.poll_interval)
    )
    submit = {j.id: j.submit_s for j in jobs}
    estimated = {i: t for i, t in predicted.items() if t is not None and i in out.waits}
    starts = {i: submit[i] + out.waits[i] for i in estimated}
    errors = [abs(estimated[i] - starts[i]) for i in estimated]
    waits = [out.waits[i] for i in estimated]
    waited = [i for i in estimated if out.waits[i] > SLACK_S]  # those a user would look up
    # The range: from the likely start (jobs ahead end as their owners' usually do) to the latest.
    low = {i: min(likely.get(i) or estimated[i], estimated[i]) for i in estimated}
    inside = [i for i in estimated if low[i] - SLACK_S <= starts[i] <= estimated[i] + SLACK_S]
    likely_errors = [abs(low[i] - starts[i]) for i in estimated]
    return {
        "inside": len(inside),
        "waited_inside": sum(1 for i in waited if i in set(inside)),
        "median_likely_error_s": statistics.median(likely_errors) if likely_errors else 0.0,
        "waited_median_likely_error_s": statistics.median([abs(low[i] - starts[i]) for i in waited]) if waited else 0.0,
        "waited_median_error_s": statistics.median([abs(estimated[i] - starts[i]) for i in waited]) if waited else 0.0,
        "waited_median_wait_s": statistics.median([out.waits[i] for i in waited]) if waited else 0.0,
        # How wide the range is: a wider one holds more starts without saying more.
        "waited_median_range_s": statistics.median([estimated[i] - low[i] for i in waited]) if waited else 0.0,
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
    heads = ("asked", "with one", "by it", "in range", "within 1 min", "error latest", "error likely", "median wait")
    widths = (6, 9, 6, 9, 13, 13, 13, 12)
    print(f"{'scenario':24s} " + " ".join(f"{h:>{w}s}" for h, w in zip(heads, widths)))
    totals = {
        key: 0 for key in ("estimated", "by_it", "within_minute", "waited", "waited_by_it", "waited_within_minute")
    }
    totals.update(inside=0, waited_inside=0)
    waited_rows = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(run, [args.traces] * len(SCENARIOS), SCENARIOS, [args.every] * len(SCENARIOS)):
            n = max(1, r["estimated"])
            print(
                f"{r['scenario']:24s} {r['asked']:6d} {r['estimated'] / max(1, r['asked']):9.0%} "
                f"{r['by_it'] / n:6.0%} {r['inside'] / n:9.0%} {r['within_minute'] / n:13.0%} "
                f"{r['median_error_s']:12,.0f}s {r['median_likely_error_s']:12,.0f}s {r['median_wait_s']:11,.0f}s",
                flush=True,
            )
            for key in totals:
                totals[key] += r[key]
            waited_rows.append(r)
    n, w = max(1, totals["estimated"]), max(1, totals["waited"])
    print(
        f"\nall: {totals['estimated']:,} estimates; {totals['by_it'] / n:.0%} started by the latest, "
        f"{totals['inside'] / n:.0%} inside the range (likely .. latest, a minute's slack), "
        f"{totals['within_minute'] / n:.0%} within a minute of the latest.\nOf the {totals['waited']:,} jobs that "
        f"waited over a minute: {totals['waited_by_it'] / w:.0%} started by the latest, "
        f"{totals['waited_inside'] / w:.0%} inside the range, {totals['waited_within_minute'] / w:.0%} within a "
        "minute of the latest. Per scenario, their median errors against their median wait, and how wide the range is:"
    )
    for r in waited_rows:
        print(
            f"  {r['scenario']:24s} {r['waited']:5d} waited: likely off by "
            f"{r['waited_median_likely_error_s']:>9,.0f}s, latest by {r['waited_median_error_s']:>9,.0f}s, "
            f"wait {r['waited_median_wait_s']:>9,.0f}s, range {r['waited_median_range_s']:>9,.0f}s wide"
        )


if __name__ == "__main__":
    main()
