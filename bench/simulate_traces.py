#!/usr/bin/env python3
"""Replays the real traces (../shared/traces, or --traces DIR) through `gpuq simulate` and
prints the scheduling targets, the trade-offs behind gpuq's defaults, and replay speed.

    python bench/simulate_traces.py [--traces DIR] [--quick]

1. Alibaba's dense window (submit_s >= 9655000) on 3x8x32GiB: gpuq against pack-bestfit and
   fifo-exclusive. Targets: mean wait <= 1.1x pack-bestfit's and <= 1/20 of fifo-exclusive's;
   longest wait of an 8-GPU job no worse than pack-bestfit's.
2. The same with about a third of the jobs low (`--mark-low 0.33`: SHA-1 of job_id, see
   gpuq/trace.py), against the same trace without those jobs. Targets: the other jobs' mean
   wait <= 1.1x; GPU occupancy higher.
3. Trade-offs: reserve_after_s, reservations off, fragmentation-aware placement off, grace.
4. Helios and Philly sized to 4x8x32GiB by stretching their arrivals; replay time of 10,000+ jobs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from _common import PY, REPO

DENSE = ["--since", "9655000", "--cluster", "3x8x32GiB"]


def simulate(trace: Path, *args: str) -> dict:
    out = subprocess.run([PY, str(REPO / "gpuq.py"), "simulate", str(trace), *args, "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["policies"]


def check(label: str, ok: bool, detail: str) -> None:
    print(f"  [{'met' if ok else 'MISSED'}] {label}: {detail}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    p.add_argument("--quick", action="store_true", help="targets only, no trade-off sweep")
    args = p.parse_args()
    alibaba = args.traces / "alibaba_openb2023.csv"

    print("1. Alibaba dense window on 3x8x32GiB (6,186 jobs)")
    r = simulate(alibaba, *DENSE)
    print(f"  {'policy':16s} {'wait mean':>11s} {'p50':>9s} {'p95':>10s} {'p99':>10s} {'max 8-GPU':>11s} "
          f"{'occupancy':>9s} {'replay':>7s}")
    for name, f in r.items():
        print(f"  {name:16s} {f['wait_mean_s']:11,.0f} {f['wait_p50_s']:9,.0f} {f['wait_p95_s']:10,.0f} "
              f"{f['wait_p99_s']:10,.0f} {f['wait_max_by_gpus'].get('8', 0):11,.0f} {f['occupancy']:9.1%} "
              f"{f['replay_s']:6.1f}s")
    g, pack, fifo = r["gpuq"], r["pack-bestfit"], r["fifo-exclusive"]
    check("mean wait <= 1.1x pack-bestfit", g["wait_mean_s"] <= 1.1 * pack["wait_mean_s"],
          f"{g['wait_mean_s'] / pack['wait_mean_s']:.3f}x")
    check("mean wait <= 1/20 of fifo-exclusive", g["wait_mean_s"] <= fifo["wait_mean_s"] / 20,
          f"{g['wait_mean_s'] / fifo['wait_mean_s']:.3f}x")
    check("longest 8-GPU wait <= pack-bestfit's",
          g["wait_max_by_gpus"]["8"] <= pack["wait_max_by_gpus"]["8"],
          f"{g['wait_max_by_gpus']['8'] / pack['wait_max_by_gpus']['8']:.3f}x")

    print("\n2. The same with a third of the jobs low (--mark-low 0.33), gpuq policy")
    with_low = simulate(alibaba, *DENSE, "--mark-low", "0.33", "--policy", "gpuq")["gpuq"]
    without = simulate(alibaba, *DENSE, "--mark-low", "0.33", "--without-low")
    w_normal = with_low["wait_mean_by_priority"]["normal"]
    o_normal = without["gpuq"]["wait_mean_by_priority"]["normal"]
    print(f"  other jobs' mean wait: {w_normal:,.0f} s with the low jobs, {o_normal:,.0f} s without them "
          f"(pack-bestfit without them: {without['pack-bestfit']['wait_mean_s']:,.0f} s)")
    print(f"  low jobs: {with_low['wait_mean_by_priority']['low']:,.0f} s mean wait, "
          f"{with_low['preemptions']:,} preemptions, all {with_low['jobs']:,} jobs finished")
    check("other jobs' mean wait <= 1.1x without the low jobs", w_normal <= 1.1 * o_normal,
          f"{w_normal / o_normal:.3f}x")
    check("GPU occupancy higher with them", with_low["occupancy"] > without["gpuq"]["occupancy"],
          f"{with_low['occupancy']:.1%} vs {without['gpuq']['occupancy']:.1%}")

    if not args.quick:
        print("\n3. Trade-offs (gpuq policy; dense window; normal = the jobs not marked low)")
        print(f"  {'setting':34s} {'all-normal mean':>15s} {'max 8-GPU':>11s} {'with low: normal':>17s} "
              f"{'low':>10s} {'occupancy':>9s}")
        for label, sets in [("defaults (reserve_after_s 3600)", []),
                            ("reserve_after_s 600", ["reserve_after_s=600"]),
                            ("reserve_after_s 14400", ["reserve_after_s=14400"]),
                            ("reservations off", ["reservations=false"]),
                            ("fragmentation_aware off", ["fragmentation_aware=false"]),
                            ("grace_s 60", ["grace_s=60", "lost_after_s=600"]),
                            ("grace_s 300", ["grace_s=300", "lost_after_s=1800"])]:
            extra = [a for s in sets for a in ("--set", s)]
            plain = simulate(alibaba, *DENSE, "--policy", "gpuq", *extra)["gpuq"]
            low = simulate(alibaba, *DENSE, "--mark-low", "0.33", "--policy", "gpuq", *extra)["gpuq"]
            print(f"  {label:34s} {plain['wait_mean_s']:15,.0f} {plain['wait_max_by_gpus']['8']:11,.0f} "
                  f"{low['wait_mean_by_priority']['normal']:17,.0f} {low['wait_mean_by_priority']['low']:10,.0f} "
                  f"{low['occupancy']:9.1%}")

    print("\n4. Other traces, arrivals stretched to fit 4x8x32GiB")
    for name, args_ in [("helios_dirlab_gpu.csv", ["--stretch", "25"]),
                        ("philly_dirlab15k.csv", ["--since", "4147200", "--stretch", "60"])]:
        res = simulate(args.traces / name, "--cluster", "4x8x32GiB", *args_)
        g, pack, fifo = res["gpuq"], res["pack-bestfit"], res["fifo-exclusive"]
        print(f"  {name} {' '.join(args_)}: {g['jobs']:,} jobs ({g['capped']} capped to 8 GPUs); mean wait "
              f"gpuq {g['wait_mean_s']:,.0f} s, pack-bestfit {pack['wait_mean_s']:,.0f} s, fifo-exclusive "
              f"{fifo['wait_mean_s']:,.0f} s; gpuq replay {g['replay_s']:.1f} s")


if __name__ == "__main__":
    main()
