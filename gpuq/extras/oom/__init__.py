"""Retry after out-of-memory, an extra: a job that ends with CUDA's out-of-memory error
(rule.py reads its exit and the last lines of its log, for PyTorch, TensorFlow, JAX and CUDA
itself) goes back to its place in the queue as a new attempt, with `gpu_mem` raised to what it
was seen to hold plus what it tried to allocate, and a margin (or the whole GPU), at most
`retry_on_oom` times (the spec's field, else the config's; default 1). Never for a job that
failed for another reason. README.md here is its page.

Every gpuq process imports this module, root's `gpuq` too: it imports nothing but the
registry's types, and names the rest by "module:function", loaded only by the supervisor of a
job that failed.
"""

from __future__ import annotations

import argparse

from gpuq.hooks import Registry, RetryRule, SpecField


def _submit_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--retry-on-oom",
        metavar="N",
        help="re-runs with more gpu_mem after CUDA runs out of memory (default: config retry_on_oom, 1)",
    )


RETRY_ON_OOM = SpecField(
    "retry_on_oom",
    "integer 0-10",
    "config retry_on_oom (1)",
    "Re-runs after the job fails with CUDA's out-of-memory error (PyTorch, TensorFlow, JAX), each "
    "at its old place in the queue with gpu_mem raised to its observed peak plus what it tried to "
    "allocate, and 25% more (or the whole GPU); 0: never. A job that fails otherwise is never re-run.",
    "2",
    "extras.oom.rule:parse_field",
    options=_submit_options,
    from_options="extras.oom.rule:from_options",
)


def register(registry: Registry) -> None:
    registry.spec_fields["retry_on_oom"] = RETRY_ON_OOM
    registry.retry_rules.append(RetryRule("oom", "extras.oom.rule:decide"))
