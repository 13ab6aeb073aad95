"""What a box tells the others: its heartbeat (state/workers/<host>.json, the snapshot every
box plans with: spool/teamstate.py), the lease its own supervisors watch, the shared spec
cache, and what the extras write beside them (hooks.BoxPublisher: the reports extra's
Prometheus metrics). The worker gathers a `BoxState` in its pass; this module only decides
when each of its own files is due and writes it, and hands each publication to the extras'.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Protocol

import psutil

from gpuq import __version__, hooks
from gpuq.host.files import write_json
from gpuq.model.config import Config
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.record import Record
from gpuq.model.stops import StopOrder
from gpuq.run.joblocal import write_lease
from gpuq.spool.intake import Intake
from gpuq.spool.layout import Layout
from gpuq.worker.box import Box
from gpuq.worker.ended import FinishedCounter

log = logging.getLogger("gpuq.worker")
SPEC_CACHE_EVERY_S = 5.0


@dataclass(frozen=True)
class BoxState:
    """What this box's last pass saw, as its heartbeat and the extras' publishers (alerts,
    metrics) carry it."""

    gpus: list[GpuSnapshot]
    running: list[Record]
    observed: dict[str, dict[int, int]]  # job id -> GPU index -> MiB its processes use
    others_idle_since: dict[int, float | None]  # GPU index -> free of others' use since (None: in use)
    stopping: dict[str, StopOrder]  # running jobs told to stop: when and why
    warnings: dict[str, str]  # job id -> its GPU memory overuse
    others_silent_s: dict[str, float]  # another box -> how long its heartbeat has stood still, on this box's clock
    probe_error: str | None
    runtimes: dict[str, str]
    runtime_problems: dict[str, str]
    mps: dict | None  # None unless gpu_sharing is mps


@dataclass(frozen=True)
class Published:
    """One publication of a box's state, as the extras' publishers get it. `intake` and
    `finished` are the worker's own, handed over unread: a publisher asks them only when it
    writes (the count reads the event log on the shared disk, the pending jobs are thousands)."""

    host: str
    state: BoxState
    mono: float  # when, on the worker's clocks
    wall: float
    intake: Intake  # the pending jobs as this worker read them
    finished: FinishedCounter  # the jobs that ended here since the worker started
    last: bool = False  # the worker's last publication: it is stopping (the samples' partial line)


Publish = Callable[[Published], None]


class StartPublisher(Protocol):
    """What a hooks.BoxPublisher's `start` names: called once as a worker starts."""

    def __call__(self, layout: Layout, config: Config, host: str) -> Publish: ...


def start_extras(layout: Layout, config: Config, host: str) -> list[tuple[str, Publish]]:
    """The extras' publishers, started for this worker. One that fails to start is logged and
    left out (someone else's code must not stop the worker), and a config key set that only an
    absent extra reads is said once, here (`metrics_dir` without the reports extra)."""
    for unused, fix in hooks.unused_keys(config):
        log.warning("%s. Fix: %s", unused, fix)
    return hooks.start_each(
        "publisher", hooks.registry().publishers, layout, config, host, without="this worker goes on without it"
    )


