"""Bridge mode (config `backend: slurm`): the worker hands pending specs to Slurm instead of
running them, and keeps gpuq's records, logs, `status`, `show` and `cancel` true, so a team
sees one queue while Slurm does the placing.

Hand-over, per pending job in queue order: claim the spec (the usual rename), check the claimed
file itself (no link, one link, the bytes read, an owner this worker may submit for: its owner
from fstat, never from a path), write the running record (no Slurm id yet), `sbatch --parsable`
the exported script (slurm/export.py) with `--comment=gpuq:<claim>`, then record the Slurm id
(in the record and in state/slurm/<id>.json, which later exports' --dependency read).
Dependencies go to Slurm as afterok/afterany once their jobs are handed over; one that failed in
gpuq cancels its dependents as usual. Following: squeue for the jobs still queued or running,
then `scontrol show job` for the end state and exit code (Slurm keeps ended jobs MinJobAge
seconds, default 300), else `sacct` (where slurmdbd keeps accounting), else the jobcomp/filetxt
log (config slurm_jobcomp_file); COMPLETED -> done, FAILED -> failed, CANCELLED -> cancelled,
TIMEOUT -> timeout, NODE_FAIL and a job Slurm no longer knows -> lost. `gpuq cancel` -> scancel.
Several bridges may serve one root; a dead one's jobs are adopted by another
(adopt_from_dead_bridges)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from gpuq.extras.slurm.export import ExportError, handed_over, sbatch_script, slurm_logs
from gpuq.host import rootorders, wire
from gpuq.host.faults import crash_point, wall_time
from gpuq.host.files import write_json
from gpuq.host.owners import Identity
from gpuq.model.config import FENCE_FRACTION
from gpuq.model.record import Record, claim_name
from gpuq.model.spec import JobSpec
from gpuq.model.states import State
from gpuq.model.stops import Stop, StopCause
from gpuq.run.joblocal import lease_age
from gpuq.run.launch import AsOwner, CannotStart, as_owner, prepare_log
from gpuq.sched.fairshare import queue_order
from gpuq.spool.deps import FINAL, gates, referenced
from gpuq.spool.intake import user_name
from gpuq.spool.store import (
    append_note,
    claim,
    running_records,
    spec_state,
    transition,
    write_record,
)
from gpuq.worker.loop import Worker
from gpuq.worker.returns import put_back

log = logging.getLogger("gpuq.worker")
# What stopped a job that Slurm ended as cancelled (`gpuq cancel` is an scancel) or timed out.
SLURM_STOP_CAUSES = {State.CANCELLED: StopCause.CANCEL, State.TIMEOUT: StopCause.TIMEOUT}
SLURM_STATES = {
    "COMPLETED": State.DONE,
    "FAILED": State.FAILED,
    "CANCELLED": State.CANCELLED,
    "TIMEOUT": State.TIMEOUT,
    "NODE_FAIL": State.LOST,
    "OUT_OF_MEMORY": State.FAILED,
    "PREEMPTED": State.LOST,
    "BOOT_FAIL": State.LOST,
    "DEADLINE": State.TIMEOUT,
}
FOLLOW_EVERY_S = 2.0
UNKNOWN_FOR_S = 10.0  # a job no source of Slurm's knows is lost only after this long


def _slurm(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)


def _as_completed(ran: tuple[int | None, str]) -> subprocess.CompletedProcess:
    """A command run as a job's owner (its output and errors together) as subprocess tells it."""
    status, output = ran
    code = 124 if status is None else os.waitstatus_to_exitcode(status)
    out, err = (output, "") if code == 0 else ("", output)
    return subprocess.CompletedProcess([], code, out, err)


def _slurm_time(text: str | None) -> float | None:
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


class SlurmUnreachable(Exception):
    """The controller did not answer: try again later, never conclude anything from it."""


def _unknown_job(out: subprocess.CompletedProcess) -> bool:
    """A failed squeue/scontrol: because Slurm no longer knows the job (False: it did not
    answer at all, and SlurmUnreachable is raised)."""
    if "Invalid job id" in out.stderr:
        return True
    raise SlurmUnreachable(out.stderr.strip()[-200:] or f"exit {out.returncode}")


def scontrol_job(slurm_id: str) -> dict[str, str] | None:
    """`scontrol show job`'s fields (None: Slurm no longer knows the job); for an array, its
    tasks summed up: the first task that did not complete speaks for it (its state and exit
    code), times span all tasks."""
    out = _slurm("scontrol", "show", "job", slurm_id)
    if out.returncode != 0 and _unknown_job(out):
        return None
    return _summed([_fields(block) for block in out.stdout.split("\n\n") if "JobState=" in block])


