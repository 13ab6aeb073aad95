"""A box's stop orders: which of its running jobs it told to stop, when and why.

Every stop a worker gives goes through `StopOrders.order`: a cancel (a control file another
worker left after judging the request, `obey_controls`), a preemption the plan decided
(`preempt`), a job over its GPU memory (`act_on_overuse`). The order is kept until the job
has ended: the plan here counts the job gone a grace after it was told (model/jobs.py
RunningJob), and the heartbeat tells the other boxes the same (worker/publishing.py). A
restarted worker reads its jobs' orders back from their stop files (`read_back`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Iterable

from gpuq.host.files import read_json
from gpuq.model.record import Record
from gpuq.model.stops import Stop, StopCause, StopOrder
from gpuq.model.text import safe_text
from gpuq.run.joblocal import stop_order
from gpuq.sched.overuse import Overuse
from gpuq.spool.store import append_note
from gpuq.worker.box import Box

log = logging.getLogger("gpuq.worker")

# Stops a job (through its supervisor; the slurm extra's bridge: scancel). False: not yet
# (its supervisor is still starting), to be given again at the next pass.
StopJob = Callable[[Record, Stop], bool]


TAKEN = ".taken"  # the suffix of a control order a worker took to obey (state/control/HOST/.ID.json.taken)


def _put_back(taken: Path, path: Path) -> None:
    """An order taken and not obeyed back under its name, unless a newer one is there (it stands)."""
    try:
        os.link(taken, path)
    except FileExistsError:
        pass
    except OSError:
        return  # kept as taken: the next pass puts it back
    taken.unlink(missing_ok=True)


class StopOrders:
    def __init__(self, box: Box, stop_job: StopJob) -> None:
        self.box, self.stop_job = box, stop_job
        self.given: dict[str, StopOrder] = {}  # job id -> when it was first told, and why

    def get(self, job_id: str) -> StopOrder | None:
        return self.given.get(job_id)

    def read_back(self, running: Iterable[Record]) -> None:
        """A worker before this one told these jobs to stop, and they are still in their grace:
        their stop files say so. A file older than the attempt's claim (both this box's clock)
        is an earlier attempt's, left where its supervisor died before removing it."""
        for record in running:
            order = stop_order(self.box.rt, record.id)
            if order is not None and (order.since or 0.0) >= (record.claimed_at or 0.0):
                self.given[record.id] = order

    def keep_only(self, alive: Iterable[str]) -> None:
        """Forget the orders of jobs that have ended."""
        self.given = {j: self.given[j] for j in alive if j in self.given}

    def order(self, record: Record, stop: Stop) -> bool:
        """Stop a job and keep the order. A job told again keeps when it was first told (its
        supervisor keeps the first order's deadline), with the latest cause. False: not yet."""
        if not self.stop_job(record, stop):
            return False
        earlier = self.given.get(record.id)
        self.given[record.id] = StopOrder(earlier.since if earlier else self.box.clock.wall(), stop.cause)
        return True

    def obey_controls(self, running: list[Record]) -> None:
        """Cancels of jobs on this host, written by the worker that applied a cancel request
        (spool/applying.py judged who asked). Only the worker's account writes state/, so an
        order in a file anyone else owns is ignored."""
        control_dir = self.box.layout.host_control(self.box.host)
        if not control_dir.is_dir():
            return
        by_id = {r.id: r for r in running}
        me = os.geteuid()
        for left in control_dir.glob(f".*.json{TAKEN}"):  # taken by a worker that died before it obeyed
            _put_back(left, control_dir / left.name[1 : -len(TAKEN)])
        for path in control_dir.glob("*.json"):
            job_id = path.stem
            try:
                if os.lstat(path).st_uid not in (0, me):
                    self.box.report_once(f"control/{path.name}", f"ignored {path}: not written by a worker")
                    continue
            except OSError:
                continue
            # Taken by a rename before it is read: an order written meanwhile (`cancel --now` after a
            # plain cancel) lands under the name again, for the next pass. Read and then removed by
            # name, it was removed unread, and the job took its day's grace.
            taken = path.with_name(f".{path.name}{TAKEN}")
            try:
                os.rename(path, taken)
                control = read_json(taken)
            except FileNotFoundError:
                continue
            except (OSError, ValueError):
                control = None
            if not isinstance(control, dict):
                taken.unlink(missing_ok=True)
                continue
            record = by_id.get(job_id)
            earlier = self.given.get(job_id)
            now = control.get("now") is True  # `gpuq cancel --now`: even a job cancelled already
            # Cancelled already: the first cancel's words stand (a second one named only its own sender).
            cancelled = earlier is not None and earlier.cause is StopCause.CANCEL and not now
            if not cancelled and record is not None and record.attempt == control.get("attempt", record.attempt):
                stop = Stop.cancel(safe_text(str(control.get("by", "?")))[:64], at_once=now)
                if not self.order(record, stop):
                    _put_back(taken, path)  # its supervisor is still starting: try again next pass
                    continue
                log.info("cancelling %s (%s)", job_id, stop.reason)
            taken.unlink(missing_ok=True)

    def preempt(self, running: list[Record], preempts: dict[str, str]) -> None:
        """Tell opportunistic jobs to yield (TERM, their grace, KILL); their supervisors leave
        the spec to be put back at its old place (recovery.settle_gone)."""
        by_id = {r.id: r for r in running}
        for job_id, why in preempts.items():
            record = by_id.get(job_id)
            if record is None or job_id in self.given:
                continue
            if self.order(record, Stop.preempt(why)):
                log.info("preempting %s: %s", job_id, why)
                append_note(self.box.layout, self.box.host, job_id, "preempting", why)

    def act_on_overuse(self, record: Record, overuse: Overuse) -> None:
        """A job over its declared GPU memory: stopped where the config says so, else warned."""
        layout, host = self.box.layout, self.box.host
        if overuse.kill and self.order(record, Stop.limit(overuse.why)):
            log.warning("stopping %s: %s", record.id, overuse.why)
            append_note(layout, host, record.id, "stopping", overuse.why)
        elif not overuse.kill:
            log.warning("%s %s", record.id, overuse.why)
            append_note(layout, host, record.id, "warning", overuse.why)
