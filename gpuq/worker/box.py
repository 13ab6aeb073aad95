"""One box's worker as each part of its pass sees it: the queue's layout and settings, which
box this is, its clock, what every supervisor here is handed (`rt`) and the specs read from
jobs/. The worker makes it once and hands this one object to each part (arrivals, claims,
starts, recovery, publishing), which take from it what they need instead of being handed
pieces of one another."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gpuq.host.clock import Clock
from gpuq.model.config import Config
from gpuq.model.text import safe_text
from gpuq.run.joblocal import Runtime
from gpuq.spool.intake import Intake
from gpuq.spool.layout import Layout

log = logging.getLogger("gpuq.worker")


@dataclass
class Box:
    config: Config
    rt: Runtime  # the queue's layout, this box's name, boot id and local directory
    intake: Intake
    clock: Clock = field(default_factory=Clock)
    reported: set[str] = field(default_factory=set)  # what was logged once (never each pass)

    @property
    def layout(self) -> Layout:
        return self.rt.layout

    @property
    def host(self) -> str:
        return self.rt.host

    @property
    def boot_id(self) -> str:
        return self.rt.boot_id

    def report_once(self, key: str, message: str) -> None:
        """Log a warning the first time `key` is reported: a bad file is named once, not each pass."""
        if key not in self.reported:
            self.reported.add(key)
            log.warning("%s", safe_text(message))