def _fields(text: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


def _summed(tasks: list[dict[str, str]]) -> dict[str, str] | None:
    """A job's tasks as one: the first that did not complete speaks for it (its state and
    exit code); times span them all."""
    if not tasks:
        return None
    worst = next((t for t in tasks if t.get("JobState") != "COMPLETED"), tasks[0])
    return {
        **worst,
        "StartTime": min(t.get("StartTime", "") for t in tasks),
        "EndTime": max(t.get("EndTime", "") for t in tasks),
        "Tasks": str(len(tasks)),
    }


def jobcomp_job(path: str | None, slurm_id: str) -> dict[str, str] | None:
    """A job's lines in Slurm's jobcomp/filetxt log (config slurm_jobcomp_file): where there
    is no slurmdbd, the record of jobs the controller has forgotten. None: not there (yet)."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    mine = [
        fields
        for line in lines
        if f"={slurm_id} " in line and slurm_id in ((fields := _fields(line)).get("JobId"), fields.get("ArrayJobId"))
    ]
    return _summed(mine)


def sacct_job(slurm_id: str) -> dict[str, str] | None:
    """Slurm's accounting of a job the controller has forgotten (ended more than MinJobAge
    ago: a bridge that was down meanwhile), in scontrol's field names; None where there is no
    accounting (no slurmdbd) or it has no such job. A slurmdbd that does not answer raises
    SlurmUnreachable: it may know, later."""
    try:
        out = _slurm("sacct", "-j", slurm_id, "-X", "-n", "-P", "--format=State,ExitCode,Start,End")
    except FileNotFoundError:
        return None
    if out.returncode != 0:
        if "disabled" in out.stderr or "not configured" in out.stderr:
            return None
        raise SlurmUnreachable(out.stderr.strip()[-200:] or f"sacct exit {out.returncode}")
    rows = [line.split("|") for line in out.stdout.splitlines() if line.count("|") == 3]
    if not rows:
        return None
    worst = next((r for r in rows if r[0].split()[0] != "COMPLETED"), rows[0])  # as scontrol_job
    return {
        "JobState": worst[0].split()[0],
        "ExitCode": worst[1],
        "StartTime": min(r[2] for r in rows),
        "EndTime": max(r[3] for r in rows),
        "Source": "sacct",
    }


def _handed_over_by_comment() -> dict[str, list[tuple[str, int | None]]] | None:
    """Every job Slurm knows that says a bridge handed it over: claim -> [(Slurm id, the uid
    it runs as)], from the comment sbatch was given (`gpuq:<claim>`). None when scontrol did
    not answer."""
    out = _slurm("scontrol", "show", "job")
    if out.returncode != 0:
        return None
    known: dict[str, list[tuple[str, int | None]]] = {}
    for block in out.stdout.split("\n\n"):
        fields = _fields(block)
        if fields.get("Comment", "").startswith("gpuq:"):
            uid = re.search(r"\((\d+)\)$", fields.get("UserId", ""))  # UserId=ana(1004)
            job = (fields.get("ArrayJobId") or fields.get("JobId") or "", int(uid.group(1)) if uid else None)
            if job not in known.setdefault(fields["Comment"][5:], []):
                known[fields["Comment"][5:]].append(job)
    return known


def _submitted_for(known: dict[str, list[tuple[str, int | None]]] | None, record: Record) -> str | None:
    """The Slurm id of the job a bridge submitted for `record`: its comment names the
    record's claim and it runs as the record's owner (or as this bridge's own user, as a
    user's bridge submits). Anyone may give a Slurm job of theirs any comment, and claims are
    in the records the team reads: another user's job is never taken for the record's."""
    owners = {record.uid, os.geteuid()}
    return next((sid for sid, uid in (known or {}).get(record.claim or "", []) if sid and uid in owners), None)


class BridgeWorker(Worker):
    # apply_requests: `gpuq cancel`, hold, release... of a team whose only box is the bridge
    # waited for a worker that never came (the step was missing).
    STEPS = (
        "observe",
        "adopt_from_dead_bridges",
        "follow",
        "apply_requests",
        "obey_controls",
        "take_in_specs",
        "hand_over",
        "report",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.followed_at = 0.0
        self.unknown_since: dict[str, float] = {}  # Slurm id -> when no source knew it first
        self.arrivals.expand_sweeps = False  # a sweep goes to Slurm whole, as one array job

    def run(self, once: bool = False, exit_when_idle: bool = False) -> None:
        self.find_lost_hand_overs()
        # A bridge killed between its claim and the record left a claim nobody else owns;
        # a worker settles those every pass (settle_running), which a bridge has no step for.
        self.recovery.requeue_orphan_claims()
        super().run(once, exit_when_idle)

    def await_keepers(self, timeout_s: float = 0.0) -> None:
        """Nothing to wait for before a --once bridge leaves: the jobs it hands over run under
        Slurm, not under keepers this box's root part starts."""

    def find_lost_hand_overs(self) -> None:
        """Records an earlier bridge wrote but died before noting their Slurm id: find the job
        by the comment sbatch was given (`gpuq:<claim>`) among every job Slurm knows; one
        Slurm never got goes back to the queue at its old place."""
        orphans = [r for r in self.listing.read() if not r.slurm_id]
        if not orphans:
            return
        known = _handed_over_by_comment()
        for record in orphans:
            slurm_id = _submitted_for(known, record)
            if slurm_id:
                self._note_slurm_id(record, slurm_id)
                log.info("found %s in Slurm as job %s", record.id, slurm_id)
            elif known is not None:
                transition(self.layout, record, State.PENDING, self.host, reason="never reached Slurm; requeued")
                put_back(self.box, record.id, self.layout.claims / (record.claim or ""))
                log.info("requeued %s: it never reached Slurm", record.id)

    def adopt_from_dead_bridges(self) -> None:
        """Another bridge whose heartbeat stood still lost_after_s is dead, but its jobs still
        run in Slurm: they are adopted, never run again. The adopter renames the attempt's
        claim to its own (exactly one adopter wins) and the record names it from then on; a job
        the dead bridge had not noted the Slurm id of is found by its sbatch comment, or, if
        Slurm never got it, goes back to the queue."""
        dead = self.recovery.dead_hosts()
        orphans = [r for r in running_records(self.layout) if r.host in dead] if dead else []
        known = _handed_over_by_comment() if any(not r.slurm_id for r in orphans) else {}
        for record in orphans:
            slurm_id = record.slurm_id or _submitted_for(known, record)
            if slurm_id is None:
                if known is not None:  # Slurm answered: it never got this one
                    self.recovery.requeue(record, f"bridge {record.host} died before handing it to Slurm; requeued")
                continue
            new_claim = claim_name(record.id, self.host, self.boot_id, record.attempt)
            if claim(self.layout, self.layout.claims / (record.claim or ""), new_claim) is None:
                continue  # another bridge adopted it first
            adopted = replace(record, host=self.host, boot_id=self.boot_id, claim=new_claim)
            self._note_slurm_id(adopted, slurm_id)
            append_note(self.layout, self.host, record.id, "adopted", f"adopted from bridge {record.host} (dead)")
            log.warning("bridge %s is dead: following %s (Slurm job %s) from here", record.host, record.id, slurm_id)

    def _fail(self, record: Record, reason: str) -> None:
        """The attempt ends here, never handed over: Slurm will not run it."""
        transition(self.layout, record, State.FAILED, self.host, ended_at=wall_time(), reason=reason)

    def _note_slurm_id(self, record: Record, slurm_id: str) -> None:
        write_record(self.layout, replace(record, slurm_id=slurm_id, reason=f"Slurm job {slurm_id}"))
        directory = self.layout.state / "slurm"
        self.layout.make_state_dir(directory)
        write_json(directory / f"{record.id}.json", {"slurm_id": slurm_id, "claim": record.claim})

    def observe(self) -> None:
        """No GPUs here: Slurm's nodes have them. Only the records this bridge follows."""
        self.gpus, self.observed = [], {}
        self.running = self.listing.read()

    def follow(self) -> None:
        now = time.monotonic()
        if now - self.followed_at < FOLLOW_EVERY_S and not self.woken_by:
            return
        self.followed_at = now
        handed = [(r.slurm_id, r) for r in self.running if r.slurm_id]
        if not handed:
            return
        try:
            out = _slurm("squeue", "-h", "-o", "%F %T", "-j", ",".join(slurm_id for slurm_id, _ in handed))
            if out.returncode != 0:
                _unknown_job(out)
            active: dict[str, str] = {}  # an array is active while any of its tasks is
            for line in out.stdout.splitlines():
                job, _, state = line.partition(" ")
                if active.get(job) != "RUNNING":
                    active[job] = state.strip()
            for slurm_id, record in handed:
                if active.get(slurm_id) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                    if active[slurm_id] == "RUNNING" and record.started_at is None:
                        self._note_start(record)
                    continue
                self._settle(record)
        except (SlurmUnreachable, subprocess.TimeoutExpired) as e:
            log.warning("Slurm did not answer (%s); its jobs are followed again next pass", e)

    def _note_start(self, record: Record) -> None:
        info = scontrol_job(record.slurm_id or "") or {}
        updated = replace(
            record,
            started_at=_slurm_time(info.get("StartTime")) or wall_time(),
            reason=f"running in Slurm on {info.get('NodeList', '?')}",
        )
        write_record(self.layout, updated)

    def _settle(self, record: Record) -> None:
        slurm_id = record.slurm_id or ""
        info = scontrol_job(slurm_id) or sacct_job(slurm_id) or jobcomp_job(self.config.slurm_jobcomp_file, slurm_id)
        state_name = (info or {}).get("JobState", "")
        if info is not None and state_name not in SLURM_STATES:
            return  # an ending state (COMPLETING...) scontrol shows before squeue: next pass
        if (
            info is None
            and time.monotonic() - self.unknown_since.setdefault(slurm_id, time.monotonic()) < UNKNOWN_FOR_S
        ):
            return  # not written anywhere yet (a jobcomp log on NFS, slurmdbd catching up): ask again
        self.unknown_since.pop(slurm_id, None)
        final = SLURM_STATES.get(state_name, State.LOST)
        code, _, sig = (info or {}).get("ExitCode", ":").partition(":")
        reason = (
            None
            if final is State.DONE
            else (
                f"Slurm job {record.slurm_id}: {state_name}"
                if info
                else f"Slurm job {record.slurm_id} is no longer known to Slurm, nor to its accounting or jobcomp log "
                "(exit unknown)"
            )
        )
        transition(
            self.layout,
            record,
            final,
            self.host,
            started_at=_slurm_time((info or {}).get("StartTime")) or record.started_at,
            ended_at=_slurm_time((info or {}).get("EndTime")) or wall_time(),
            exit_code=int(code) if code.isdigit() and info else None,
            signal=int(sig) if sig.isdigit() and int(sig) else None,
            reason=reason,
            cause=SLURM_STOP_CAUSES.get(final),
        )
        claimed = self.layout.claims / (record.claim or "")
        claimed.unlink(missing_ok=True)
        log.info("%s (Slurm %s) ended: %s", record.id, record.slurm_id, final.value)

    def _stop(self, record: Record, stop: Stop) -> bool:
        if not record.slurm_id:
            return False  # being handed over: the next pass
        try:  # as the job's owner, who submitted it
            owner = self._as_owner(record, JobSpec.from_json(record.spec))
            kill = ["--signal=KILL"] if stop.at_once else []  # `gpuq cancel --now`
            out = _as_completed(owner.run([shutil.which("scancel") or "scancel", *kill, record.slurm_id], 60))
        except (OSError, CannotStart, wire.Refused, wire.StarterGone) as e:
            out = subprocess.CompletedProcess(["scancel"], 1, "", str(e))
        if out.returncode != 0:
            log.warning("scancel %s: %s", record.slurm_id, out.stderr.strip())
        return True

    def start_jobs(self) -> None:
        """Bridge mode starts nothing here (the base class's step is not in STEPS)."""

    def hand_over(self) -> None:
        pending = self.intake.pending()
        if not pending:
            return
        handed = handed_over(self.layout.state / "slurm")
        _, doomed = gates(pending, self.dep_states, wall_time())
        for job_id, why in doomed.items():
            self._cancel_doomed(job_id, why)
        states = self.dep_states.lookup(referenced(j.spec for j in pending))
        for job in queue_order([j for j in pending if j.id not in doomed], [], [], self.config, wall_time()):
            deps = {d: "done" for d in job.spec.after} | {d: "any" for d in job.spec.after_any}
            if any(
                d not in handed and (states.get(d) != "done" if want == "done" else states.get(d) not in FINAL)
                for d, want in deps.items()
            ):
                continue  # it waits in gpuq until its dependencies are Slurm's
            # Slurm waits for the dependencies still open; ended ones need no --dependency
            self._hand(job, {d: handed[d] for d in deps if d in handed and states.get(d) not in FINAL})

    def _as_owner(self, record: Record, spec: JobSpec) -> AsOwner:
        """How sbatch and scancel run for this job: as its spec's owner, through the root part,
        so that Slurm takes the job as theirs (no --uid, root's privilege, ever); as this
        bridge's own user where jobs do not run as their owners. sbatch's --export=ALL hands
        sbatch's environment to the job, so it is the clean one a job starts from (the owner's
        HOME, USER, LOGNAME, SHELL, a plain PATH), plus what tells sbatch which cluster to use.
        The logs Slurm will append to (one per array task) are made first, the owner's (0640),
        so that Slurm writes to their files, never through a link planted in logs/. Raises
        CannotStart for an owner who may not have the job, OSError when a log cannot be made."""
        orders = rootorders.orders()
        if orders is None:
            raise CannotStart("no root part to submit it as its owner (the bridge was not started by gpuq-worker)")
        commands = as_owner(self.rt, orders, record, None)
        owner = Identity.of(commands.uid) if commands.uid != os.geteuid() else None
        log_path = str(self.layout.job_log(record.id))  # gpuq's own, and Slurm's --output(s)
        for path in dict.fromkeys([log_path, *slurm_logs(log_path, spec)]):
            prepare_log(Path(path), owner, orders)
        slurm = {k: v for k, v in os.environ.items() if k == "SLURM_CONF" or k.startswith("SBATCH_")}
        return replace(commands, env={**commands.env, **slurm}, spec_fd=self._claim_fd(record))

    def _claim_fd(self, record: Record) -> int | None:
        """The job's claimed spec, open: the root part checks that it is the owner's."""
        try:
            return os.open(self.layout.claims / (record.claim or "-"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None

    def _hand(self, job, dependency_ids: dict[str, str]) -> None:
        taken = self.starter.claimer.claim(job.id, crash_prefix="bridge")
        if taken is None:
            return
        entry, claimed, uid, attempt, _ = taken
        name = claimed.name
        claimed_job = Record(  # as its claim showed it: taken from jobs/, so pending
            id=job.id,
            state=spec_state(self.layout, claimed),
            spec=job.spec.to_json(),
            spec_text=entry.text.decode("utf-8-sig", "replace"),
            user=user_name(uid),
            uid=uid,
            attempt=attempt,
            queued_at=job.queued_at,
            host=self.host,
            boot_id=self.boot_id,
            claim=name,
            claimed_at=wall_time(),
            reason="handed to Slurm",
            time_limit_s=job.spec.time_limit_s or self.config.time_limit_s,
        )
        record = transition(self.layout, claimed_job, State.RUNNING, self.host)
        crash_point("bridge:recorded")
        if (age := lease_age(self.rt)) is not None and age > FENCE_FRACTION * self.config.lost_after_s:
            # Paused past its lease (a stopped VM): another bridge may have requeued this very
            # record meanwhile and handed the job over itself. Submitting now could run it twice.
            self.recovery.requeue(record, f"bridge {self.host} was paused {age:.0f} s before sbatch; requeued")
            return
        try:
            script = sbatch_script(
                job.id, job.spec, self.config, str(self.layout.job_log(job.id)), str(self.layout.root), dependency_ids
            )
        except ExportError as e:
            self._fail(record, f"cannot hand to Slurm: {e}")
            return
        try:
            owner = self._as_owner(record, job.spec)
        except (KeyError, OSError, CannotStart) as e:
            self._fail(record, f"cannot hand to Slurm as uid {record.uid}, the spec's owner: {e}")
            return
        sbatch = shutil.which("sbatch") or "sbatch"  # found on the bridge's PATH, not the job's
        try:
            out = _as_completed(owner.run([sbatch, "--parsable", f"--comment=gpuq:{name}"], 60, stdin=script))
        except (wire.Refused, wire.StarterGone) as e:
            out = subprocess.CompletedProcess([sbatch], 1, "", f"the root part did not run sbatch: {e}")
        finally:
            if owner.spec_fd is not None:
                os.close(owner.spec_fd)
        if out.returncode != 0 and any(m in out.stderr for m in ("Unable to contact", "timed out", "Zero Bytes")):
            transition(self.layout, record, State.PENDING, self.host, reason="Slurm did not answer; requeued")
            put_back(self.box, job.id, claimed)  # the controller was away: try again later
            log.warning("sbatch of %s: Slurm did not answer (%s)", job.id, out.stderr.strip()[-200:])
            return
        if out.returncode != 0:
            self._fail(record, f"sbatch refused it: {out.stderr.strip()[-300:]}")
            return
        crash_point("bridge:submitted")
        slurm_id = out.stdout.strip().splitlines()[-1].split(";")[0]  # after any warning sbatch printed
        self._note_slurm_id(record, slurm_id)
        log.info("handed %s to Slurm as job %s", job.id, slurm_id)
