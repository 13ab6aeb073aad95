"""The policies `gpuq simulate` compares, the figures it reports, and the table it prints."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from gpuq.extras.sim.simulate import Outcome, fifo_exclusive, plan_policy, replay
from gpuq.extras.sim.slurm_easy import SlurmEasy
from gpuq.extras.sim.timing import PassTiming
from gpuq.extras.sim.trace import Cluster, TraceJob
from gpuq.model.config import Config

# The simulated GPUs are given as what jobs may use (no reserve), and memory alone limits
# how many jobs share one (traces hold shares down to 1/20 of a GPU).
SIM_CONFIG = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=64)
POLICIES = ("gpuq", "slurm-easy", "pack-bestfit", "fifo-exclusive")


def run_policy(
    name: str, jobs: list[TraceJob], cluster: Cluster, config: Config, colocation_penalty: float = 0.0
) -> Outcome:
    """Each policy runs as the workers would run it: a box passes at the moments its wake
    rules give (timing.py), with the config's poll interval. `colocation_penalty`:
    simulate.replay's (only policies that share GPUs feel it)."""
    timing = PassTiming(config.poll_interval)

    def planned(replayed: list[TraceJob], planner_config: Config) -> Outcome:
        decide = plan_policy(planner_config)
        return replay(
            replayed,
            cluster,
            decide,
            config.grace_s,
            config=planner_config,
            timing=timing,
            colocation_penalty=colocation_penalty,
        )

    if name == "gpuq":
        return planned(jobs, config)
    if name == "pack-bestfit":
        baseline = replace(
            config, fair_share=False, reservations=False, preemption=False, fragmentation_aware=False, spread=False
        )
        return planned(
            [replace(j, spec=replace(j.spec, priority_class="normal", priority=0, preemptible=False)) for j in jobs],
            baseline,
        )
    if name == "slurm-easy":
        return replay(jobs, cluster, SlurmEasy(jobs), config.grace_s, exclusive=True, timing=timing)
    if name == "fifo-exclusive":
        return replay(jobs, cluster, fifo_exclusive, config.grace_s, exclusive=True, timing=timing)
    raise ValueError(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def figures(out: Outcome, jobs: list[TraceJob]) -> dict[str, Any]:
    """The --json schema for one policy (README.md here)."""
    waits = [out.waits[j.id] for j in jobs if j.id in out.ends]
    by_gpus: dict[str, float] = {}
    all_by_gpus: dict[str, list[float]] = {}
    by_priority_gpus: dict[str, dict[str, float]] = {}
    by_priority: dict[str, list[float]] = {}
    slowdowns = []
    for j in jobs:
        if j.id not in out.ends:
            continue
        wait = out.waits[j.id]
        key = str(j.spec.gpus)
        by_gpus[key] = max(by_gpus.get(key, 0.0), wait)
        all_by_gpus.setdefault(key, []).append(wait)
        per_class = by_priority_gpus.setdefault(j.spec.priority_class, {})
        per_class[key] = max(per_class.get(key, 0.0), wait)
        by_priority.setdefault(j.spec.priority_class, []).append(wait)
        slowdowns.append((out.ends[j.id] - j.submit_s) / max(j.duration_s, 1.0))
    makespan = max(out.ends.values(), default=out.first_submit) - out.first_submit
    span = out.last_submit - out.first_submit
    return {
        "wait_mean_s": statistics.fmean(waits) if waits else 0.0,
        "wait_p50_s": _pct(waits, 50),
        "wait_p95_s": _pct(waits, 95),
        "wait_p99_s": _pct(waits, 99),
        "wait_max_s": max(waits, default=0.0),
        "wait_max_by_gpus": dict(sorted(by_gpus.items(), key=lambda kv: int(kv[0]))),
        "wait_mean_by_gpus": {
            k: statistics.fmean(v) for k, v in sorted(all_by_gpus.items(), key=lambda kv: int(kv[0]))
        },
        "wait_mean_by_priority": {k: statistics.fmean(v) for k, v in sorted(by_priority.items())},
        "wait_max_by_priority_gpus": {
            k: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for k, v in sorted(by_priority_gpus.items())
        },
        "low_jobs_unfinished": sum(1 for j in jobs if j.spec.preemptible and j.id not in out.ends),
        "slowdown_mean": statistics.fmean(slowdowns) if slowdowns else 0.0,
        "makespan_s": makespan,
        "occupancy": out.busy_gpu_s / (out.gpus * span) if span else 0.0,
        "free_while_waiting": (out.free_while_waiting_gpu_s / (out.gpus * out.waiting_s) if out.waiting_s else 0.0),
        "preemptions": out.preemptions,
        "timeouts": out.timeouts,
        "peak_queue": out.peak_queue,
        "jobs": len(out.ends),
        "capped": sum(1 for j in jobs if j.capped),
    }


ROWS = [
    ("wait mean", "wait_mean_s", "s"),
    ("wait p50", "wait_p50_s", "s"),
    ("wait p95", "wait_p95_s", "s"),
    ("wait p99", "wait_p99_s", "s"),
    ("wait max", "wait_max_s", "s"),
    ("slowdown mean", "slowdown_mean", "x"),
    ("makespan", "makespan_s", "s"),
    ("GPU occupancy (arrivals)", "occupancy", "%"),
    ("GPUs free while work waits", "free_while_waiting", "%"),
    ("preemptions", "preemptions", "n"),
    ("stopped at their time limit", "timeouts", "n"),
    ("peak queue", "peak_queue", "n"),
    ("jobs finished", "jobs", "n"),
    ("jobs capped to one host", "capped", "n"),
]


def _cell(value: float, unit: str) -> str:
    if unit == "%":
        return f"{100 * value:.1f}%"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "n":
        return f"{int(value):,}"
    return f"{value:,.0f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """Figures side by side; the last column divides the first policy's by each other's."""
    names = list(results)
    head = f"{'':28s}" + "".join(f"{n:>16s}" for n in names)
    if len(names) > 1:
        head += "".join(f"{names[0] + '/' + n:>26s}" for n in names[1:])
    lines = [head]
    rows: list[tuple[str, str | tuple[str, str], str]] = list(ROWS)
    for gpus in sorted({g for r in results.values() for g in r["wait_max_by_gpus"]}, key=int):
        rows.append((f"wait mean, {gpus}-GPU jobs", ("wait_mean_by_gpus", gpus), "s"))
        rows.append((f"wait max, {gpus}-GPU jobs", ("wait_max_by_gpus", gpus), "s"))
    for cls in sorted({c for r in results.values() for c in r["wait_mean_by_priority"]}):
        rows.append((f"wait mean, {cls}", ("wait_mean_by_priority", cls), "s"))
    for label, key, unit in rows:
        values = [(r[key[0]].get(key[1]) if isinstance(key, tuple) else r[key]) for r in results.values()]
        line = f"{label:28s}" + "".join(f"{'-' if v is None else _cell(v, unit):>16s}" for v in values)
        for v in values[1:]:
            ratio = "-" if values[0] is None or not v else f"{values[0] / v:.3f}"
            line += f"{ratio:>26s}"
        lines.append(line)
    return "\n".join(lines)
