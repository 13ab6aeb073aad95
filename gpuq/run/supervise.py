"""A job under its supervisor, and stopping it.

The supervisor is forked by the spawner (see run/spawner.py), in its own session as a child
subreaper (so grandchildren stay its own). It receives each job already holding the job's
liveness lock (which the job inherits, so the kernel releases it only when both are gone),
runs the job, waits, and writes the result. It runs one job at a time, and may be handed
another once it has recorded the last. It outlives the worker; a restarted worker
reattaches through the records and the locks.

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

import ctypes
import functools
import json
import os
import select
import signal
import time
from dataclasses import replace
from pathlib import Path

from gpuq.host.clock import Clock
from gpuq.host.faults import crash_point, io_fault, wall_time
from gpuq.host.hostinfo import process_start_ticks
from gpuq.host.proctree import kill_leftovers, signal_group
from gpuq.host.usage import read_gpu_usage
from gpuq.host.wake import WAKE_JOB_ENDED, poke
from gpuq.model.config import FENCE_FRACTION, RECORD_FENCE_FRACTION
from gpuq.model.record import Record
from gpuq.model.spec import JobSpec
from gpuq.model.states import State
from gpuq.model.stops import Stop, StopCause
from gpuq.model.units import format_duration
from gpuq.run.containers import ContainerControl
from gpuq.run.joblocal import Runtime, finish_local, lease_age
from gpuq.run.jobwatch import NEVER, JobWatch
from gpuq.run.launch import (
    CannotStart,
    forget_spawned,
    inherited_environment,
    job_identity,
    open_log,
    shell_exit_note,
    start_run,
)
from gpuq.run.limits import LimitWatch
from gpuq.sched.restarts import HEALTHY_S, restart_delay
from gpuq.spool.store import forget_kept, read_record, transition, write_record

PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.05  # how often an old kernel without pidfd_open looks whether the job exited


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
    descriptors but `keep_fds`, a child subreaper, and the stop signal."""
    os.setsid()
    _close_inherited_fds(keep_fds)
    devnull = os.open(os.devnull, os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(devnull, std)
    os.close(devnull)
    try:
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # type: ignore[union-attr]
    except AttributeError:
        pass  # not Linux: orphans go to init; the process group is still killed
    # Whatever the worker was started with (cron, a shell's background job ignores SIGQUIT)
    # must not reach jobs: every disposition back to its default, then ours. Handlers, not
    # SIG_IGN, for the signals we shrug off: exec resets handlers, so jobs get the defaults.
    for sig in signal.valid_signals():
        if sig < signal.SIGRTMIN and sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, _StopSignal.handler)
    signal.signal(signal.SIGINT, _shrug)
    signal.signal(signal.SIGHUP, _shrug)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored, as Python has them; reset for the job at spawn
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
        try:
            forget_kept(rt.layout, record.id)
        except OSError:
            pass  # best effort: a requeue of this attempt writes both anew
        crash_point("supervisor:owned")
        _mark(lock_fd, {"claim": record.claim})
        crash_point("supervisor:marked")
        _run_and_record(rt, record, lock_fd, clock or Clock())
    finally:
        _StopSignal.stop_path = None
        os.close(lock_fd)
        os.chdir("/")  # the job's workdir must not stay pinned by an idle supervisor


def _mark(lock_fd: int, marker: dict) -> None:
    """The `started` marker, in the locked file: one small write over the one before, padded
    with spaces to its length (JSON allows them), so nothing of it is left. No truncate: on
    ext4 each one is a journal transaction, three a job (a lock file's cycle measured 136-184
    µs with them, 19-25 µs without: docs/benchmarks.md). A reader between the writes sees a
    torn marker as no marker (a truncate gave it an empty file). Local and only meaningful
    for this boot: no fsync."""
    data = json.dumps(
        {"supervisor_pid": os.getpid(), "ticks": process_start_ticks(os.getpid()), "t": wall_time(), **marker}
    ).encode()
    os.pwrite(lock_fd, data.ljust(os.fstat(lock_fd).st_size), 0)


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


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def prepare() -> None:
    """Load, in the spawner, what every supervisor needs: forks inherit it ready."""
    inherited_environment()
    _libc()


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t))


