"""When a failed job ran out of GPU memory, and what it asks for next: the oom extra's retry
rule (gpuq/hooks.py RetryRule), and its spec field `retry_on_oom`.

Out of memory is read from the last lines of the job's log (4 KiB), where the frameworks print
it on their way out: the patterns below, one per framework's own words. Any other failure, a
host's out-of-memory killer (SIGKILL, no such line) included, is never retried. The next
attempt asks for its observed peak (its old `gpu_mem` where none was sampled) plus what the
failed allocation asked for (where the message says), at least its old `gpu_mem` plus 1 GiB,
and 25% more; where that comes near the whole
GPU (90% of the GPU it ran on), it asks for the whole GPU instead (`gpu_mem` removed).
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Any

from gpuq.model.environments import ErrorFactory
from gpuq.model.units import format_mib
from gpuq.run.retry import Failure, Retry

MAX_RETRIES = 10
MARGIN = 1.25  # the next attempt's ask over what it was seen to need
WHOLE_GPU_SHARE = 0.9  # an ask this near the GPU's memory asks for the whole GPU
MIB = {"B": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 2**20}  # by the unit's first letter
MOST_TRIED_MIB = 2**30  # a message's size past any GPU's (a garbled one): read as this

# (framework, what it prints when CUDA's memory runs out): docs/... gpuq/extras/oom/README.md.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("PyTorch", re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")),
    ("TensorFlow", re.compile(r"ResourceExhaustedError|OOM when allocating tensor")),
    ("JAX", re.compile(r"RESOURCE_EXHAUSTED: Out of memory|XlaRuntimeError: RESOURCE_EXHAUSTED")),
    ("CUDA", re.compile(r"CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED")),
)
# What the failed allocation asked for: PyTorch's "Tried to allocate 2.00 GiB", XLA's "while
# trying to allocate 17179869184 bytes" (or "1.50GiB").
TRIED = re.compile(r"[Tt]r(?:ied|ying) to allocate ([0-9]+(?:\.[0-9]+)?) ?([KMGT]i?B|bytes|B)\b", re.IGNORECASE)


def out_of_memory(output: str) -> tuple[str, int | None] | None:
    """(the framework that said so, what its failed allocation asked for in MiB or None), or
    None when the attempt's last output says nothing of CUDA running out of memory."""
    for framework, pattern in PATTERNS:
        if pattern.search(output):
            tried = [_mib(n, unit) for n, unit in TRIED.findall(output)]
            return framework, (math.ceil(min(tried[-1], MOST_TRIED_MIB)) if tried else None)
    return None


def _mib(number: str, unit: str) -> float:
    unit = unit.upper()
    return float(number) * MIB["B" if unit in ("B", "BYTES") else unit[0]]


def attempt_output(log_tail: str, job_id: str, attempt: int) -> str:
    """What this attempt wrote, of the log's tail: the log is the job's across attempts, so
    only after this attempt's own header, and never gpuq's `==>` lines (the command line is one:
    a command that only names the error is no out of memory)."""
    header = f"==> gpuq job {job_id} · attempt {attempt} · "
    start = log_tail.rfind(header)
    lines = log_tail[start:].splitlines() if start >= 0 else log_tail.splitlines()
    return "\n".join(line for line in lines if not line.startswith("==> "))


def decide(failure: Failure, settings: dict[str, Any]) -> Retry | None:
    """The rule: another attempt with more memory, while `retry_on_oom` lasts."""
    spec = failure.record.spec
    allowed = spec.get("retry_on_oom")
    if allowed is None:  # the team's default; but a job that must never run twice never does
        allowed = 0 if spec.get("retries") == 0 else settings.get("retry_on_oom", 1)
    done = failure.record.failure_retries
    found = out_of_memory(attempt_output(failure.log_tail, failure.record.id, failure.record.attempt))
    declared = spec.get("gpu_mem_mib")
    if found is None or done >= allowed or not spec.get("gpus") or declared is None:
        return None  # not out of memory, no retries left, or it had its GPUs whole already
    framework, tried = found
    held = failure.peak_gpu_mem_mib or declared  # not sampled (it failed at once): what it asked for
    seen = max(held + (tried or 0), declared + 1024)
    ask = math.ceil(seen * MARGIN / 1024) * 1024  # whole GiB
    total = failure.gpu_total_mib
    whole = total is not None and ask >= total * WHOLE_GPU_SHARE
    changes: dict[str, Any] = {"gpu_mem": None, "gpu_compute": None} if whole else {"gpu_mem": f"{ask // 1024}GiB"}
    raised = "the whole GPU" if whole else format_mib(ask)
    why = (
        f"out of GPU memory ({framework}); gpu_mem {format_mib(declared)} -> {raised} "
        f"(retry_on_oom: {done + 1} of {allowed})"
    )
    return Retry(why, changes)


def parse_field(value: Any, fail: ErrorFactory) -> int | None:
    """The spec's `retry_on_oom`, as the core keeps it (JobSpec.extras)."""
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_RETRIES:
        raise fail(
            "retry_on_oom",
            f"{value!r} is not a whole number from 0 to {MAX_RETRIES}",
            "write e.g. `retry_on_oom: 2`, or `retry_on_oom: 0` for a job that must never run twice",
        )
    return value


def from_options(args: argparse.Namespace) -> int | None:
    """--retry-on-oom N -> the spec's `retry_on_oom`."""
    if args.retry_on_oom is None:
        return None
    try:
        return int(args.retry_on_oom)
    except ValueError:
        raise ValueError(f"--retry-on-oom {args.retry_on_oom!r}: give a whole number from 0 to {MAX_RETRIES}") from None
