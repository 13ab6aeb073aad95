"""What the extras add to a worker: probes of what its box offers beyond the GPUs (the
containers extra's runtimes, published in the heartbeat and matched by the plan) and GPU
sharing (the mps extra's daemons). Each is started through gpuq/hooks.py; one that fails is
logged and left out, and the worker goes on without it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Protocol

from gpuq import hooks
from gpuq.host import rootorders
from gpuq.model.config import Config
from gpuq.worker.starting import GpuSharer

log = logging.getLogger("gpuq.worker")


class OfferFinder(Protocol):
    """What a pass needs of a probe of what the box offers beyond its GPUs (gpuq/hooks.py
    HostOffers: the containers extra's runtimes), published in the heartbeat."""

    found: dict[str, str]  # name -> version
    problems: dict[str, str]  # name -> why it is unusable

    def refresh(self, now: float) -> None: ...


def start_offers(config: Config, team: bool) -> list[OfferFinder]:
    """The extras' probes of what this box offers, started for this worker. One that fails to
    start is logged and left out: the box then offers nothing of it, and its jobs wait."""
    started = hooks.start_each("probe", hooks.registry().offers, config, team, without="this worker goes on without it")
    return [probe for _, probe in started]


def start_sharing(
    local_dir: Path, root_part: rootorders.Orders | None, config: Config, report_once: Callable[[str, str], None]
) -> list[GpuSharer]:
    """The extras' GPU sharing (the mps extra's MPS daemons), started for this worker. One that
    fails to start is logged and left out: its jobs are then time-sliced."""
    gpu_sharing = hooks.registry().gpu_sharing
    started = hooks.start_each(
        "GPU sharing", gpu_sharing, local_dir, root_part, config, report_once, without="jobs are time-sliced"
    )
    return [sharer for _, sharer in started]


class Offers:
    """What the extras' probes offer, together (none: nothing beyond the GPUs)."""

    def __init__(self, probes: list[OfferFinder]) -> None:
        self.probes = probes
        self.found: dict[str, str] = {}
        self.problems: dict[str, str] = {}

    def refresh(self, now: float) -> None:
        found: dict[str, str] = {}
        problems: dict[str, str] = {}
        for probe in self.probes:
            try:
                probe.refresh(now)
            except Exception:  # an extra's failure is its own: what it found last still stands
                log.exception("the extras' probe %s failed", type(probe).__name__)
            found.update(probe.found)
            problems.update(probe.problems)
        self.found, self.problems = found, problems
