"""A job under its supervisor, and stopping it.

The supervisor is forked by the spawner (see run/spawner.py), in its own session, as the
queue's account. It receives each job already holding the job's liveness lock, has the root
part start the job under a keeper (host/keeper.py: the job's parent, which holds the lock
too, so the kernel releases it only when both are gone), waits, and writes the result. It
runs one job at a time, and may be handed another once it has recorded the last. It outlives
the worker; a restarted worker reattaches through the records and the locks. It never enters
a job's workdir: its working directory is `/` all its life.

What to run, and as whom, comes only from the worker: it hands the whole record (spec, uid,
claim, attempt) over the spawner's pipe. The running record on disk is read back only to
learn whether this attempt is still the recorded one (its claim, unique per attempt):
a file that changed can stop the job, never change its command, its owner or a path.

Order, so that no job runs without a record and no record claims a job that never started:
the worker writes the running record, then asks the spawner. The supervisor, holding the
lock, checks that the record on disk is still its attempt's, writes the `started` marker
into the lock file, then runs the job. Whoever settles a running record whose supervisor
seems gone does so while holding the job lock (`settle_lock`), so a launch that was slow to
arrive can never run a job that has just been requeued: it would fail to take the lock, or
find the record gone.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from dataclasses import dataclass, replace
from pathlib import Path

from gpuq.host import rootorders, wire
from gpuq.host.clock import Clock
from gpuq.host.faults import crash_point, io_fault, wall_time
from gpuq.host.hostinfo import process_start_ticks
from gpuq.host.owners import Identity
from gpuq.host.usage import read_gpu_usage
from gpuq.host.wake import WAKE_JOB_ENDED, poke
from gpuq.model.config import FENCE_FRACTION, RECORD_FENCE_FRACTION
from gpuq.model.environments import prelude_failure
from gpuq.model.markers import Marker, Phase, check_marker, parse_marker
from gpuq.model.record import Record
from gpuq.model.spec import JobSpec, command_shown, stop_grace_s
from gpuq.model.stops import Stop, StopCause, ended_as
from gpuq.model.units import format_duration
from gpuq.run.joblocal import Runtime, finish_local, lease_age, write_outside_pid
from gpuq.run.jobwatch import NEVER, JobWatch
from gpuq.run.launch import (
    CannotStart,
    Companion,
    CompanionTools,
    as_owner,
    build_launch,
    inherited_environment,
    job_identity,
    shell_exit_note,
    start_run,
)
from gpuq.run.limits import LimitWatch
from gpuq.run.retry import Retry, failure_of, retry_after
from gpuq.sched.restarts import HEALTHY_S, restart_delay
from gpuq.spool.ids import sync as sync_reservation
from gpuq.spool.store import forget_kept, read_record, transition, write_record


def _close_inherited_fds(keep: tuple[int, ...]) -> None:
    # The spawner's pipes and any other descriptor must not live on in jobs.
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


class _StopRequested(Exception):
    pass


class _StopSignal:
    """SIGTERM to the supervisor means "stop the job" when a stop request for the job it runs
    now exists (`request_stop` writes it before signalling): a supervisor serves one job after
    another, and a late signal meant for an earlier job must not stop the next one. It is
    noted whenever it comes, and it interrupts only the wait for the job (never a record
    being written)."""

    requested = False
    armed = False
    stop_path: Path | None = None

    @classmethod
    def handler(cls, signum: int, frame: object) -> None:
        if cls.stop_path is None or not cls.stop_path.exists():
            return
        cls.requested = True
        if cls.armed:
            raise _StopRequested()


def _shrug(signum: int, frame: object) -> None:
    pass


def become_supervisor(keep_fds: tuple[int, ...]) -> None:
    """Once, in a process just forked by the spawner: its own session, no inherited
    descriptors but `keep_fds` and the root part's socket, stdin and stdout on /dev/null (its
    stderr stays the spawner's: the worker's log), and the stop signal."""
    os.setsid()
    orders = rootorders.orders()
    _close_inherited_fds(keep_fds + ((orders.fileno(),) if orders is not None else ()))
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1):
        os.dup2(devnull, std)
    os.close(devnull)
    # Whatever the worker was started with (cron, a shell's background job ignores SIGQUIT)
    # is not the supervisor's: every disposition back to its default, then ours.
    for sig in signal.valid_signals():
        if sig < signal.SIGRTMIN and sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, _StopSignal.handler)
    signal.signal(signal.SIGINT, _shrug)
    signal.signal(signal.SIGHUP, _shrug)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored, as Python has them
        signal.signal(sig, signal.SIG_IGN)


def supervise(rt: Runtime, record: Record, lock_fd: int, clock: Clock | None = None) -> None:
    """Run the attempt `record` (as the worker handed it), holding its lock on `lock_fd`
    (closed on return), and record it. Every wait reads `clock` (the host's by default)."""
    _StopSignal.requested, _StopSignal.stop_path = False, rt.stop_path(record.id)
    try:
        # The worker wrote the record without an fsync (spool/store.py, StateChange): it is on
        # the disk before the job may start, so an attempt that takes its host down still
        # counts against lost_retries, and one a power cut left empty never started.
        if not _still_recorded(rt, record, if_unreadable=False, durable=True):
            return  # requeued or settled before the launch arrived (or unknowable): run nothing
        try:  # the id's reservation, written with the record and as it was (spool/ids.py)
            sync_reservation(rt.layout, record.id)
        except OSError:
            pass  # none to sync (made before state/ids/, or a disk error): the migration or the claim has it
        try:
            forget_kept(rt.layout, record.id)
        except OSError:
            pass  # best effort: a requeue of this attempt writes both anew
        crash_point("supervisor:owned")
        # An earlier attempt's exit and stop files: never read as this one's (a stop is only
        # ordered once this attempt is marked started, below).
        rt.exit_path(record.id).unlink(missing_ok=True)
        rt.stop_path(record.id).unlink(missing_ok=True)
        _mark(lock_fd, Marker(Phase.STARTED, record.claim))
        crash_point("supervisor:marked")
        _run_and_record(rt, record, lock_fd, clock or Clock())
    finally:
        _StopSignal.stop_path = None
        os.close(lock_fd)


def _mark(lock_fd: int, marker: Marker) -> None:
    """How far the attempt got (model/markers.py), in the locked file: one small write over the
    one before, padded with spaces to its length (JSON allows them), so nothing of it is left.
    No truncate: on ext4 each one is a journal transaction, three a job (a lock file's cycle
    measured 136-184 µs with them, 19-25 µs without: docs/benchmarks.md). A reader between the
    writes sees a torn marker as no marker (a truncate gave it an empty file). Local and only
    meaningful for this boot: no fsync. Raises MarkerError for a phase out of order."""
    size = os.fstat(lock_fd).st_size
    check_marker(parse_marker(os.pread(lock_fd, size, 0), marker.claim).phase, marker.phase)
    pid = os.getpid()
    data = json.dumps({"supervisor_pid": pid, "ticks": process_start_ticks(pid), "t": wall_time(), **marker.fields()})
    os.pwrite(lock_fd, data.encode().ljust(size), 0)


def fence_reason(rt: Runtime, record: Record, lease_fraction: float = FENCE_FRACTION) -> str | None:
    """Why this host may no longer run or record `record`'s attempt, if it may not: its
    heartbeat is older than `lease_fraction` of lost_after_s (others will soon take its jobs
    over), or another host already did."""
    age = lease_age(rt)
    if age is not None and age > lease_fraction * rt.lost_after_s:
        return f"fenced: this host's heartbeat is {age:.0f} s old, other hosts may take its jobs over"
    if not _still_recorded(rt, record):  # unreadable: no conclusion; the lease above still fences
        return "fenced: another host took this job over"
    return None


def _still_recorded(rt: Runtime, record: Record, if_unreadable: bool = True, durable: bool = False) -> bool:
    """Whether the running record on disk is still this attempt's (same claim). Only this
    yes or no is taken from the file: what runs, as whom, and which paths are cleaned up
    always come from `record`, which the worker handed over. A file that is not a record is
    not this attempt's; one that cannot be read (a disk error) gives `if_unreadable`, and so
    does one that `durable` asks to fsync and the disk refuses."""
    try:
        current = read_record(rt.layout.record(rt.layout.running, record.id), durable=durable)
    except ValueError:  # RecordError, or not JSON: not a record of this attempt
        return False
    except OSError:
        return if_unreadable
    return current is not None and current.claim == record.claim


def prepare() -> None:
    """Load, in the spawner, what every supervisor needs: forks inherit it ready."""
    inherited_environment()
    rootorders.orders()


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


@dataclass
class _Attempt:
    """One attempt as its supervisor starts it, runs (and restarts) it and records how it
    ended: _first_start fills it in, _run_and_restart updates it, _record_outcome reads it."""

    record: Record  # as handed over; one restart more after each restart of a service
    spec: JobSpec
    started: float  # wall clock, before the first start
    identity: Identity | None  # whom the job runs as (None: the starter's own account)
    orders: rootorders.Orders | None  # the root part, which starts each run (None: nothing can start)
    fds: dict[str, int]  # what each run's keeper is handed (_keeper_fds)
    keeper: rootorders.Keeper | None = None  # the run under way
    companion: Companion | None = None  # what the run holds outside its process tree (a container)
    limits: LimitWatch | None = None  # set once the job first ran: only then is there usage to record
    log_fd: int | None = None  # the job's log, for gpuq's own lines
    job_pid: int | None = None
    failure: str | None = None  # why it could not start, or restart
    stop: Stop | None = None
    fenced: str | None = None
    exit_code: int | None = None
    sig: int | None = None


def _run_and_record(rt: Runtime, record: Record, lock_fd: int, clock: Clock) -> None:
    attempt = _first_start(rt, record, lock_fd, clock)
    if attempt is None:
        return  # the root part's starter is gone: nothing ran
    _run_and_restart(rt, attempt, clock)
    for fd in attempt.fds.values():
        if fd != lock_fd:
            os.close(fd)
    _record_outcome(rt, attempt, lock_fd, clock)


def _first_start(rt: Runtime, record: Record, lock_fd: int, clock: Clock) -> _Attempt | None:
    """The attempt with its first run started, unless a stop came first or it cannot start
    (why: in its `failure` and its log). None when the starter is gone before the job ran."""
    spec = JobSpec.from_json(record.spec)
    started = clock.wall()
    failure: str | None = None
    orders = rootorders.orders()
    identity = None
    try:
        if orders is None:
            raise CannotStart("no root part to start it (the worker was not started by gpuq-worker)")
        identity = job_identity(rt, record, orders.starter_uid == 0)
    except CannotStart as e:
        failure = f"cannot start: {e}"
    gpus = ",".join(map(str, record.gpus)) or "none (CPU only)"
    header = (
        f"==> gpuq job {record.id} · attempt {record.attempt} · host {rt.host} · "
        f"GPUs {gpus} · started {_stamp(started)}\n==> command: {command_shown(spec.command)}\n"
    )
    attempt = _Attempt(record, spec, started, identity, orders, _keeper_fds(rt, record, lock_fd), failure=failure)
    if _StopSignal.requested:
        attempt.stop = _stop_order(rt, record.id)  # stopped before it could start
    elif failure is None and orders is not None:
        limits = LimitWatch(record, clock.mono())
        try:
            attempt.keeper, attempt.companion = _start(rt, orders, record, spec, identity, attempt.fds, header)
            attempt.log_fd, attempt.job_pid, attempt.limits = attempt.keeper.log_fd, attempt.keeper.pid, limits
        except CannotStart as e:
            attempt.failure, attempt.log_fd = f"cannot start: {e}", e.log_fd
        except wire.StarterGone:
            # Nothing ran: without a `started` marker the next worker requeues the attempt.
            _mark(lock_fd, Marker(Phase.UNSTARTED, record.claim))
            for name, fd in attempt.fds.items():
                if name != "lock":
                    os.close(fd)
            return None
    if attempt.failure:
        _log(attempt.log_fd, f"==> gpuq: {attempt.failure}\n")
    return attempt


def _run_and_restart(rt: Runtime, a: _Attempt, clock: Clock) -> None:
    """Wait for the run under way to end; a service (spec.restart) is started again after its
    backoff, until a run ends for good, a stop or fencing comes, or it cannot start again."""
    quick_failures = 0
    # A keeper never comes without the orders that started it and the limits that watch it:
    # the last two tests only say so to the type checker.
    while a.keeper is not None and a.orders is not None and a.limits is not None:
        run_started = clock.mono()
        status, a.stop, a.fenced = _wait(rt, a.record, a.keeper, a.limits, a.companion, clock)
        a.keeper.log_fd = None  # ours from now on, for gpuq's own lines
        a.keeper.close()
        a.sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        a.exit_code = None if a.sig is not None else os.WEXITSTATUS(status)
        if a.companion is not None:
            a.companion.remove()
        crash_point("supervisor:exited")
        if clock.mono() - run_started >= HEALTHY_S:
            quick_failures = 0
        delay = restart_delay(a.spec.restart, a.exit_code, a.sig, bool(a.stop or a.fenced), quick_failures)
        if delay is None:
            break
        quick_failures += 1
        ended_as = f"exit {a.exit_code}" if a.sig is None else f"killed by signal {a.sig}"
        _log(a.log_fd, f"==> {ended_as} · restart {a.record.restarts + 1} in {delay:g}s (restart: {a.spec.restart})\n")
        a.stop, a.fenced = _backoff(rt, a.record, delay, clock)
        if a.stop or a.fenced:
            break  # stopped while waiting: the last run's result stands
        a.record = _restarted(rt, a.record)
        a.keeper = None
        try:
            header = f"==> restart {a.record.restarts} · started {_stamp(clock.wall())}\n"
            a.keeper, a.companion = _start(rt, a.orders, a.record, a.spec, a.identity, a.fds, header)
            if a.log_fd is not None and a.keeper.log_fd is not None:
                os.close(a.log_fd)
            a.log_fd, a.job_pid = a.keeper.log_fd if a.keeper.log_fd is not None else a.log_fd, a.keeper.pid
        except CannotStart as e:
            a.failure = f"cannot restart: {e}"
            if e.log_fd is not None:
                os.close(e.log_fd)
        except wire.StarterGone as e:
            a.failure = f"cannot restart: {e}"


def _record_outcome(rt: Runtime, a: _Attempt, lock_fd: int, clock: Clock) -> None:
    """Once nothing of the job runs: free its GPUs for the worker, then record the result (or
    leave it to the worker: fenced, preempted, or refused by the shared disk)."""
    ended = clock.wall()
    log = rt.layout.job_log(a.record.id)
    # A job that goes back to its place keeps its GPUs until it is there (no ENDED marker):
    # freed now, they would go to a job behind it.
    retry = _retry(rt, a, log)
    if retry is None:
        _mark_ended(rt, a, lock_fd)
    # A result still ours is written unless a takeover is close: writing takes milliseconds,
    # while stopping a running job needs grace_s (hence the earlier limit in _wait).
    a.fenced = a.fenced or fence_reason(rt, a.record, RECORD_FENCE_FRACTION)
    outcome = _log_outcome(a, ended, log, None if a.fenced else retry)
    if a.fenced:
        if retry is not None:
            _mark_ended(rt, a, lock_fd)
        _leave_fenced(rt, a.record, lock_fd, a.fenced)
        return
    if retry is not None:
        # Not an end either: this host's worker puts the spec back at its old place, changed
        # as the rule says, once the lock is free (recovery.settle_gone).
        _mark(lock_fd, Marker(Phase.RETRY, a.record.claim, why=retry.why, result=retry.changes))
        poke(rt.local_dir, WAKE_JOB_ENDED)
        return
    stop = a.stop
    if stop and stop.cause is StopCause.PREEMPT:
        stop = _stop_order(rt, a.record.id)  # a cancel during the grace outranks the preemption
    if stop and stop.cause is StopCause.PREEMPT:
        # Not an end: this host's worker puts the spec back at its old place once the lock
        # is free (recovery.settle_gone), and the next attempt runs with GPUQ_PREEMPTED=1.
        _mark(lock_fd, Marker(Phase.PREEMPTED, a.record.claim, why=f"{stop.reason}; {outcome}"))
        poke(rt.local_dir, WAKE_JOB_ENDED)
        return
    final = ended_as(stop, a.exit_code)
    result = {
        "started_at": a.started,
        "ended_at": ended,
        "exit_code": a.exit_code,
        "signal": a.sig,
        "reason": stop.reason if stop else a.failure,
        "cause": stop.cause if stop else None,
        "job_pid": a.job_pid,
        **read_gpu_usage(rt.usage_path(a.record.id)),
        **(a.limits.usage.result(a.limits.cpu_s) if a.limits is not None else {}),
    }
    try:
        transition(rt.layout, a.record, final, rt.host, **result)
    except OSError as e:
        # The shared disk refused the record: keep the result in the local marker, where this
        # host's worker finds it once the lock is free, and records it as soon as it can.
        marked = {"state": final.value, **result, "cause": stop.cause.value if stop else None}
        _mark(lock_fd, Marker(Phase.UNRECORDED, a.record.claim, why=str(e), result=marked))
        return
    crash_point("supervisor:recorded")
    finish_local(rt, a.record)
    crash_point("supervisor:cleaned")
    poke(rt.local_dir, WAKE_JOB_ENDED)


def _mark_ended(rt: Runtime, a: _Attempt, lock_fd: int) -> None:
    """Nothing of the job runs any more: its worker may start the next job on its GPUs now,
    while this supervisor writes the record (a durable write: milliseconds, every job)."""
    _mark(lock_fd, Marker(Phase.ENDED, a.record.claim))
    poke(rt.local_dir, WAKE_JOB_ENDED)
    crash_point("supervisor:ended")


def _retry(rt: Runtime, a: _Attempt, log: Path) -> Retry | None:
    """A retry rule's answer for an attempt that ran and failed on its own (run/retry.py)."""
    failed = a.exit_code not in (None, 0) or a.sig is not None
    if a.stop or a.fenced or not failed or a.limits is None:
        return None
    tail = _tail(log, a.log_fd).decode("utf-8", "replace")
    return retry_after(failure_of(rt, a.record, a.exit_code, a.sig, tail), rt.settings)


def _log_outcome(a: _Attempt, ended: float, log: Path, retry: Retry | None = None) -> str:
    """The attempt's last lines in its log, which is closed then: how it ended, a note on a
    shell's exit code (also the record's reason), why the result is not recorded, a retry.
    Returns how it ended, as said there but for the stop's reason (its caller says that). A
    venv, conda or setup line that failed is the record's reason too, as the prelude said it in
    the log (status's NOTE)."""
    if a.exit_code and not a.stop and (a.spec.venv or a.spec.conda or a.spec.setup):
        a.failure = a.failure or prelude_failure(_tail(log, a.log_fd))
    outcome = (
        f"exit {a.exit_code}"
        if a.exit_code is not None
        else f"killed by signal {a.sig}"
        if a.sig is not None
        else a.failure or "not started"
    )
    said = f"{outcome} ({a.stop.reason})" if a.stop else outcome
    _log(a.log_fd, f"==> {said} · duration {format_duration(ended - a.started)} · ended {_stamp(ended)}\n")
    if not a.stop and (note := shell_exit_note(a.exit_code, a.spec, a.identity)):
        _log(a.log_fd, f"==> gpuq: {note}\n")
        a.failure = a.failure or note  # the record's reason: status and show say it too
    if a.fenced:
        _log(a.log_fd, f"==> gpuq: this attempt's result is not recorded ({a.fenced})\n")
    elif retry is not None:
        _log(a.log_fd, f"==> gpuq: {retry.why}\n")
    if a.log_fd is not None:
        os.close(a.log_fd)
    return outcome


def _keeper_fds(rt: Runtime, record: Record, lock_fd: int) -> dict[str, int]:
    """What the keeper of each run of this attempt is handed: the claimed spec (the root part
    checks its owner), the job lock (held, so the lock lives as long as the job), the lease it
    fences by and the exit file it reports into. Each but the lock is opened here, never
    through a link; one that cannot be opened is left out (the root part refuses a start without
    the spec where that matters; a keeper without a lease fences nothing, the supervisor still does)."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fds = {"lock": lock_fd}
    for name, path, how in (
        ("spec", rt.layout.claims / (record.claim or "-"), os.O_RDONLY),
        ("lease", rt.lease_path, os.O_RDONLY),
        ("exit", rt.exit_path(record.id), os.O_RDWR | os.O_CREAT | os.O_TRUNC),
    ):
        try:
            fds[name] = os.open(path, how | flags, 0o600)
        except OSError:
            pass
    return fds


def _start(
    rt: Runtime,
    orders: rootorders.Orders,
    record: Record,
    spec: JobSpec,
    identity: Identity | None,
    fds: dict[str, int],
    header: str,
) -> tuple[rootorders.Keeper, Companion | None]:
    """One run of the job under a keeper; for a run its launch wrapper started (a container),
    also what it holds outside its process tree, stopped and removed with the job. Marks the
    keeper in the lock file: the worker counts the GPU memory of its process tree as the
    job's. Raises CannotStart."""
    launch = build_launch(rt, record, spec, identity)
    if "exit" in fds:
        os.ftruncate(fds["exit"], 0)  # a service's earlier run's: never read as this run's
    if launch.wrapped is not None:
        header += f"==> {launch.wrapped.how}: {shlex.join(launch.argv)}\n"
    keeper = start_run(rt, orders, record, launch, fds, header)
    ticks = process_start_ticks(keeper.keeper_pid)
    _mark(fds["lock"], Marker(Phase.RUNNING, record.claim, keeper_pid=keeper.keeper_pid, keeper_ticks=ticks))
    if launch.wrapped is None or launch.wrapped.companion is None:
        return keeper, None
    owner_uid = identity.uid if identity is not None else None
    tools = CompanionTools(
        lambda env: as_owner(rt, orders, record, fds.get("spec"), env),
        lambda text: _log(keeper.log_fd, f"==> gpuq: {text}\n"),
        lambda pid: _note_outside(rt, record, pid, owner_uid),
    )
    return keeper, launch.wrapped.companion(tools)


def _note_outside(rt: Runtime, record: Record, pid: int, owner_uid: int | None) -> None:
    """A process of the job's outside its tree (a container's main process), as its client
    (the owner's) said: its GPU memory counts as the job's only if it is the owner's process
    (a member's client could name anyone's)."""
    try:
        if owner_uid is not None and os.stat(f"/proc/{pid}").st_uid != owner_uid:
            return
    except OSError:
        return
    write_outside_pid(rt, record, pid)


def _backoff(rt: Runtime, record: Record, delay: float, clock: Clock) -> tuple[Stop | None, str | None]:
    """Wait before a service's restart; a stop request or fencing ends the wait.
    Returns (the stop, fence reason)."""
    end = clock.mono() + delay
    _StopSignal.armed = True
    try:
        while (left := end - clock.mono()) > 0:
            if _StopSignal.requested:
                return _stop_order(rt, record.id), None
            time.sleep(min(left, 1.0))
            fenced = fence_reason(rt, record)
            if fenced:
                return None, fenced
    except _StopRequested:
        return _stop_order(rt, record.id), None
    finally:
        _StopSignal.armed = False
    return None, None


def _restarted(rt: Runtime, record: Record) -> Record:
    """The running record with one restart more, for `gpuq status` (best effort: a full disk
    must not stop the service)."""
    updated = replace(record, restarts=record.restarts + 1)
    try:
        write_record(rt.layout, updated)
    except OSError:
        pass
    return updated


LOG_TAIL_BYTES = 4096


def _tail(log: Path, log_fd: int | None) -> bytes:
    """The last bytes of the job's log, read only where the file at `log` is the very one the
    job wrote (`log_fd`'s): never a file put in its place, a link or a FIFO. b"" otherwise."""
    if log_fd is None:
        return b""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""  # not readable by the queue's account: no note, as before
    try:
        st, job_wrote = os.fstat(fd), os.fstat(log_fd)
        if (st.st_dev, st.st_ino) != (job_wrote.st_dev, job_wrote.st_ino):
            return b""
        return os.pread(fd, LOG_TAIL_BYTES, max(0, st.st_size - LOG_TAIL_BYTES))
    finally:
        os.close(fd)


def _log(log_fd: int | None, text: str) -> None:
    """gpuq's own lines in the job's log (where the job could open it): best effort, a full
    disk must not lose the job."""
    if log_fd is None:
        return
    try:
        io_fault("write:log")
        os.write(log_fd, text.encode())
    except OSError:
        pass


def _leave_fenced(rt: Runtime, record: Record, lock_fd: int, why: str) -> None:
    """Write nothing shared. Taken over: only clean up here. Still ours, but this host was
    cut off: say so in the marker, and this host's worker settles the attempt as lost (and
    requeues it while retries last) once the lock is free. The files cleaned up are named
    by the handed record, never by the one on disk."""
    if not _still_recorded(rt, record):
        finish_local(rt, record)  # our claim, renamed by the host that took over, is gone already
    else:
        _mark(lock_fd, Marker(Phase.FENCED, record.claim, why=why))


def _stop_order(rt: Runtime, job_id: str) -> Stop:
    """The stop its worker asked for (run/joblocal.request_stop); a SIGTERM without one is a cancel."""
    try:
        return Stop.decode(rt.stop_path(job_id).read_bytes())
    except OSError:
        return Stop(StopCause.CANCEL, "cancelled")


def _wait(
    rt: Runtime,
    record: Record,
    keeper: rootorders.Keeper,
    limits: LimitWatch,
    companion: Companion | None,
    clock: Clock,
) -> tuple[int, Stop | None, str | None]:
    """Wait for the job's keeper to report its end. A stop request (SIGTERM with a stop file)
    stops it: TERM, grace, KILL, each sent by the keeper to the job's process group. So does an
    overrun limit (run/limits.py), and fencing, checked every lost_after_s / 10 (the keeper
    fences on its own too, should this supervisor be gone). A companion (a container, which
    its runtime's daemon holds) is stopped and killed with the job. What is due when is the `JobWatch`'s to
    say, from the time read here. Returns (wait status, the stop, fence reason)."""
    watch = JobWatch.starting(clock.mono(), rt.lost_after_s)
    fenced: str | None = None
    grace = stop_grace_s(record.spec.get("grace_s"), bool(record.spec.get("preemptible")), rt.grace_s)
    limits.watch(keeper.keeper_pid)

    def stop_with(stop: Stop, grace_s: float) -> None:
        _StopSignal.armed = False  # one stop is enough; later SIGTERMs change nothing
        if watch.stopping(stop, grace_s, clock.mono()):
            if stop.at_once:  # `gpuq cancel --now`: KILL alone
                keeper.signal(signal.SIGKILL)
                if companion is not None:
                    companion.kill()
                return
            keeper.signal(signal.SIGTERM)
            if companion is not None:
                companion.stop(grace_s)

    _StopSignal.armed = True
    try:
        while True:
            try:
                if _StopSignal.requested and watch.stop is None:
                    raise _StopRequested()
                companion_at = companion.due_at if companion is not None else NEVER
                wake_at = watch.wake_at(limits.next_at, companion_at)  # NEVER once killed: its exit is next
                timeout = watch.look_within(None if wake_at == NEVER else max(0.0, wake_at - clock.mono()))
                ended = keeper.ended(timeout)
                if ended is not None:
                    if ended.get("fenced") and not fenced:
                        fenced = "fenced: this host's heartbeat is too old, other hosts may take its jobs over"
                    if isinstance(cpu_s := ended.get("cpu_s"), (int, float)):  # a service's runs add up
                        limits.cpu_s = (limits.cpu_s or 0.0) + cpu_s
                    return ended["status"], watch.stop, fenced
                now = clock.mono()
                if watch.in_grace and _stop_order(rt, record.id).at_once:
                    watch.kill_now(now)  # `gpuq cancel --now` during the grace
                if watch.kill_due(now):
                    keeper.signal(signal.SIGKILL)
                    if companion is not None:
                        companion.kill()
                if companion is not None and now >= companion.due_at:
                    companion.tick(now)
                if watch.limits_due(now, limits.next_at) and (breach := limits.breach(now)):
                    stop_with(breach, grace)
                if watch.fence_check_due(now) and (fenced := fence_reason(rt, record)):
                    stop_with(Stop(StopCause.FENCE, fenced), rt.grace_s)  # config grace: fits lost_after_s
            except _StopRequested:
                _StopSignal.armed = False
                if watch.stop is None:
                    stop_with(_stop_order(rt, record.id), grace)
    finally:
        _StopSignal.armed = False
