"""Starting a job the plan placed on this box: claim its spec (worker/claiming.py), make its
running record (its GPUs, the memory charged to them, its MPS daemon and share, its limits),
create that record, and hand it to the spawner, whose supervisor runs the job.

The record is created, never written over one: a box that froze between its claim and this
write, and was forgotten meanwhile (its claim put back and started elsewhere), must not
overwrite the other box's record when it wakes.
"""

from __future__ import annotations

import logging
from typing import Protocol

from gpuq.host.faults import crash_point
from gpuq.model.gpu import GpuSnapshot
from gpuq.model.record import Record
from gpuq.model.spec import JobSpec
from gpuq.model.states import State
from gpuq.run.limits import limits_for
from gpuq.spool.store import keep_place, resumes_preempted, spec_state, transition
from gpuq.worker.box import Box
from gpuq.worker.claiming import Claimer
from gpuq.worker.returns import put_back

log = logging.getLogger("gpuq.worker")


class Launcher(Protocol):
    """What a worker needs of the spawner (run/spawner.py): a test's stand-in records launches."""

    starting: set[str]  # launched, its supervisor not yet seen holding the job's lock
    failed: set[str]  # launched, and no supervisor took it

    def launch(self, record: Record) -> None: ...
    def collect(self) -> None: ...
    def close(self) -> None: ...


class GpuSharer(Protocol):
    """How jobs on one GPU share it beyond time-slicing, as an extra runs it (gpuq/hooks.py
    GpuSharing: the mps extra's MPS daemons). None of its calls raises for what the box lacks:
    a job it cannot serve is time-sliced, the problem reported once by the sharer itself."""

    def client(self, spec: JobSpec, gpu: GpuSnapshot) -> tuple[str, int] | None:
        """(pipe directory, compute share) of a job about to start on `gpu` that runs under it;
        None for any other job, and where it cannot serve the job now."""
        ...

    def settle(self, in_use: set[int], now: float, final: bool) -> None:
        """Let go of what the GPUs not `in_use` (by a running job's `mps_pipe`) held, as it
        decides (a daemon lingers a while); `final`: the worker stops, let go of it all now."""
        ...

    def state(self) -> dict | None:
        """What the heartbeat says of it (`mps`; doctor reads it), or None where it is off."""
        ...


class Starter:
    def __init__(self, box: Box, spawner: Launcher, sharers: list[GpuSharer]) -> None:
        self.box, self.spawner, self.sharers = box, spawner, sharers
        self.layout, self.config, self.host, self.boot_id, self.clock = (
            box.layout,
            box.config,
            box.host,
            box.boot_id,
            box.clock,
        )
        self.claimer = Claimer(box)

    def start(
        self, job_id: str, gpus: tuple[int, ...], snapshots: list[GpuSnapshot], running: list[Record]
    ) -> Record | None:
        """The job's running record once it is handed to the spawner; None where there was
        nothing to start (claimed elsewhere, cancelled, refused, or started by another box)."""
        taken = self.claimer.claim(job_id)
        if taken is None:
            return None
        entry, claimed, uid, attempt, previous = taken
        job = entry.job
        assert job is not None  # a claim is taken only of a parsed spec
        by_index = {g.index: g for g in snapshots}
        charged = (
            job.spec.gpu_mem_mib
            if not job.spec.exclusive
            else by_index[gpus[0]].mem_total_mib - self.config.gpu_mem_reserve_mib
        )
        mps_pipe, mps_compute = self._mps_for(job.spec, by_index[gpus[0]] if gpus else None)
        claimed_job = Record(  # as its claim showed it: taken from jobs/, so pending
            id=job_id,
            state=spec_state(self.layout, claimed),
            spec=job.spec.to_json(),
            spec_text=entry.text.decode("utf-8-sig", "replace"),
            user=job.user,
            uid=uid,
            attempt=attempt,
            queued_at=job.queued_at,
            host=self.host,
            boot_id=self.boot_id,
            gpus=list(gpus),
            gpu_uuids=[by_index[i].uuid for i in gpus],
            gpu_mem_mib=charged if gpus else None,
            claim=claimed.name,
            claimed_at=self.clock.wall(),
            preempted=resumes_preempted(previous),
            failure_retries=_failure_retries(previous),
            mps_pipe=mps_pipe,
            mps_compute_pct=mps_compute,
            **limits_for(job.spec, self.config, [r.cpu_cores for r in running]),
        )

        crash_point("worker:owned")
        try:  # no fsync here: the supervisor syncs the record before the job starts
            record = transition(self.layout, claimed_job, State.RUNNING, self.host, durable=False)
        except FileExistsError:  # started elsewhere while this box was frozen after its claim and forgotten
            log.warning("%s: not started here: another box has started it meanwhile (this box was forgotten)", job_id)
            if claimed.exists():  # not the spec put back and started there: intake refuses it, by name
                put_back(self.box, job_id, claimed)
            return None
        except OSError:
            if not self.layout.record(self.layout.running, job_id).exists():
                keep_place(self.layout, job_id, uid, job.queued_at)
                put_back(self.box, job_id, claimed)  # no record: the spec waits in jobs/ again
            raise  # (with a record, the next pass requeues the attempt: it never started)
        crash_point("worker:recorded")
        self.spawner.launch(record)
        crash_point("worker:sent")
        log.debug("started %s on %s GPUs %s", job_id, self.host, list(gpus))  # events record it too
        return record

    def _mps_for(self, spec: JobSpec, gpu: GpuSnapshot | None) -> tuple[str | None, int | None]:
        """(pipe directory, compute share) for a job that runs under MPS (the mps extra: its
        GPU's daemon started if need be); (None, None) for any other job, where the daemon
        cannot start (the job is then time-sliced, as without MPS), and without the extra."""
        if gpu is None:
            return None, None
        for sharer in self.sharers:
            if (found := sharer.client(spec, gpu)) is not None:
                return found
        return None, None


def _failure_retries(previous: dict | None) -> int:
    """The re-runs after a failure so far (run/retry.py), as the requeued record counts them."""
    found = (previous or {}).get("failure_retries")
    return found if type(found) is int and found >= 0 else 0
