"""A job as gpuq knows it (a record file's contents), and the unique name of a claiming attempt."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gpuq.model.names import HOST_RE, JOB_ID_RE
from gpuq.model.states import State
from gpuq.model.stops import StopCause, cause_of


@dataclass(frozen=True)
class Record:
    """A job as gpuq knows it: the spec plus what gpuq learned. Never holds runtime handles."""

    id: str
    state: State
    spec: dict[str, Any]  # JobSpec.to_json()
    spec_text: str = ""  # the file as the user wrote it
    user: str = ""
    uid: int = -1
    attempt: int = 1
    queued_at: float = 0.0  # the queue position (kept across requeues)
    host: str | None = None
    boot_id: str | None = None
    gpus: list[int] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)
    gpu_mem_mib: int | None = None  # memory charged per GPU: declared, or the whole GPU
    claim: str | None = None  # unique name of the claiming attempt
    claimed_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    cause: StopCause | None = None  # why it was stopped (model/stops.py), beside the reason's text
    job_pid: int | None = None
    peak_gpu_mem_mib: int | None = None  # host/usage.py: what the attempt used
    mean_gpu_mem_mib: int | None = None
    mean_gpu_util_pct: float | None = None
    peak_rss_mib: int | None = None
    peak_cpus: float | None = None
    cpu_s: float | None = None
    preempted: bool = False  # the attempt before this one was preempted (or, unstarted, followed one)
    unstarted: bool = False  # requeued before its command ran: the next attempt inherits `preempted`
    failure_retries: int = 0  # run/retry.py: the job's re-runs after a failure so far (out of GPU memory)
    time_limit_s: float | None = None  # the limits that apply (spec, else config): run/limits.py
    mem_limit_mib: int | None = None
    cpu_cores: list[int] = field(default_factory=list)
    held_at: float | None = None  # spool/holds.py: when `gpuq hold` took it out of the queue
    restarts: int = 0  # sched/restarts.py: a service's restarts in this attempt
    slurm_id: str | None = None  # the slurm extra's bridge: the Slurm job this attempt was handed to
    mps_pipe: str | None = None  # the mps extra: the MPS control daemon's pipe directory it is a client of
    mps_compute_pct: int | None = None  # ... and its share of the GPU's SMs there

    def __post_init__(self) -> None:
        # Every way a record is built (from_json, the constructor, dataclasses.replace) is
        # checked: ids, hosts and claims are names paths are made of.
        self.check()

    def to_json(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}  # shallow: JSON copies
        d["state"] = self.state.value
        d["cause"] = self.cause.value if self.cause is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Record":
        """Raises RecordError for anything but a record gpuq wrote: ids, hosts and claims are
        names that paths are made of, so they are checked wherever a record is read."""
        if not isinstance(d, dict):
            raise RecordError("not a JSON object")
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        try:
            known["state"] = State(d["state"])
            known["cause"] = cause_of(d)
            return cls(**known)
        except RecordError:
            raise
        except (KeyError, ValueError, TypeError) as e:
            raise RecordError(f"not a record ({e})") from None

    def check(self) -> None:
        if not isinstance(self.id, str) or not JOB_ID_RE.match(self.id):
            raise RecordError(f"id {self.id!r} is not a job id")
        if self.host is not None and (not isinstance(self.host, str) or not HOST_RE.match(self.host)):
            raise RecordError(f"host {self.host!r} is not a host name")
        if self.claim is not None and (
            not isinstance(self.claim, str) or (parsed := parse_claim_name(self.claim)) is None or parsed[0] != self.id
        ):
            raise RecordError(f"claim {self.claim!r} is not a claim of {self.id}")
        if type(self.uid) is not int or type(self.attempt) is not int or self.attempt < 1:
            raise RecordError("uid and attempt must be integers")
        if (
            not isinstance(self.spec, dict)
            or not isinstance(self.gpus, list)
            or not all(type(g) is int and g >= 0 for g in self.gpus)
        ):
            raise RecordError("spec must be an object and gpus a list of indices")


class RecordError(ValueError):
    """A file in a record directory that is not a record gpuq wrote."""


def claim_name(job_id: str, host: str, boot_id: str, attempt: int) -> str:
    """A name no other claim can have: job, host, boot, pid, nonce, attempt."""
    return f"{job_id}@{host}@{boot_id[:8]}@{os.getpid()}@{os.urandom(4).hex()}@a{attempt}.yaml"


def parse_claim_name(name: str) -> tuple[str, str] | None:
    """claim file name -> (job id, host), or None if it is not a claim."""
    parts = name.split("@")
    if len(parts) != 6 or not name.endswith(".yaml") or "/" in name or "\0" in name:
        return None
    return (parts[0], parts[1]) if JOB_ID_RE.match(parts[0]) and HOST_RE.match(parts[1]) else None
