"""`gpuq simulate`: what a trace would do under gpuq's planner, beside the baselines."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

from gpuq.extras.sim.simreport import POLICIES, SIM_CONFIG, figures, run_policy, table
from gpuq.extras.sim.trace import TraceError, load_trace, mark_low, parse_cluster
from gpuq.model.config import ConfigError, validate


def cmd_simulate(args: argparse.Namespace) -> int:
    if args.stretch <= 0:
        print(f"gpuq simulate: --stretch {args.stretch:g}: write a factor above 0, e.g. 1.5", file=sys.stderr)
        return 2
    if args.mark_low is not None and not 0 <= args.mark_low <= 1:
        print(f"gpuq simulate: --mark-low {args.mark_low:g}: write a fraction from 0 to 1, e.g. 0.33", file=sys.stderr)
        return 2
    if args.without_low and not args.mark_low:
        print("gpuq simulate: --without-low leaves out the jobs --mark-low marks: give --mark-low too", file=sys.stderr)
        return 2
    try:
        cluster = parse_cluster(args.cluster)
        jobs = load_trace(Path(args.trace), cluster, args.since, args.stretch, args.jobs)
    except TraceError as e:
        print(f"gpuq simulate: {e}", file=sys.stderr)
        return 2
    if not 0.0 <= args.colocation_penalty < 1.0:
        print(
            f"gpuq simulate: --colocation-penalty {args.colocation_penalty:g}: write a fraction from 0 to below 1, "
            "e.g. 0.15",
            file=sys.stderr,
        )
        return 2
    if args.mark_low:
        jobs = mark_low(jobs, args.mark_low, drop=args.without_low, rule=args.mark_rule)
        if not jobs:
            print(f"gpuq simulate: --mark-low {args.mark_low:g} --without-low leaves no job to replay", file=sys.stderr)
            return 2
    settings: dict = {}
    for item in args.set or []:
        key, _, value = item.partition("=")

        settings[key] = yaml.safe_load(value)
    try:
        overrides = validate(settings, "--set") if settings else None
    except ConfigError as e:
        print(f"gpuq simulate: {e}", file=sys.stderr)
        return 2
    config = (
        SIM_CONFIG
        if overrides is None
        else replace(
            overrides,
            gpu_mem_reserve_mib=SIM_CONFIG.gpu_mem_reserve_mib,
            max_jobs_per_gpu=overrides.max_jobs_per_gpu
            if "max_jobs_per_gpu" in settings
            else SIM_CONFIG.max_jobs_per_gpu,
        )
    )
    results = {}
    for name in args.policy or POLICIES:
        started = time.perf_counter()
        results[name] = figures(run_policy(name, jobs, cluster, config, args.colocation_penalty), jobs)
        results[name]["replay_s"] = time.perf_counter() - started
    if args.json:
        print(
            json.dumps({"trace": args.trace, "cluster": str(cluster), "jobs": len(jobs), "policies": results}, indent=1)
        )
    else:
        print(f"{args.trace}: {len(jobs):,} jobs on {cluster} ({cluster.gpus} GPUs); times in seconds")
        print(table(results))
        print("replayed in " + ", ".join(f"{n} {r['replay_s']:.1f}s" for n, r in results.items()))
    return 0
