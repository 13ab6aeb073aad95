"""The alerts extra's publisher: each time a worker publishes its box's state (at most once per
poll interval), it evaluates the alerts for its own GPUs and jobs and — on the live host first
by name, so that one host speaks for the queue — for waiting jobs and silent workers. Each
alert is raised once and stays until it clears: written to state/alerts/HOST.json (view.py
shows it in `gpuq status`), and handed, when it appears, to config `alert_command` as JSON on
stdin."""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import asdict, dataclass

from gpuq.extras.alerts import alerts_file
from gpuq.host.files import write_json
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.jobs import PendingJob
from gpuq.model.record import Record
from gpuq.model.units import format_duration, format_mib
from gpuq.spool.layout import Layout
from gpuq.worker.ended import SHORT_JOB_S
from gpuq.worker.publishing import Published, StartPublisher

log = logging.getLogger("gpuq.alerts")
SHORT_JOBS_WINDOW_S = 600.0
_Found = tuple[str, str, str]  # an alert found this pass: (kind, subject, message)


@dataclass(frozen=True)
class Alert:
    kind: str  # long_wait, idle_holder, gpu_mem_overuse, gpu_hot, worker_silent, short_job_flood
    subject: str  # the job, GPU or host it is about
    host: str  # the host that raised it
    message: str
    since: float  # wall clock

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.subject}"


