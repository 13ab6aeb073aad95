"""Starting supervisors from a small, long-lived process instead of from the worker.

Forking the worker for every job costs it twice: its page tables are copied, and then every
page it touches as it goes on is copied again (copy-on-write), after every fork. The spawner
is a fresh interpreter that loads only what a supervisor needs; the worker sends it one line
per job and never forks.

Protocol: two pipes, one JSON line each way per launch. The worker writes the running record
first, then sends it. The spawner takes the job's lock, forks the supervisor, which inherits
the locked descriptor (so the lock is held from the supervisor's first instant), and answers
{"id", "pid"} or {"id", "error"}. Until the answer comes, the worker counts the job as
starting. The spawner exits when the worker's end of the pipe closes (the worker stopped or
died); the supervisors it forked live on in their own sessions.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from .spool import Record
from .supervise import Runtime, supervisor_main, try_lock

log = logging.getLogger("gpuq.worker")
REAP_EVERY_S = 1.0


class Spawner:
    """The worker's end: start the spawner on first use (and again if it died), send
    launches, collect answers without ever blocking on them."""

    def __init__(self, rt: Runtime, log_path: Path) -> None:
        self.rt, self.log_path = rt, log_path
        self.proc: subprocess.Popen | None = None
        self.starting: set[str] = set()     # job ids sent, not yet answered
        self._partial = b""

    def launch(self, record: Record) -> None:
        line = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        for _ in range(2):  # a spawner that died since the last launch is started again once
            proc = self._ensure()
            try:
                os.write(proc.stdin.fileno(), line)  # type: ignore[union-attr]
                self.starting.add(record.id)
                return
            except BrokenPipeError:
                self._lost()
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
                log.error("could not start the supervisor of %s: %s", answer["id"], answer["error"])

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait()
            self.proc = None

    def _ensure(self) -> subprocess.Popen:
        if self.proc is None:
            package_parent = str(Path(__file__).resolve().parent.parent)
            boot = f"import sys; sys.path.insert(0, {package_parent!r}); from gpuq.spawner import serve; serve()"
            with open(self.log_path, "ab") as stderr:
                # Its own session: a Ctrl-C meant for a foreground worker must not reach it.
                self.proc = subprocess.Popen([sys.executable, "-c", boot, json.dumps(self.rt.to_json())],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=stderr, start_new_session=True)
            os.set_blocking(self.proc.stdout.fileno(), False)  # type: ignore[union-attr]
        return self.proc

    def _lost(self) -> None:
        """The spawner is gone. Launches it never answered are settled through the job lock:
        a supervisor that started holds it; otherwise the attempt never started."""
        if self.proc is not None:
            log.warning("the spawner (pid %d) exited; starting a new one at the next launch", self.proc.pid)
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()  # type: ignore[union-attr]
            self.proc.wait()
        self.proc, self.starting, self._partial = None, set(), b""


def serve() -> None:
    """The spawner process: launch each record read from stdin, answer on stdout."""
    rt = Runtime.from_json(json.loads(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # No collector passes here or in the supervisors: a pass touches every object, and each
    # page it touches is copied in whichever process touched it (copy-on-write after fork).
    gc.disable()
    gc.freeze()
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    partial = b""
    while True:
        ready, _, _ = select.select([stdin], [], [], REAP_EVERY_S)
        _reap()
        if not ready:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            return  # the worker is gone
        *lines, partial = (partial + chunk).split(b"\n")
        for line in lines:
            record = Record.from_json(json.loads(line))
            answer = _launch(rt, record)
            os.write(stdout, (json.dumps({"id": record.id, **answer}) + "\n").encode())


def _launch(rt: Runtime, record: Record) -> dict[str, object]:
    try:
        lock_fd = os.open(rt.lock_path(record.id), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        return {"error": f"cannot open the job lock: {e}"}
    try:
        if not try_lock(lock_fd):
            # Being settled right now, or a stale copy of this attempt still runs: run nothing;
            # the worker settles the record through the lock.
            return {"error": "the job lock is held by another process"}
        os.ftruncate(lock_fd, 0)  # no `started` marker left from an earlier attempt
        pid = os.fork()
        if pid == 0:  # the supervisor: never return into the spawner's loop
            code = 1
            try:
                code = supervisor_main(rt, record, lock_fd)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        return {"pid": pid}
    finally:
        os.close(lock_fd)  # the supervisor keeps its copy, and with it the lock


def _reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
