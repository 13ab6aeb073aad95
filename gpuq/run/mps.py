"""NVIDIA MPS control daemons, one per GPU that runs MPS jobs (config gpu_sharing: mps).

A job that is an MPS client (model/sharing.py) talks to the control daemon of its GPU
through that daemon's pipe directory; the daemon starts an MPS server as the job's user, and
the kernels of the jobs on the GPU then run side by side. Each daemon has its own pipe and
log directories, `<local_dir>-mps/<GPU index>/{pipe,log}`: beside the worker's private local
directory, readable by the jobs' users (they connect there), writable only by the worker's
account. Nothing about a daemon is kept in memory but when its GPU emptied: what runs is
read back from its pid file, so a daemon left by a worker that crashed is found, kept while
jobs recorded on its GPU still run (their supervisors outlive the worker), and stopped once
none does. A daemon stops `LINGER_S` after its GPU's last MPS job ended (a stream of short
jobs would otherwise start one per job) and when the worker stops with the GPU empty.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuq.host.hostinfo import UnsafePath, ensure_private_dir

log = logging.getLogger("gpuq.worker")
CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # the daemon writes it into its pipe directory
LINGER_S = 10.0
START_WAIT_S = 10.0  # for the daemon's pid file after `-d`
STOP_WAIT_S = 10.0  # for `quit` to end it, before SIGKILL
RETRY_AFTER_S = 60.0  # after a daemon failed to start: its GPU's jobs are time-sliced meanwhile
SOCKET_PATH_MAX = 100  # a UNIX socket's path is at most 107 bytes; the daemon adds its names


class MpsError(Exception):
    """A daemon could not be started; the message says why and what to do."""


@dataclass
class MpsDaemons:
    """The daemons of one worker's GPUs. `control`: the control program (None: not found)."""

    base: Path  # <local_dir>-mps
    control: str | None = field(default_factory=lambda: shutil.which(CONTROL))
    emptied_at: dict[int, float] = field(default_factory=dict)  # GPU index -> when its last MPS job ended
    failed_at: dict[int, float] = field(default_factory=dict)  # GPU index -> when its daemon last failed to start
    last_error: str | None = None

    @classmethod
    def beside(cls, local_dir: Path) -> "MpsDaemons":
        return cls(Path(f"{local_dir}-mps"))

    def pipe_dir(self, index: int) -> Path:
        return self.base / str(index) / "pipe"

    def problem(self) -> str | None:
        """Why MPS cannot be used on this box, or None (doctor and the heartbeat say it)."""
        return self._setup_problem() or self.last_error

    def _setup_problem(self) -> str | None:
        if self.control is None:
            return f"{CONTROL} is not on the worker's PATH (it comes with the NVIDIA driver's compute utilities)"
        longest = len(str(self.pipe_dir(99))) + len("/control")
        if longest > SOCKET_PATH_MAX:
            return (
                f"its pipe directories under {self.base} make socket paths of {longest} characters, over "
                f"{SOCKET_PATH_MAX}: set local_dir in config.yaml to a shorter path"
            )
        return None

    def running(self) -> dict[int, int]:
        """GPU index -> pid of each daemon alive now (as its pid file says)."""
        alive = {}
        for index in self._indices():
            pid = self._pid(index)
            if pid is not None:
                alive[index] = pid
        return alive

    def ensure(self, index: int, uuid: str) -> Path:
        """The pipe directory of GPU `index`'s daemon, started if it is not running."""
        self.emptied_at.pop(index, None)
        if self._pid(index) is not None:
            return self.pipe_dir(index)
        if (why := self._setup_problem()) is not None:
            raise MpsError(why)
        if time.monotonic() - self.failed_at.get(index, -RETRY_AFTER_S) < RETRY_AFTER_S:
            # A control program that hangs would hold every start here up to START_WAIT_S.
            raise MpsError(f"{self.last_error} (tried again {RETRY_AFTER_S:g} s after the last failure)")
        try:
            ensure_private_dir(self.base, "the MPS directory", others_read=True)
            self._clear(index)  # a crashed daemon's sockets
            pipe = ensure_private_dir(self.pipe_dir(index), "an MPS pipe directory", others_read=True)
            logs = ensure_private_dir(self.base / str(index) / "log", "an MPS log directory", others_read=True)
        except (OSError, UnsafePath) as e:
            raise self._failed(index, f"cannot make its directories: {e}") from None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": uuid,  # the daemon's server sees only this GPU
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        try:
            done = subprocess.run(
                [self.control or CONTROL, "-d"],
                env=env,
                capture_output=True,
                timeout=START_WAIT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise self._failed(index, f"{CONTROL} -d: {e}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).decode(errors="replace").strip()[:300]
            raise self._failed(index, f"{CONTROL} -d exited {done.returncode}: {said or 'no message'}")
        deadline = time.monotonic() + START_WAIT_S
        while self._pid(index) is None:
            if time.monotonic() > deadline:
                raise self._failed(index, f"{CONTROL} -d wrote no {PID_FILE} in {pipe} within {START_WAIT_S:g} s")
            time.sleep(0.02)
        self.last_error = None
        self.failed_at.pop(index, None)
        log.info("MPS control daemon started for GPU %d (%s)", index, pipe)
        return pipe

    def settle(self, wanted: set[int], now: float, linger_s: float = LINGER_S) -> None:
        """Stop each daemon whose GPU has had no MPS job for `linger_s` (0: at once)."""
        for index in self._indices():
            if index in wanted:
                self.emptied_at.pop(index, None)
                continue
            since = self.emptied_at.setdefault(index, now)
            if now - since >= linger_s:
                self.stop(index)
                self.emptied_at.pop(index, None)

    def stop(self, index: int) -> None:
        """`quit` to the daemon (it ends its servers), SIGKILL if it does not end; its
        directories go with it."""
        pid = self._pid(index)
        if pid is not None:
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(index)),
            }
            try:
                subprocess.run(
                    [self.control or CONTROL], input=b"quit\n", env=env, capture_output=True, timeout=STOP_WAIT_S
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                log.warning("MPS control daemon of GPU %d: quit failed (%s)", index, e)
            deadline = time.monotonic() + STOP_WAIT_S
            while self._pid(index) == pid and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._pid(index) == pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            log.info("MPS control daemon of GPU %d stopped", index)
        self._clear(index)

    def _indices(self) -> list[int]:
        try:
            return sorted(
                int(e.name) for e in os.scandir(self.base) if e.name.isdigit() and e.is_dir(follow_symlinks=False)
            )
        except OSError:
            return []

    def _pid(self, index: int) -> int | None:
        """The daemon's pid if it runs: its pid file (in a directory only this account can
        change), and a process of that pid that is the control program (not a reused pid)."""
        try:
            fd = os.open(self.pipe_dir(index) / PID_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            text = os.read(fd, 32).strip()
        finally:
            os.close(fd)
        if not text.isdigit():
            return None
        pid = int(text)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            return None
        return pid if not zombie and os.path.basename(argv0).decode(errors="replace").startswith(CONTROL) else None

    def _clear(self, index: int) -> None:
        shutil.rmtree(self.base / str(index), ignore_errors=True)

    def _failed(self, index: int, why: str) -> MpsError:
        self.last_error, self.failed_at[index] = why, time.monotonic()
        return MpsError(why)
