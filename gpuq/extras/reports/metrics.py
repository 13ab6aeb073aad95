"""Prometheus metrics: each worker writes its host's figures in the text exposition format,
atomically, as node_exporter's textfile collector expects (`<dir>/gpuq-<host>.prom`; point
`--collector.textfile.directory` at config `metrics_dir`). contrib/grafana-gpuq.json is a
dashboard for them. Rendering is pure; `MetricsFile`, the extra's publisher
(hooks.BoxPublisher), decides when the file is due and writes it as the box publishes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from gpuq.host.files import atomic_write
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.record import Record
from gpuq.model.stops import StopCause
from gpuq.spool.layout import Layout
from gpuq.worker.publishing import Published, StartPublisher

MIB = 2**20
EVERY_S = 10.0  # and when the running jobs change, at most every MIN_GAP_S
MIN_GAP_S = 1.0

HELP = {
    "gpuq_up": ("gauge", "1 while this host's worker runs"),
    "gpuq_heartbeat_timestamp_seconds": ("gauge", "when the worker last wrote its heartbeat"),
    "gpuq_gpu_memory_total_bytes": ("gauge", "GPU memory, total"),
    "gpuq_gpu_memory_used_bytes": ("gauge", "GPU memory in use (NVML), by anyone"),
    "gpuq_gpu_memory_declared_bytes": ("gauge", "GPU memory charged to gpuq jobs: declared, or observed when above"),
    "gpuq_gpu_utilization_ratio": ("gauge", "GPU utilization, 0 to 1"),
    "gpuq_gpu_temperature_celsius": ("gauge", "GPU temperature"),
    "gpuq_gpu_power_watts": ("gauge", "GPU power draw"),
    "gpuq_gpu_jobs": ("gauge", "gpuq jobs running on the GPU"),
    "gpuq_gpu_in_use_by_others": ("gauge", "1 while a non-gpuq process uses the GPU"),
    "gpuq_jobs": ("gauge", "jobs by state: running and yielding on this host; pending as this worker sees the queue"),
    "gpuq_jobs_finished_total": ("counter", "jobs this host's worker saw end, by final state, since it started"),
    "gpuq_user_gpus": ("gauge", "GPUs held by the user's running jobs on this host"),
    "gpuq_user_jobs": ("gauge", "the user's jobs by state (running on this host; pending in the queue)"),
    "gpuq_job_gpu_memory_bytes": (
        "gauge",
        "GPU memory a running job uses (NVML, its process tree), summed over its GPUs",
    ),
}


@dataclass
class HostFigures:
    host: str
    heartbeat_t: float
    gpus: list["GpuSnapshot"]
    running: list["Record"]
    observed: dict[str, dict[int, int]]
    pending_users: list[str]
    yielding: set[str] = field(default_factory=set)
    busy_by_others: set[int] = field(default_factory=set)
    finished: dict[str, int] = field(default_factory=dict)


class MetricsFile:
    """The extra's publisher: this host's file, written every EVERY_S and within MIN_GAP_S of
    a change of the jobs running here, whatever pace the box publishes at."""

    def __init__(self, layout: Layout, config: Config, host: str) -> None:
        self.path = (
            Path(config.metrics_dir.replace("{host}", host)) / f"gpuq-{host}.prom"
            if config.metrics_dir
            else layout.state / "metrics" / f"gpuq-{host}.prom"
        )
        self.written_at = 0.0
        self.written_running: tuple[str, ...] = ()

    def __call__(self, published: Published) -> None:
        running = tuple(r.id for r in published.state.running)
        since = published.mono - self.written_at
        if since < EVERY_S and (running == self.written_running or since < MIN_GAP_S):
            return
        self.written_at, self.written_running = published.mono, running
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, render(figures(published)).encode(), mode=0o644, durable=False)


# What the extra registers (hooks.BoxPublisher names it): mypy checks it is a StartPublisher.
start: StartPublisher = MetricsFile


def figures(published: Published) -> HostFigures:
    state = published.state
    return HostFigures(
        published.host,
        published.wall,
        state.gpus,
        state.running,
        state.observed,
        [e.job.user for e in published.intake.entries.values() if e.job is not None],
        {j for j, order in state.stopping.items() if order.cause is StopCause.PREEMPT},  # yielding
        {i for i, t in state.others_idle_since.items() if t is None},
        published.finished.counts(),
    )


def _labels(**labels: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def render(f: HostFigures) -> str:
    samples: dict[str, list[tuple[str, float]]] = {name: [] for name in HELP}

    def add(metric: str, value: float | None, **labels: object) -> None:
        if value is not None:
            samples[metric].append((_labels(host=f.host, **labels), value))

    add("gpuq_up", 1)
    add("gpuq_heartbeat_timestamp_seconds", round(f.heartbeat_t, 3))
    for g in f.gpus:
        on_gpu = [r for r in f.running if g.index in r.gpus]
        declared = sum(max(r.gpu_mem_mib or 0, f.observed.get(r.id, {}).get(g.index, 0)) for r in on_gpu)
        add("gpuq_gpu_memory_total_bytes", g.mem_total_mib * MIB, gpu=g.index, uuid=g.uuid, name=g.name)
        add("gpuq_gpu_memory_used_bytes", g.mem_used_mib * MIB, gpu=g.index)
        add("gpuq_gpu_memory_declared_bytes", declared * MIB, gpu=g.index)
        add("gpuq_gpu_utilization_ratio", None if g.util_pct is None else g.util_pct / 100, gpu=g.index)
        add("gpuq_gpu_temperature_celsius", g.temp_c, gpu=g.index)
        add("gpuq_gpu_power_watts", g.power_w, gpu=g.index)
        add("gpuq_gpu_jobs", len(on_gpu), gpu=g.index)
        add("gpuq_gpu_in_use_by_others", 1 if g.index in f.busy_by_others else 0, gpu=g.index)
    add("gpuq_jobs", len([r for r in f.running if r.id not in f.yielding]), state="running")
    add("gpuq_jobs", len(f.yielding), state="yielding")
    add("gpuq_jobs", len(f.pending_users), state="pending")
    for state, count in sorted(f.finished.items()):
        add("gpuq_jobs_finished_total", count, state=state)
    users = sorted({r.user for r in f.running} | set(f.pending_users))
    for user in users:
        mine = [r for r in f.running if r.user == user]
        add("gpuq_user_gpus", sum(len(r.gpus) for r in mine), user=user)
        add("gpuq_user_jobs", len(mine), user=user, state="running")
        add("gpuq_user_jobs", f.pending_users.count(user), user=user, state="pending")
    for r in f.running:
        add("gpuq_job_gpu_memory_bytes", sum(f.observed.get(r.id, {}).values()) * MIB, job=r.id, user=r.user)
    return "".join(_family(name, values) for name, values in samples.items() if values)


def _family(name: str, values: Iterable[tuple[str, float]]) -> str:
    kind, text = HELP[name]
    lines = [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels} {value!r}" for labels, value in values]
    return "\n".join(lines) + "\n"
