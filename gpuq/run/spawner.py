"""Starting supervisors from a small, long-lived process instead of from the worker.

Forking the worker for every job costs it twice: its page tables are copied, and then every
page it touches as it goes on is copied again (copy-on-write), after every fork. The spawner
is a fresh interpreter that loads only what a supervisor needs; the worker sends it one line
per job and never forks. A supervisor that has recorded its job tells the spawner it is
free, and the spawner hands it the next job instead of forking again (a fork and the pages
it copies cost milliseconds per job): one job at a time per supervisor, always.

Protocol: two pipes, one line each way per launch. The worker writes the running record
first, then sends the job's id, a space and the whole record as JSON: what to run and as whom
travel only this way, from the worker, never through a file others might swap
(run/supervise.py). The spawner takes the job's lock and passes the locked descriptor and the
record, as the bytes it got, to a free supervisor (or to a new one it forks), which parses it
(a parse and a dump per job cost the spawner more than the rest of a launch); the lock is held
from then on. The spawner answers {"id", "pid"} or {"id", "error"}.
Until the answer comes, the worker counts the job as starting. The spawner exits when the
worker's end of the pipe closes (the worker stopped or died); free supervisors then exit,
busy ones finish their job first.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuq.host import rootorders
from gpuq.host.audit import install_if_asked
from gpuq.host.faults import crash_point
from gpuq.host.hostinfo import open_to_append
from gpuq.host.proctree import reap_children
from gpuq.model.names import JOB_ID_RE
from gpuq.model.record import Record
from gpuq.run.joblocal import Runtime, try_lock
from gpuq.run.supervise import become_supervisor, prepare, supervise

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger("gpuq.worker")
REAP_EVERY_S = 1.0
FREE_FOR_AT_MOST_S = 60.0  # a supervisor free this long is told to exit
JOBS_PER_SUPERVISOR = 100  # then it exits: bounds whatever a long life accumulates
READY = b"r"  # supervisor -> spawner: my job is recorded, I am free
CHUNK = 32768  # a record travels to a supervisor in messages this big


class Spawner:
    """The worker's end: start the spawner on first use (and again if it died), send
    launches, collect answers without ever blocking on them."""

    def __init__(self, rt: Runtime, log_path: Path) -> None:
        self.rt, self.log_path = rt, log_path
        self.proc: "subprocess.Popen | None" = None
        self.starting: set[str] = set()  # job ids sent, not yet answered
        self.failed: set[str] = set()  # job ids no supervisor took: the next pass settles them
        self._partial = b""

    def launch(self, record: Record) -> None:
        line = f"{record.id} {json.dumps(record.to_json())}\n".encode()
        for _ in range(2):  # a spawner that died since the last launch is started again once
            proc = self._ensure()
            try:
                os.write(proc.stdin.fileno(), line)  # type: ignore[union-attr]
                self.starting.add(record.id)
                return
            except BrokenPipeError:
                self._lost()
        self.failed.add(record.id)
        log.error("cannot start the spawner; %s stays recorded as running until settled", record.id)

    def collect(self) -> None:
        """Read whatever answers have arrived (every pass: unread answers would fill the pipe
        and stall the spawner)."""
        if self.proc is None:
            return
        while True:
            try:
                chunk = os.read(self.proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
            except BlockingIOError:
                break
            if not chunk:
                self._lost()
                return
            self._partial += chunk
        *lines, self._partial = self._partial.split(b"\n")
        for line in lines:
            answer = json.loads(line)
            self.starting.discard(answer["id"])
            if "error" in answer:
                self.failed.add(answer["id"])
                log.error("could not start the supervisor of %s: %s", answer["id"], answer["error"])

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait()
            self.proc = None

    def _ensure(self) -> "subprocess.Popen":
        import subprocess  # here: the spawner itself never needs it, and forks faster without it

        if self.proc is None:
            package_parent = str(Path(__file__).resolve().parents[2])
            boot = f"import sys; sys.path.insert(0, {package_parent!r}); from gpuq.run.spawner import serve; serve()"
            stderr = self._open_log()
            orders = rootorders.orders()
            try:
                # Its own session: a Ctrl-C meant for a foreground worker must not reach it.
                # Isolated (-I) in `/`: nothing on its sys.path but the stdlib and gpuq's code.
                # The queue's root as its one argument, unread: `ps` shows which queue a
                # spawner (and each supervisor forked from it) serves.
                self.proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", boot, str(self.rt.layout.root)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    start_new_session=True,
                    cwd="/",
                    pass_fds=(orders.fileno(),) if orders is not None else (),
                )
            finally:
                if stderr is not None:
                    os.close(stderr)
            os.set_blocking(self.proc.stdout.fileno(), False)  # type: ignore[union-attr]
            # The runtime settings, as its first line: an argument would show them (the admin's
            # container_env among them) to every local user in `ps`.
            self.proc.stdin.write((json.dumps(self.rt.to_json()) + "\n").encode())  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.proc

    def _open_log(self) -> int | None:
        """The spawner's stderr: the worker's own log, never through a link or into a file not
        the worker's (None: the worker's stderr, with a warning)."""
        try:
            return open_to_append(
                self.log_path, 0o644, os.geteuid(), f"worker log {self.log_path}", "this worker's user"
            )[0]
        except OSError as e:
            log.warning("the spawner writes to the worker's stderr: %s", e.strerror or e)
            return None

    def _lost(self) -> None:
        """The spawner is gone. Launches it never answered are settled through the job lock:
        a supervisor that started holds it; otherwise the attempt never started."""
        if self.proc is not None:
            log.warning("the spawner (pid %d) exited; starting a new one at the next launch", self.proc.pid)
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()  # type: ignore[union-attr]
            self.proc.wait()
        self.proc, self.starting, self._partial = None, set(), b""


@dataclass
class _Supervisor:
    pid: int
    sock: socket.socket  # the spawner's end of a SOCK_SEQPACKET pair
    free_since: float | None = None  # None while it runs a job


def serve() -> None:
    """The spawner process: launch each job read from stdin, answer on stdout."""
    install_if_asked()  # the tests' proof of the privilege boundary: it records nothing unless root
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    partial = b""
    while b"\n" not in partial:  # the first line: the runtime settings (Spawner._ensure)
        chunk = os.read(stdin, 65536)
        if not chunk:
            return
        partial += chunk
    first, partial = partial.split(b"\n", 1)
    rt = Runtime.from_json(json.loads(first))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prepare()
    # No collector passes here or in the supervisors: a pass touches every object, and each
    # page it touches is copied in whichever process touched it (copy-on-write after fork).
    gc.disable()
    gc.freeze()
    supervisors: dict[int, _Supervisor] = {}  # by the spawner's socket descriptor
    while True:
        ready, _, _ = select.select([stdin, *supervisors], [], [], 0 if b"\n" in partial else REAP_EVERY_S)
        reap_children()
        _note_free(supervisors, [fd for fd in ready if fd != stdin])
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                return  # the worker is gone; free supervisors see our sockets close and exit
            partial += chunk
        *lines, partial = partial.split(b"\n")  # (the first read may have brought some already)
        for line in lines:
            raw_id, _, message = line.partition(b" ")
            job_id = raw_id.decode("ascii", "replace")  # checked in _launch
            answer = _launch(rt, job_id, message, supervisors)
            os.write(stdout, (json.dumps({"id": job_id, **answer}) + "\n").encode())


def _note_free(supervisors: dict[int, _Supervisor], readable: list[int]) -> None:
    now = time.monotonic()
    for fd in readable:
        try:
            message = supervisors[fd].sock.recv(16)
        except OSError:
            message = b""
        if message == READY:
            supervisors[fd].free_since = now
        else:  # it exited (or broke the protocol): forget it
            supervisors.pop(fd).sock.close()
    for fd, sup in list(supervisors.items()):
        if sup.free_since is not None and now - sup.free_since > FREE_FOR_AT_MOST_S:
            supervisors.pop(fd).sock.close()  # it reads EOF and exits


def _launch(rt: Runtime, job_id: str, message: bytes, supervisors: dict[int, _Supervisor]) -> dict[str, object]:
    """Job `job_id`, its record the JSON `message`, to a free supervisor or a new one."""
    if not JOB_ID_RE.match(job_id):  # it names the lock file: a path, whatever the line held
        return {"error": f"not a job id: {job_id!r}"}
    try:
        lock_fd = os.open(rt.lock_path(job_id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        return {"error": f"cannot open the job lock: {e}"}
    try:
        if not try_lock(lock_fd):
            # Being settled right now, or a stale copy of this attempt still runs: run nothing;
            # the worker settles the record through the lock.
            return {"error": "the job lock is held by another process"}
        if os.fstat(lock_fd).st_size:  # no `started` marker left from an earlier attempt
            os.ftruncate(lock_fd, 0)  # (only then: on ext4 a truncate is a journal transaction)
        crash_point("spawner:locked")
        for fd, sup in list(supervisors.items()):
            if sup.free_since is None:
                continue
            try:
                _send_job(sup.sock, message, lock_fd)
            except OSError:
                supervisors.pop(fd).sock.close()  # exited meanwhile
                continue
            sup.free_since = None
            return {"pid": sup.pid}
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the new supervisor: never return into the spawner's loop
            code = 1
            try:
                code = _supervisor_loop(rt, theirs, Record.from_json(json.loads(message)), lock_fd)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        supervisors[ours.fileno()] = _Supervisor(pid, ours)
        return {"pid": pid}
    finally:
        os.close(lock_fd)  # the supervisor has its own copy, and with it the lock


def _send_job(sock: socket.socket, message: bytes, lock_fd: int) -> None:
    """A job for a free supervisor: its size with the lock's descriptor, then the record in
    CHUNK-sized messages (a record with a large spec is bigger than one datagram may be)."""
    socket.send_fds(sock, [str(len(message)).encode()], [lock_fd])
    for start in range(0, len(message), CHUNK):
        sock.send(message[start : start + CHUNK])


def _receive_job(sock: socket.socket) -> tuple[Record, int] | None:
    """The next job from the spawner: (record, lock descriptor), or None when told to exit
    (EOF) or sent something this protocol does not have."""
    header, fds, _, _ = socket.recv_fds(sock, 64, 1)
    if not header or len(fds) != 1 or not header.isdigit():
        for fd in fds:
            os.close(fd)
        return None
    size, message = int(header), bytearray()
    while len(message) < size:
        part = sock.recv(CHUNK)
        if not part:
            os.close(fds[0])
            return None
        message += part
    return Record.from_json(json.loads(message)), fds[0]


def _supervisor_loop(rt: Runtime, sock: socket.socket, record: Record, lock_fd: int) -> int:
    """A supervisor's life: the job it was forked for, then whatever the spawner hands it
    while it is free, up to JOBS_PER_SUPERVISOR jobs."""
    become_supervisor(keep_fds=(sock.fileno(), lock_fd))
    for served in range(1, JOBS_PER_SUPERVISOR + 1):
        supervise(rt, record, lock_fd)
        if served == JOBS_PER_SUPERVISOR:
            break
        try:
            sock.send(READY)
            job = _receive_job(sock)
        except OSError:
            break  # the spawner is gone
        if job is None:
            break
        record, lock_fd = job
    return 0