def _run_and_record(rt: Runtime, record: Record, lock_fd: int, clock: Clock) -> None:
    spec = JobSpec.from_json(record.spec)
    started = clock.wall()
    failure: str | None = None
    try:
        identity = job_identity(rt, record, os.geteuid())
    except CannotStart as e:
        failure, identity = f"cannot start: {e}", None
    try:
        log_fd = open_log(rt.layout.job_log(record.id), identity)
    except PermissionError as e:  # not the owner's plain file: planted, never written through
        failure, log_fd = f"cannot start: {e.strerror}", os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:  # a full or failing disk: the job still runs, and its result is recorded
        log_fd = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    gpus = ",".join(map(str, record.gpus)) or "none (CPU only)"
    _log(
        log_fd,
        f"==> gpuq job {record.id} · attempt {record.attempt} · host {rt.host} · "
        f"GPUs {gpus} · started {_stamp(started)}\n==> command: {spec.command_text()}\n",
    )
    stop: Stop | None = None
    exit_code: int | None = None
    sig: int | None = None
    job_pid = None
    container: ContainerControl | None = None
    if _StopSignal.requested:
        stop = _stop_order(rt, record.id)  # stopped before it could start
    elif failure is None:
        limits = LimitWatch(record, clock.mono())
        try:
            job_pid, container = start_run(rt, record, spec, identity, lock_fd, log_fd, _log)
        except CannotStart as e:
            failure = f"cannot start: {e}"
        except OSError as e:
            failure = f"cannot start: {e.strerror}: {e.filename}"
    if failure:
        _log(log_fd, f"==> gpuq: {failure}\n")
    fenced: str | None = None
    spawned = job_pid
    quick_failures = 0
    while job_pid is not None:
        run_started = clock.mono()
        status, stop, fenced = _wait(rt, record, job_pid, limits, container, clock)
        forget_spawned(job_pid, status)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        exit_code = None if sig is not None else os.WEXITSTATUS(status)
        kill_leftovers(job_pid, rt.grace_s)
        if container is not None:
            container.remove()
        crash_point("supervisor:exited")
        if clock.mono() - run_started >= HEALTHY_S:
            quick_failures = 0
        delay = restart_delay(spec.restart, exit_code, sig, bool(stop or fenced), quick_failures)
        if delay is None:
            break
        quick_failures += 1
        ended_as = f"exit {exit_code}" if sig is None else f"killed by signal {sig}"
        _log(log_fd, f"==> {ended_as} · restart {record.restarts + 1} in {delay:g}s (restart: {spec.restart})\n")
        stop, fenced = _backoff(rt, record, delay, clock)
        if stop or fenced:
            break  # stopped while waiting: the last run's result stands
        record = _restarted(rt, record)
        _log(log_fd, f"==> restart {record.restarts} · started {_stamp(clock.wall())}\n")
        try:
            job_pid, container = start_run(rt, record, spec, identity, lock_fd, log_fd, _log)
        except CannotStart as e:
            failure, job_pid = f"cannot restart: {e}", None
        except OSError as e:
            failure, job_pid = f"cannot restart: {e.strerror}: {e.filename}", None
    ended = clock.wall()
    # Nothing of the job runs any more: its worker may start the next job on its GPUs now,
    # while this supervisor writes the record (a durable write: milliseconds, every job).
    _mark(lock_fd, {"claim": record.claim, "ended": True})
    poke(rt.local_dir, WAKE_JOB_ENDED)
    crash_point("supervisor:ended")
    # A result still ours is written unless a takeover is close: writing takes milliseconds,
    # while stopping a running job needs grace_s (hence the earlier limit in _wait).
    fenced = fenced or fence_reason(rt, record, RECORD_FENCE_FRACTION)
    outcome = (
        f"exit {exit_code}"
        if exit_code is not None
        else f"killed by signal {sig}"
        if sig is not None
        else failure or "not started"
    )
    if stop:
        outcome += f" ({stop.reason})"
    _log(log_fd, f"==> {outcome} · duration {format_duration(ended - started)} · ended {_stamp(ended)}\n")
    if not stop and (note := shell_exit_note(exit_code, spec, identity)):
        _log(log_fd, f"==> gpuq: {note}\n")
        failure = failure or note  # the record's reason: status and show say it too
    if fenced:
        _log(log_fd, f"==> gpuq: this attempt's result is not recorded ({fenced})\n")
    os.close(log_fd)
    if fenced:
        _leave_fenced(rt, record, lock_fd, fenced)
        return
    if stop and stop.cause is StopCause.PREEMPT:
        stop = _stop_order(rt, record.id)  # a cancel during the grace outranks the preemption
    if stop and stop.cause is StopCause.PREEMPT:
        # Not an end: this host's worker puts the spec back at its old place once the lock
        # is free (recovery.settle_gone), and the next attempt runs with GPUQ_PREEMPTED=1.
        _mark(lock_fd, {"claim": record.claim, "preempted": f"{stop.reason}; {outcome}"})
        poke(rt.local_dir, WAKE_JOB_ENDED)
        return
    final = (stop.cause.ends_as or State.CANCELLED) if stop else State.DONE if exit_code == 0 else State.FAILED
    result = {
        "started_at": started,
        "ended_at": ended,
        "exit_code": exit_code,
        "signal": sig,
        "reason": stop.reason if stop else failure,
        "cause": stop.cause if stop else None,
        "job_pid": job_pid,
        **read_gpu_usage(rt.usage_path(record.id)),
        **(limits.usage.result() if spawned else {}),
    }
    try:
        transition(rt.layout, record, final, rt.host, **result)
    except OSError as e:
        # The shared disk refused the record: keep the result in the local marker, where this
        # host's worker finds it once the lock is free, and records it as soon as it can.
        marked = {"state": final.value, **result, "cause": stop.cause.value if stop else None}
        _mark(lock_fd, {"claim": record.claim, "result": marked, "unrecorded": str(e)})
        return
    crash_point("supervisor:recorded")
    finish_local(rt, record)
    crash_point("supervisor:cleaned")
    poke(rt.local_dir, WAKE_JOB_ENDED)


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


