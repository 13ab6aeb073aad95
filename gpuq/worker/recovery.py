"""Deciding the fate of attempts nobody runs any more: settled on their own host under the
job lock, or taken over from a host that is dead; requeued as attempt+1 when they provably
never started or were lost with their host and have retries left.

A requeue keeps the spec under a claim of the acting host all along: the attempt's record
goes to requeued/ (so the next attempt is numbered +1), the running record goes (so the id
is free again), then the spec returns to jobs/ at its old place in the queue. A crash before
the running record goes leaves this host's claim for the next attempt beside that record: the
next requeue of the attempt takes it over. A crash after leaves an orphan claim of this host,
which the next pass puts back.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from gpuq import hooks
from gpuq.host import rootorders
from gpuq.host.faults import crash_point
from gpuq.host.files import create_owned, read_json
from gpuq.model.errors import SpecError
from gpuq.model.markers import Marker, Phase
from gpuq.model.record import Record, claim_name, parse_claim_name
from gpuq.model.spec import spec_text_with
from gpuq.model.states import State
from gpuq.model.stops import StopCause, ended_as
from gpuq.run.joblocal import checked_result, read_exit, read_marker, stop_ordered
from gpuq.run.launch import CannotStart, Leftover, as_owner
from gpuq.spool.cancel import unread_cancels
from gpuq.spool.store import (
    append_note,
    claims_of,
    has_record,
    keep_place,
    read_record,
    torn_running_record,
    transition,
)
from gpuq.worker.box import Box
from gpuq.worker.returns import put_back

log = logging.getLogger("gpuq.worker")


class Recovery:
    def __init__(self, box: Box) -> None:
        self.box = box
        self.layout, self.config, self.rt = box.layout, box.config, box.rt
        self.clock = box.clock  # the worker's: when heartbeats were seen to change, record times
        self.host, self.boot_id = box.host, box.boot_id
        # host -> ((boot, seq, mtime), when that was first seen, whether it was seen to change)
        self.heartbeats: dict[str, tuple[tuple, float, bool]] = {}
        self.watched_at = float("-inf")
        self.requeued = 0  # specs put back into jobs/ so far (the worker reads jobs/ again after one)

    # --- this host's attempts --------------------------------------------------------------

    def settle_gone(self, record: Record) -> None:
        """Called holding the job lock: nothing of this attempt runs, so decide its fate."""
        running_path = self.layout.record(self.layout.running, record.id)
        if self.layout.record(self.layout.finished, record.id).exists():
            running_path.unlink(missing_ok=True)  # the supervisor finished; a leftover copy
            return
        if not running_path.exists():
            return  # settled meanwhile
        self._clear_leftovers(record)
        if record.boot_id != self.boot_id:
            self.lose(record, "host rebooted")
            return
        marker = read_marker(self.rt, record)
        settle = {
            Phase.UNSTARTED: self._never_started,
            Phase.PREEMPTED: self._yielded,
            Phase.FENCED: self._fenced,
            Phase.UNRECORDED: self._unrecorded,
            Phase.RETRY: self._retried,
        }.get(marker.phase, self._died)  # STARTED, RUNNING, ENDED: its supervisor died
        settle(record, marker)

    # How a dead attempt is settled, by the phase its supervisor last marked (model/markers.py).

    def _never_started(self, record: Record, marker: Marker) -> None:
        self.requeue(record, "never started; requeued", unstarted=True)

    def _yielded(self, record: Record, marker: Marker) -> None:
        """It yielded its GPU: back to its old place, never lost."""
        self.requeue(record, f"{marker.why}; requeued as attempt {record.attempt + 1}", StopCause.PREEMPT)

    def _retried(self, record: Record, marker: Marker) -> None:
        """It failed, and a retry rule sends it back to its place with its spec changed
        (run/retry.py); a change that makes no spec (or no changes) ends it as failed."""
        why = f"{marker.why}; requeued as attempt {record.attempt + 1}"
        try:
            if not isinstance(marker.result, dict) or not marker.result:
                raise SpecError(f"jobs/{record.id}.yaml", "(retry)", "changes nothing", "none")
            text = spec_text_with(record.spec_text.encode(), marker.result, why, f"jobs/{record.id}.yaml")
        except SpecError as e:
            reason = f"{marker.why}; not requeued: the changed spec is refused ({e})"
            transition(self.layout, record, State.FAILED, self.host, ended_at=self.clock.wall(), reason=reason)
            return
        self.requeue(record, why, text=text, failure_retries=record.failure_retries + 1)

    def _fenced(self, record: Record, marker: Marker) -> None:
        """Its supervisor stopped it and recorded nothing: this host had been cut off."""
        self.lose(record, marker.why or "fenced")

    def _unrecorded(self, record: Record, marker: Marker) -> None:
        """The supervisor could not write the result (disk full or failing): it kept it."""
        try:
            state, result = checked_result(marker.result)
        except ValueError as e:  # never settled otherwise: the record would say running for good
            state, result = (
                State.LOST,
                {
                    "ended_at": self.clock.wall(),
                    "reason": f"exit unknown: the result its supervisor kept is unreadable ({e})",
                },
            )
        transition(self.layout, record, state, self.host, **result)

    def _died(self, record: Record, marker: Marker) -> None:
        """Its supervisor died: how the job ended, if its keeper kept that; else unknown."""
        if (ended := read_exit(self.rt, record)) is not None:
            self._settle_from_keeper(record, ended)
            return
        transition(
            self.layout,
            record,
            State.LOST,
            self.host,
            ended_at=self.clock.wall(),
            reason="exit unknown: supervisor and job gone without a result",
        )

    def _clear_leftovers(self, record: Record) -> None:
        """What a run of an attempt whose supervisor died left outside its process tree (a
        docker/podman container, which holds its GPU for nobody): removed as the job's owner,
        by the launch wrapper of the extra that made it."""
        recovers = [
            w.recover
            for w in hooks.registry().launch_wrappers
            if w.recover is not None and (w.field is None or record.spec.get(w.field))
        ]
        if not recovers:
            return
        orders = rootorders.orders()
        try:
            spec_fd = os.open(self.layout.claims / (record.claim or "-"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            spec_fd = None
        try:
            commands = (lambda env: as_owner(self.rt, orders, record, spec_fd, env)) if orders is not None else None
            for recover in recovers:
                try:
                    if (removed := hooks.load(recover)(Leftover(self.rt, record, commands))) is not None:
                        log.warning("removed %s of %s, left running by its dead supervisor", removed, record.id)
                except CannotStart as e:
                    log.warning("cannot remove what %s's run left (%s): %s", record.id, recover, e)
        finally:
            if spec_fd is not None:
                os.close(spec_fd)

    def _settle_from_keeper(self, record: Record, ended: dict) -> None:
        """Its supervisor died while the job ran on; the job's keeper wrote how it ended. A
        stop ordered before (the stop file: a preemption, a cancel, a limit) says why."""
        if ended.get("fenced"):
            self.lose(record, "fenced: this host's heartbeat grew too old while its supervisor was gone")
            return
        status = ended["status"]
        signal = status & 0x7F if status & 0x7F else None
        exit_code = None if signal is not None else (status >> 8) & 0xFF
        stop = stop_ordered(self.rt, record.id)
        if stop is not None and stop.cause is StopCause.PREEMPT:
            self.requeue(record, f"{stop.reason}; requeued as attempt {record.attempt + 1}", StopCause.PREEMPT)
            return
        ended_at = ended.get("ended_at")
        transition(
            self.layout,
            record,
            ended_as(stop, exit_code),
            self.host,
            ended_at=ended_at if isinstance(ended_at, (int, float)) else self.clock.wall(),
            exit_code=exit_code,
            signal=signal,
            cause=stop.cause if stop else None,
            reason=(stop.reason + "; " if stop else "") + "its supervisor died; the job's keeper kept its exit status",
        )

    def lose(self, record: Record, why: str) -> None:
        """The attempt died with its host: run it again while its retries last; unless it was
        cancelled, and its worker died before it read the cancel (the job ran again)."""
        if (cancel := unread_cancels(self.layout, [record]).get((record.host or "", record.id))) is not None:
            self.end_lost(
                record, State.CANCELLED, f"cancelled by {cancel[0]}; {why}, before its worker read the cancel"
            )
            return
        retries = record.spec.get("retries")
        retries = self.config.lost_retries if retries is None else retries
        if record.attempt <= retries:
            self.requeue(record, f"{why}; requeued as attempt {record.attempt + 1}")
            return
        self.end_lost(record, State.LOST, f"{why}; no retries left ({retries})")

    def end_lost(self, record: Record, state: State, why: str) -> None:
        """The attempt died with its host and is not run again: recorded as ended."""
        cause = StopCause.CANCEL if state is State.CANCELLED else None
        transition(self.layout, record, state, self.host, ended_at=self.clock.wall(), reason=why, cause=cause)
        if record.claim:
            (self.layout.claims / record.claim).unlink(missing_ok=True)

    def requeue(
        self, record: Record, reason: str, cause: StopCause | None = None, text: bytes | None = None, **fields: Any
    ) -> None:
        """Back to its place as attempt+1: the same spec, or `text` (the owner's again, its
        mode kept); `fields` go into the requeued record (the next attempt reads them)."""
        held = self._hold_spec(record)
        if held is None:
            return  # another host is requeueing it, or it was settled meanwhile
        crash_point("recovery:held")
        st = os.lstat(held)
        if text is not None:
            mode, place = stat.S_IMODE(st.st_mode), st.st_mtime_ns  # its time: taken in at once, as a rename is
            os.rename(create_owned(self.layout.claims, record.id, text, st.st_uid, st.st_gid, mode, place), held)
        keep_place(self.layout, record.id, st.st_uid, record.queued_at)
        said = {"retry": True} if text is not None else None  # `show` lists the job's retries
        transition(self.layout, record, State.PENDING, self.host, said=said, reason=reason, cause=cause, **fields)
        crash_point("recovery:recorded")
        put_back(self.box, record.id, held)
        self.requeued += 1

    def _hold_spec(self, record: Record) -> Path | None:
        """Move the attempt's claim to a claim of this host (exactly one host wins the rename);
        take over this host's claim for the next attempt where an earlier requeue of this
        attempt died after taking the claim; recreate the claim from the record only when no
        claim of the job exists at all."""
        held = self.layout.claims / claim_name(record.id, self.host, self.boot_id, record.attempt + 1)
        if record.claim:
            try:
                os.rename(self.layout.claims / record.claim, held)
                return held
            except FileNotFoundError:
                pass
        try:
            current = read_record(self.layout.record(self.layout.running, record.id))
        except ValueError:
            return None
        if current is None or current.claim != record.claim:
            return None
        claims = claims_of(self.layout, record.id)
        # This host's claim for the next attempt while the record still says this attempt runs:
        # only a requeue of this attempt on this host makes one, and only one worker of a host
        # runs at a time, so its requeuer is dead (a claim of another host may still be live).
        for path in claims:
            if parse_claim_name(path.name) == (record.id, self.host) and path.name.endswith(
                f"@a{record.attempt + 1}.yaml"
            ):
                os.rename(path, held)
                return held
        if claims:
            return None
        # The owner's spec again (never the worker's: intake would refuse a root-owned one).
        os.rename(create_owned(self.layout.claims, record.id, record.spec_text.encode(), record.uid), held)
        return held

    def requeue_orphan_claims(self) -> None:
        """Claims of this host by an earlier worker that died before recording them (or in
        the middle of a requeue)."""
        for path in self.layout.claims.iterdir():
            parsed = parse_claim_name(path.name)
            if (
                parsed is None or parsed[1] != self.host or f"@{self.boot_id[:8]}@{os.getpid()}@" in path.name
            ):  # this very worker's (a pid is reused after a reboot)
                continue
            job_id = parsed[0]
            if self._torn_at_boot(job_id, path.name):
                self.layout.record(self.layout.running, job_id).unlink(missing_ok=True)
                log.warning("state/running/%s.json was not a record after a reboot (a power cut): removed", job_id)
            if has_record(self.layout, job_id):
                finished = read_json(self.layout.record(self.layout.finished, job_id)) or {}
                if finished.get("claim") == path.name:
                    path.unlink(missing_ok=True)  # its supervisor recorded it, then died
                continue
            if put_back(self.box, job_id, path):  # it never left pending: a note, not a change
                append_note(self.layout, self.host, job_id, "requeued", "claimed but never recorded; requeued")

    def _torn_at_boot(self, job_id: str, claim: str) -> bool:
        """Whether this host's claim is from before the boot and its running record is empty or
        torn (spool/store.py, torn_running_record): a power cut took the data of a record whose
        job never started (its claim goes back to jobs/), or of one settled before its
        supervisor ran, beside its finished record (which wins). Nobody but the worker's
        account writes running/, and only a worker's start skips the fsync."""
        if f"@{self.host}@{self.boot_id[:8]}@" in claim:
            return False  # this boot's: written whole (a dead worker is no power cut)
        return torn_running_record(self.layout, job_id)

    # --- other hosts ------------------------------------------------------------------------

    def take_over_dead_hosts(self) -> None:
        """A dead host's running jobs are lost. Its own supervisors stopped them before (see
        run/supervise.py), and write nothing afterwards."""
        dead = self.dead_hosts()
        if not dead:
            return
        for entry in os.scandir(self.layout.running):
            try:
                record = read_record(Path(entry.path)) if entry.name.endswith(".json") else None
            except ValueError:
                continue  # not a record: the worker that reads running/ reports it
            if record is not None and record.host in dead:
                log.warning("host %s is dead: taking over %s", record.host, record.id)
                self.lose(
                    record, f"host {record.host} stopped (heartbeat unchanged for {self.config.lost_after_s:g} s)"
                )

    def silent_s(self, host: str, now: float | None = None) -> float | None:
        """How long, on this host's monotonic clock, `host`'s heartbeat has not changed (as
        last looked at); None until it has been seen to change once (a file left by a box
        long gone must not count as a live box's)."""
        seen = self.heartbeats.get(host)
        if seen is None or not seen[2]:
            return None
        return (self.clock.mono() if now is None else now) - seen[1]

    def dead_hosts(self) -> set[str]:
        """Hosts whose heartbeat (boot id, sequence number, the file's mtime) has not changed
        for lost_after_s, on this host's own monotonic clock (checked at most once per poll
        interval). Only a change is looked at, never the time itself: clocks may differ."""
        now = self.clock.mono()
        if now - self.watched_at < self.config.poll_interval:
            return set()
        self.watched_at = now
        dead = set()
        for path in self.layout.workers.glob("*.json"):
            host = path.name[: -len(".json")]
            if host == self.host or host.endswith(".specs"):
                continue
            try:
                beat = read_json(path) or {}
                touched = os.stat(path).st_mtime_ns  # renewed alone when the disk is full
            except (OSError, ValueError):
                beat, touched = {}, None
            if not isinstance(beat, dict):
                beat = {}
            key = (beat.get("boot_id"), beat.get("seq"), touched)
            seen = self.heartbeats.get(host)
            if seen is None or seen[0] != key:
                self.heartbeats[host] = (key, now, seen is not None)
            elif now - seen[1] >= self.config.lost_after_s:
                dead.add(host)
        return dead