class Publisher:
    """Writes what a box publishes, each at its own pace: a burst of short jobs wakes the
    worker hundreds of times a second, and none of these files needs to follow it."""

    def __init__(self, box: Box, finished: FinishedCounter, extras: list[tuple[str, Publish]]) -> None:
        """`extras`: the extras' publishers (start_extras), each with its name."""
        self.layout, self.config, self.host, self.boot_id, self.rt = (
            box.layout,
            box.config,
            box.host,
            box.boot_id,
            box.rt,
        )
        self.box, self.intake, self.finished, self.extras = box, box.intake, finished, extras
        self.last_word_from = {p.name for p in hooks.registry().publishers if p.last_word}
        # What this box offers a job beyond GPUs: cores it may pin, memory (submit refuses an
        # ask no box could meet, as it does for GPUs).
        self.cores, self.mem_mib = len(os.sched_getaffinity(0)), psutil.virtual_memory().total // 2**20
        self.heartbeat_failing = False  # logged once per spell of failed writes
        self.seq = 0
        self.heartbeat_at = 0.0
        self.cache_written = (-1, 0.0)  # (intake version, when)

    def due(self, now_mono: float) -> bool:
        """At most once per poll interval."""
        return now_mono - self.heartbeat_at >= self.config.poll_interval * 0.9

    def publish(self, state: BoxState, now_mono: float, now_wall: float) -> None:
        """Heartbeat (boot id + sequence number: observers judge liveness on their own clock),
        then the lease, the spec cache when it is due, and the extras' publishers (each keeps
        its own pace)."""
        self.heartbeat_at = now_mono
        self.seq += 1
        try:
            self.write_heartbeat(state, now_wall)
        except OSError as e:
            # A full or failing disk refuses the new file; the old one's mtime can still be
            # renewed (no block is needed), and observers count a change of it as a beat. So
            # the lease stays fresh and healthy jobs run on; only when even that fails (the
            # disk is gone) does the lease age and the supervisors fence their jobs.
            os.utime(self.layout.heartbeat(self.host))
            if not self.heartbeat_failing:
                log.warning(
                    "cannot write this host's heartbeat (%s); "
                    "renewing it by its mtime until the disk takes writes again",
                    e.strerror or e,
                )
            self.heartbeat_failing = True
        else:
            self.heartbeat_failing = False
        # Written only once the heartbeat is: the supervisors' proof that others still see
        # this host alive (a stale lease makes them stop their jobs; see run/supervise.py).
        write_lease(self.rt, now_mono)
        version, written_at = self.cache_written
        if version != self.intake.version and now_mono - written_at >= SPEC_CACHE_EVERY_S:
            try:
                write_json(self.layout.spec_cache(self.host), self.intake.cache_json(), durable=False)
                self.cache_written = (self.intake.version, now_mono)
            except OSError as e:  # readers read what changed since the cache they find; the extras still publish
                self.box.report_once("spec-cache", f"cannot write {self.layout.spec_cache(self.host)}: {e}")
        self._extras(Published(self.host, state, now_mono, now_wall, self.intake, self.finished))

    def last_word(self, state: BoxState, now_mono: float, now_wall: float) -> None:
        """As the worker stops: a heartbeat that says so (other boxes stop placing work here at
        once, not when the beat goes stale), and a last publication to the extras' publishers
        that ask for one (hooks.BoxPublisher.last_word)."""
        try:
            self.write_heartbeat(state, now_wall, stopped=True)
        except OSError:
            pass  # the beat goes stale instead
        last = Published(self.host, state, now_mono, now_wall, self.intake, self.finished, last=True)
        self._extras(last, only=self.last_word_from)

    def _extras(self, published: Published, only: set[str] | None = None) -> None:
        for name, publish in self.extras:
            if only is not None and name not in only:
                continue
            try:
                publish(published)
            except Exception:  # an extra's failure is its own: the heartbeat was written, and the next one comes
                log.exception("the extras' publisher %s failed", name)

    def write_heartbeat(self, state: BoxState, now_wall: float, stopped: bool = False) -> None:
        """`stopped`: the worker's last word, so that other boxes stop placing work here at
        once, not when the beat goes stale."""
        write_json(
            self.layout.heartbeat(self.host),
            {
                "stopped": stopped,
                "host": self.host,
                "boot_id": self.boot_id,
                "seq": self.seq,
                "pid": os.getpid(),
                "starter_pid": os.getppid(),  # the box's starter (host/privsep.py), which cron started
                "version": __version__,
                "t": now_wall,
                "poll_interval": self.config.poll_interval,
                "gpus": [g.to_json() for g in state.gpus],
                "cpu_slots": self.config.cpu_slots,
                "cores": self.cores,
                "mem_mib": self.mem_mib,
                "observed": {j: {str(i): m for i, m in per.items()} for j, per in state.observed.items()},
                "others_idle_since": {str(i): t for i, t in state.others_idle_since.items()},
                "stopping": sorted(state.stopping),  # the ids alone: what older workers read
                "stops": {j: order.to_json() for j, order in state.stopping.items()},
                "warnings": dict(state.warnings),
                "probe_error": state.probe_error,
                "runtimes": state.runtimes,
                "runtime_problems": state.runtime_problems,
                "mps": state.mps,
            },
            durable=False,
        )