def _log(log_fd: int, text: str) -> None:
    """gpuq's own lines in the job's log: best effort, a full disk must not lose the job."""
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
        _mark(lock_fd, {"claim": record.claim, "fenced": why})


def _stop_order(rt: Runtime, job_id: str) -> Stop:
    """The stop its worker asked for (run/joblocal.request_stop); a SIGTERM without one is a cancel."""
    try:
        return Stop.decode(rt.stop_path(job_id).read_bytes())
    except OSError:
        return Stop(StopCause.CANCEL, "cancelled")


def _wait(
    rt: Runtime, record: Record, pid: int, limits: LimitWatch, container: ContainerControl | None, clock: Clock
) -> tuple[int, Stop | None, str | None]:
    """Wait for the job. A stop request (SIGTERM with a stop file) stops it: TERM, grace,
    KILL. So does an overrun limit (run/limits.py), and fencing, checked every lost_after_s / 10.
    A container is stopped and killed with its client (its runtime's daemon holds it). What is
    due when is the `JobWatch`'s to say, from the time read here.
    Returns (wait status, the stop, fence reason)."""
    watch = JobWatch.starting(clock.mono(), rt.lost_after_s)
    fenced: str | None = None
    grace = record.spec.get("grace_s")
    grace = rt.grace_s if grace is None else grace

    def stop_with(stop: Stop, grace_s: float) -> None:
        _StopSignal.armed = False  # one stop is enough; later SIGTERMs change nothing
        if watch.stopping(stop, grace_s, clock.mono()):
            signal_group(pid, signal.SIGTERM)
            if container is not None:
                container.stop(grace_s)

    try:
        pidfd: int | None = os.pidfd_open(pid)  # readable once the job has exited
    except (AttributeError, OSError):
        pidfd = None  # an old kernel: poll
    _StopSignal.armed = True
    try:
        while True:
            try:
                if _StopSignal.requested and watch.stop is None:
                    raise _StopRequested()
                lookup_at = container.lookup_at if container is not None else NEVER
                wake_at = watch.wake_at(limits.next_at, lookup_at)  # NEVER once killed: its exit is next
                timeout = None if wake_at == NEVER else max(0.0, wake_at - clock.mono())
                if pidfd is not None:
                    select.select([pidfd], [], [], timeout)
                else:
                    time.sleep(POLL_S if timeout is None else min(timeout, POLL_S))
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return status, watch.stop, fenced
                now = clock.mono()
                if watch.kill_due(now):
                    signal_group(pid, signal.SIGKILL)
                    if container is not None:
                        container.kill()
                if container is not None and now >= container.lookup_at:
                    container.try_lookup(now)
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
        if pidfd is not None:
            os.close(pidfd)
