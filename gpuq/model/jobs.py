"""What plan is fed and what it decides: pending and running jobs, the boxes as it sees them, and
the starts, preemptions and holds it returns. The worker, `gpuq status` and the simulator build
these from their own sources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from gpuq.model.gpu import GpuSnapshot
from gpuq.model.names import natural_order
from gpuq.model.spec import CLASS_RANK, JobSpec, stop_grace_s
from gpuq.model.stops import StopOrder


@dataclass(frozen=True)
class PendingJob:
    id: str
    user: str
    spec: JobSpec
    queued_at: float
    # Computed once, for every pass walks thousands: the static part of its place in the
    # queue, and whether it waits on other jobs or stands for several (spool/deps.py, gates).
    order: tuple = field(init=False, repr=False, compare=False)
    gated: bool = field(init=False, repr=False, compare=False)
    id_order: tuple = field(init=False, repr=False, compare=False)  # the last tie-break: _2 before _10

    def __post_init__(self) -> None:
        spec = self.spec
        object.__setattr__(self, "order", (CLASS_RANK[spec.priority_class], -spec.priority))
        gated = spec.after or spec.after_any or spec.sweep or spec.array or spec.array_limit or spec.begin_at
        object.__setattr__(self, "gated", bool(gated))
        object.__setattr__(self, "id_order", natural_order(self.id))

    @property
    def opportunistic(self) -> bool:
        return self.spec.preemptible


@dataclass(frozen=True)
class RunningJob:
    id: str
    user: str
    host: str
    gpus: tuple[int, ...]
    gpu_mem_mib: int | None  # declared per GPU; None = whole GPU, exclusively
    observed_mib: dict[int, int] = field(default_factory=dict)  # GPU index -> NVML-observed
    preemptible: bool = False
    priority_class: str = "normal"
    started_at: float = 0.0
    stopping: bool = False  # told to stop (preempted, cancelled, over its memory): on its way out
    told_at: float | None = None  # when it was told (its box's wall clock); None: not known
    mps: bool = False  # an MPS client (model/sharing.py): its GPU serves only its user's
    compute_pct: int | None = None  # its spec's gpu_compute; None: it may keep the whole GPU busy
    limit_s: float | None = None  # how long it may run (its time limit, or an estimate); None: unknown
    limit_learned: bool = False  # limit_s is its kind's longest recent run (sched/estimate.py), not a limit
    cpus: int = 0  # cores pinned for it (its -c, or config cpus): held on its box
    mem_mib: int = 0  # host memory it may use (its --mem, or config mem): held on its box
    grace_s: float | None = None  # its spec's grace (None: config's): how long a stop of it may take

    @property
    def ends_by(self) -> float:
        """When its time limit runs out (inf: no limit known); past it, it is being stopped (gone_by)."""
        return self.started_at + self.limit_s if self.limit_s is not None else float("inf")

    def stop_grace(self, config_grace_s: float) -> float:
        """How long a stop of it may take (SIGTERM, then SIGKILL): model/spec.py stop_grace_s."""
        return stop_grace_s(self.grace_s, self.preemptible, config_grace_s)

    def stop_began(self, now: float) -> float:
        """When its stop began: when it was told to stop (now, if that is not known), else
        when its time limit runs out (inf: no limit)."""
        if self.stopping:
            return self.told_at if self.told_at is not None else now
        return self.ends_by

    def stuck(self, now: float, config_grace_s: float) -> bool:
        """Still there a whole grace after its stop was due: stuck, or its box is late (or a
        replay never stops a job); nothing tells when it leaves."""
        return now > self.stop_began(now) + 2 * self.stop_grace(config_grace_s)

    def gone_by(self, now: float, config_grace_s: float, poll_interval: float) -> float:
        """When it will have left its GPUs at the latest: a grace after its stop begins (told
        to stop: preempted, cancelled, over its memory; else when its time limit runs out):
        SIGTERM, then SIGKILL after its grace. A limit's stop is counted by its supervisor
        from its own start (a moment after the claim counted here), and the end is recorded
        after the kill: once that is past, no sooner than a worker's next pass."""
        left = self.stop_began(now) + self.stop_grace(config_grace_s)
        if not self.stopping and self.ends_by > now:
            return left
        return max(left, now + poll_interval)

    @classmethod
    def of(cls, record: Any, observed: dict[int, int], stop: StopOrder | None, host: str = "") -> "RunningJob":
        """From a running Record (spool/store.py), as the worker and `gpuq status` both see it;
        `stop`: its box's order to stop it, if it gave one."""
        spec = record.spec
        return cls(
            record.id,
            record.user,
            record.host or host,
            tuple(record.gpus),
            spec.get("gpu_mem_mib"),
            observed,
            preemptible=bool(spec.get("preemptible")),
            priority_class=spec.get("priority_class", "normal"),
            started_at=record.claimed_at or 0.0,
            stopping=stop is not None,
            told_at=stop.since if stop is not None else None,
            mps=bool(getattr(record, "mps_pipe", None)),
            compute_pct=spec.get("gpu_compute_pct"),
            limit_s=record.time_limit_s,
            cpus=len(record.cpu_cores),
            mem_mib=record.mem_limit_mib or 0,
            grace_s=spec.get("grace_s"),
        )


@dataclass(frozen=True)
class HostView:
    """One live host as the planner sees it: the GPUs it offers, its CPU-only slots, and
    since when each GPU has been free of non-gpuq use (None: in use now; absent: always)."""

    name: str
    gpus: tuple[GpuSnapshot, ...]
    cpu_slots: int
    others_idle_since: Mapping[int, float | None] = field(default_factory=dict)
    runtimes: frozenset[str] | None = None  # container runtimes it has (None: not probed, any)
    cores: int | None = None  # cores jobs may be pinned to (None: not said, nothing held)
    mem_mib: int | None = None  # host memory jobs' --mem may hold (None: not said, nothing held)


@dataclass(frozen=True)
class SetAside:
    """GPUs set aside for one person over a window: a placement rule's value (hooks.py
    `placement_rules`; the bookings extra's bookings), read at the edge and handed to `plan`.
    While it is on, only its owner's jobs and opportunistic ones go there (and opportunistic
    jobs that were there before it began yield); before it begins, nobody else's job that may
    still run at its start goes there. The plan's reasons call it "booked for OWNER"."""

    host: str
    gpus: tuple[int, ...]
    start: float
    end: float
    owner: str

    def active(self, now: float) -> bool:
        return self.start <= now < self.end


@dataclass(frozen=True)
class Start:
    job_id: str
    host: str
    gpus: tuple[int, ...]


@dataclass
class Plan:
    starts: list[Start]
    reasons: dict[str, str]  # job id -> why it waits (only when explain=True)
    order: list[str]  # pending job ids in queue order (only when explain=True)
    preempts: dict[str, str] = field(default_factory=dict)  # running job id -> why it yields
    held: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)  # job -> GPUs held
    # The head of the queue's reservation: job -> (host, GPUs, when running jobs' limits free them).
    reserved: dict[str, tuple[str, tuple[int, ...], float]] = field(default_factory=dict)
    # When this plan's decisions change with time alone: an opportunistic job on the head's
    # reserved GPUs is told to yield a grace before the head is due (sched/plan.py). A worker
    # that skips planning while nothing changed plans again from then.
    recheck_at: float = float("inf")