class AlertWatch:
    def __init__(self, config: "Config", host: str) -> None:
        self.config, self.host = config, host
        self.low_util_since: dict[str, float] = {}  # job -> since when it holds memory idly
        self.current: dict[str, Alert] = {}
        self.children: list[subprocess.Popen] = []

    def evaluate(
        self,
        now: float,
        gpus: list["GpuSnapshot"],
        running: list["Record"],
        observed: dict[str, dict[int, int]],
        overuse: dict[str, str],
        pending: list["PendingJob"],
        silent_hosts: dict[str, float],
        speaks_for_queue: bool,
        short_jobs: int = 0,
    ) -> list[Alert]:
        """This pass's alerts (pure but for the idle-holder clock it keeps)."""
        found = self._hot_gpus(gpus) + self._job_alerts(now, gpus, running, observed, overuse)
        found += self._short_job_flood(short_jobs)
        if speaks_for_queue:
            found += self._queue_alerts(now, pending, silent_hosts)
        return [
            Alert(
                kind,
                subject,
                self.host,
                message,
                self.current[f"{kind}:{subject}"].since if f"{kind}:{subject}" in self.current else now,
            )
            for kind, subject, message in found
        ]

    def _hot_gpus(self, gpus: list["GpuSnapshot"]) -> list[_Found]:
        c = self.config
        found: list[_Found] = []
        for g in gpus:
            if g.temp_c is not None and g.temp_c >= c.alert_gpu_temp_c:
                found.append(
                    (
                        "gpu_hot",
                        f"{self.host}:{g.index}",
                        f"GPU {self.host}:{g.index} at {g.temp_c}°C (alert_gpu_temp_c {c.alert_gpu_temp_c})",
                    )
                )
            if c.alert_gpu_power_w and g.power_w is not None and g.power_w >= c.alert_gpu_power_w:
                found.append(
                    (
                        "gpu_hot",
                        f"{self.host}:{g.index}",
                        f"GPU {self.host}:{g.index} draws {g.power_w:g} W (alert_gpu_power_w {c.alert_gpu_power_w:g})",
                    )
                )
        return found

    def _job_alerts(
        self,
        now: float,
        gpus: list["GpuSnapshot"],
        running: list["Record"],
        observed: dict[str, dict[int, int]],
        overuse: dict[str, str],
    ) -> list[_Found]:
        """This box's jobs holding GPU memory idly (for alert_idle_holder_s: the clock is kept
        here, and forgotten for jobs gone) or using more than they declared."""
        c = self.config
        found: list[_Found] = []
        util = {g.index: g.util_pct or 0 for g in gpus}
        for r in running:
            held = sum(observed.get(r.id, {}).values())
            idle = held > 0 and r.gpus and all(util.get(i, 0) < c.alert_idle_util_pct for i in r.gpus)
            since = self.low_util_since.setdefault(r.id, now) if idle else self.low_util_since.pop(r.id, None)
            if idle and since is not None and now - since >= c.alert_idle_holder_s:
                found.append(
                    (
                        "idle_holder",
                        r.id,
                        f"job {r.id} ({r.user}) holds {format_mib(held)} of GPU memory "
                        f"at under {c.alert_idle_util_pct}% utilization for "
                        f"{format_duration(now - since)}",
                    )
                )
            if r.id in overuse:
                found.append(("gpu_mem_overuse", r.id, f"job {r.id} ({r.user}) {overuse[r.id]}"))
        for job_id in set(self.low_util_since) - {r.id for r in running}:
            del self.low_util_since[job_id]
        return found

    def _short_job_flood(self, short_jobs: int) -> list[_Found]:
        if short_jobs < self.config.alert_short_jobs:
            return []
        return [
            (
                "short_job_flood",
                self.host,
                f"{short_jobs} jobs ran under {SHORT_JOB_S:g} s each on {self.host} in the last "
                f"{format_duration(SHORT_JOBS_WINDOW_S)}: gpuq's cost per job (spool files, a process) "
                f"outweighs such work; batch it into fewer, longer jobs",
            )
        ]

    def _queue_alerts(self, now: float, pending: list["PendingJob"], silent_hosts: dict[str, float]) -> list[_Found]:
        """What the host that speaks for the queue says: jobs waiting long, workers gone silent."""
        c = self.config
        found: list[_Found] = []
        for job in pending:
            if now - job.queued_at >= c.alert_wait_s:
                found.append(
                    (
                        "long_wait",
                        job.id,
                        f"job {job.id} ({job.user}) has waited {format_duration(now - job.queued_at)}",
                    )
                )
        for host, silent_s in sorted(silent_hosts.items()):
            if silent_s >= c.alert_worker_silent_s:
                found.append(
                    (
                        "worker_silent",
                        host,
                        f"the worker of {host} has not renewed its heartbeat for {format_duration(silent_s)}",
                    )
                )
        return found

    def update(self, alerts: list[Alert]) -> list[Alert]:
        """Keep this pass's alerts; returns the new ones, after handing them to the command."""
        fresh = [a for a in alerts if a.key not in self.current]
        self.current = {a.key: a for a in alerts}
        for alert in fresh:
            log.warning("alert: %s", alert.message)
            self._notify(alert)
        self.children = [p for p in self.children if p.poll() is None]
        return fresh

    def _notify(self, alert: Alert) -> None:
        if not self.config.alert_command:
            return
        try:
            proc = subprocess.Popen(
                self.config.alert_command,
                shell=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            proc.stdin.write(json.dumps(asdict(alert)).encode() + b"\n")  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
            self.children.append(proc)
        except OSError as e:
            log.warning("alert_command %r failed: %s", self.config.alert_command, e)

    def as_json(self) -> list[dict]:
        return [asdict(a) for a in self.current.values()]


class AlertsFile:
    """What the extra registers (hooks.BoxPublisher): this box's alerts, evaluated with each
    publication of its state and written beside its heartbeat."""

    def __init__(self, layout: Layout, config: Config, host: str) -> None:
        self.config, self.host = config, host
        self.watch = AlertWatch(config, host)
        self.path = alerts_file(layout, host)
        layout.make_state_dir(self.path.parent)

    def __call__(self, published: Published) -> None:
        state, now = published.state, published.wall
        silent = state.others_silent_s
        live = {h for h, s in silent.items() if s < self.config.alert_worker_silent_s} | {self.host}
        published.finished.counts()  # reads this host's new events
        alerts = self.watch.evaluate(
            now,
            state.gpus,
            state.running,
            state.observed,
            state.warnings,
            published.intake.pending(),
            silent,
            speaks_for_queue=self.host == min(live),
            short_jobs=published.finished.short_jobs_since(now - SHORT_JOBS_WINDOW_S),
        )
        self.watch.update(alerts)
        write_json(self.path, {"host": self.host, "t": now, "alerts": self.watch.as_json()}, durable=False)


# mypy checks that it is a StartPublisher.
start: StartPublisher = AlertsFile
