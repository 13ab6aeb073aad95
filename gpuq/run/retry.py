"""Whether a failed attempt goes back to the queue with its spec changed: what a job's
supervisor asks the extras' retry rules (gpuq/hooks.py RetryRule: the oom extra's retry after
CUDA ran out of memory), and the types a rule is handed and gives. The worker carries the
answer out (worker/recovery.py), as it does a preemption: same place, next attempt."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from gpuq.hooks import load, registry
from gpuq.host.usage import read_gpu_usage
from gpuq.model.record import Record
from gpuq.run.joblocal import Runtime

log = logging.getLogger("gpuq.supervisor")


@dataclass(frozen=True)
class Failure:
    """An attempt that ended on its own with a failure (no stop order)."""

    record: Record  # its running record: spec, attempt, failure_retries so far
    exit_code: int | None
    signal: int | None
    log_tail: str  # the last bytes of its log (decoded, errors replaced)
    peak_gpu_mem_mib: int | None  # the most GPU memory its processes held, as sampled
    gpu_total_mib: int | None  # the memory of the GPU it ran on, where its worker published it


@dataclass(frozen=True)
class Retry:
    """Back to its place: `why` (its log, the requeue's reason, `show`), and the spec fields
    to set, as they are written in a spec (None removes one: `gpu_mem` for a whole GPU)."""

    why: str
    changes: dict[str, Any]


def failure_of(rt: Runtime, record: Record, exit_code: int | None, signal: int | None, log_tail: str) -> Failure:
    """The failure as a rule is handed it: with what the worker sampled of the job's GPU
    memory, and the memory of its GPU as the worker last published it (its heartbeat)."""
    return Failure(
        record=record,
        exit_code=exit_code,
        signal=signal,
        log_tail=log_tail,
        peak_gpu_mem_mib=read_gpu_usage(rt.usage_path(record.id)).get("peak_gpu_mem_mib"),
        gpu_total_mib=_gpu_total(rt, record),
    )


def _gpu_total(rt: Runtime, record: Record) -> int | None:
    try:
        gpus = json.loads(rt.layout.heartbeat(rt.host).read_bytes())["gpus"]
        found = [g["mem_total_mib"] for g in gpus if record.gpus and g["index"] == record.gpus[0]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found[0] if found and type(found[0]) is int else None


def retry_after(failure: Failure, settings: dict[str, Any]) -> Retry | None:
    """The first rule's retry for `failure`, or None. `settings`: the config keys only extras
    read, by Config attribute (run/joblocal.py Runtime.settings). A rule that raises is logged and passed
    over: an extra's bug must never lose a job's result."""
    for rule in registry().retry_rules:
        try:
            found = load(rule.decide)(failure, settings)
        except Exception:
            log.exception("retry rule %s failed on %s; the job ends as failed", rule.name, failure.record.id)
            continue
        if isinstance(found, Retry):
            return found
    return None
