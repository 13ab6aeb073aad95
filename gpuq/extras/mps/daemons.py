"""NVIDIA MPS control daemons, one per GPU that runs MPS jobs (config gpu_sharing: mps).

A job that is an MPS client (model/sharing.py) talks to the control daemon of its GPU
through that daemon's pipe directory; the daemon starts an MPS server as the job's user, and
the kernels of the jobs on the GPU then run side by side. Each daemon has its own pipe and
log directories, `<local_dir>-mps/<GPU index>/{pipe,log}`: beside the worker's private local
directory (which the jobs' users cannot enter), readable by them (they connect there),
writable only by the worker's account. Nothing in that tree is read, signalled or removed
until the worker has verified it is its own (`open`): a member could have made it, or a link
by its name, before the worker's first start. Nothing about a daemon is kept in memory but
when its GPU emptied: what runs is read back from its pid file, so a daemon left by a worker
that crashed is found, kept while jobs recorded on its GPU still run (their supervisors
outlive the worker), and stopped once none does, whatever gpu_sharing says by then. A daemon
stops `LINGER_S` after its GPU's last MPS job ended (a stream of short jobs would otherwise
start one per job) and when the worker stops with the GPU empty. Its log directory stays for
whoever looks into a failure.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuq.host import rootorders, wire
from gpuq.host.hostinfo import UnsafePath, ensure_private_dir

log = logging.getLogger("gpuq.worker")
CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"  # the daemon writes it into its pipe directory
LINGER_S = 10.0
START_WAIT_S = 5.0  # for `-d` to return and the daemon's pid file to appear: it runs inside a pass
QUIT_WAIT_S = 3.0  # for `quit` to be taken, then as long again for the daemon to end before SIGKILL
RETRY_AFTER_S = 60.0  # after a daemon failed to start: this box's MPS jobs are time-sliced meanwhile
SOCKET_PATH_MAX = 100  # a UNIX socket's path is at most 107 bytes; the daemon adds its names


class MpsError(Exception):
    """A daemon could not be started; the message says why and what to do."""


@dataclass
class MpsDaemons:
    """The daemons of one worker's GPUs. `control`: the control program (None: not found).
    `root`: the root part, where the worker is the queue's account and the starter is root:
    it starts and stops the daemons as root (a daemon of the queue account's would serve only
    that account's jobs), in directories of root's; the worker only reads their pid files."""

    base: Path  # <local_dir>-mps
    control: str | None = field(default_factory=lambda: shutil.which(CONTROL))
    root: rootorders.Orders | None = None
    emptied_at: dict[int, float] = field(default_factory=dict)  # GPU index -> when its last MPS job ended
    failed_at: float | None = None  # when a daemon last failed to start (any GPU: one program for all)
    last_error: str | None = None
    unsafe: str | None = None  # why `base` is not the worker's own: nothing in it is touched
    opened: bool = False  # `base` verified (and made, if MPS is on)

    @classmethod
    def beside(cls, local_dir: Path, root: rootorders.Orders | None = None) -> "MpsDaemons":
        return cls(Path(f"{local_dir}-mps"), root=root)

    @property
    def owner(self) -> int:
        """Whose the daemons and their directories are: root's through the root part, else ours."""
        return 0 if self.root is not None else os.geteuid()

    def open(self, create: bool) -> None:
        """Verify `base` before anything in it is read: a directory of this account's that
        nobody else can change, on a path nobody else can swap (hostinfo.ensure_private_dir);
        made if `create` (MPS on), else only an existing one is looked at (daemons a worker
        with MPS left behind are still stopped)."""
        if not create and not os.path.lexists(self.base):
            return
        if self.root is not None:  # the root part makes it, root's: trusted once it is
            self.opened = True
            return
        try:
            ensure_private_dir(self.base, "the MPS directory", others_read=True)
        except (UnsafePath, OSError) as e:
            self.unsafe = str(e)
            return
        self.opened = True

    def pipe_dir(self, index: int) -> Path:
        return self.base / str(index) / "pipe"

    def problem(self) -> str | None:
        """Why MPS cannot be used on this box, or None (doctor and the heartbeat say it)."""
        return self._setup_problem() or self.last_error

    def _setup_problem(self) -> str | None:
        if self.unsafe is not None:
            return self.unsafe
        if self.control is None and self.root is None:  # the root part looks on its own PATH
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
        return {index: pid for index in self._indices() if (pid := self._pid(index)) is not None}

    def ensure(self, index: int, uuid: str) -> Path:
        """The pipe directory of GPU `index`'s daemon, started if it is not running."""
        self.emptied_at.pop(index, None)
        if (why := self._setup_problem()) is not None:
            raise MpsError(why)
        if self.root is None and not self._trusted():  # the root part checks its own directories
            raise MpsError(f"{self.base} was not verified as this worker's own")
        if self._pid(index) is not None:
            return self.pipe_dir(index)
        if self.failed_at is not None and time.monotonic() - self.failed_at < RETRY_AFTER_S:
            # A control program that hangs would hold every start up to START_WAIT_S.
            raise MpsError(f"{self.last_error} (tried again {RETRY_AFTER_S:g} s after the last failure)")
        if self.root is not None:
            try:
                pipe = Path(self.root.mps("start", index, uuid))
            except (wire.Refused, wire.StarterGone) as e:
                raise self._failed(f"the root part did not start it: {e}") from None
            self.last_error = self.failed_at = None
            log.info("MPS control daemon started for GPU %d by the root part (%s)", index, pipe)
            return pipe
        try:
            shutil.rmtree(self.pipe_dir(index), ignore_errors=True)  # a crashed daemon's sockets
            pipe = ensure_private_dir(self.pipe_dir(index), "an MPS pipe directory", others_read=True)
            logs = ensure_private_dir(self.base / str(index) / "log", "an MPS log directory", others_read=True)
        except (OSError, UnsafePath) as e:
            raise self._failed(f"cannot make its directories: {e}") from None
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": uuid,  # the daemon's server sees only this GPU
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        deadline = time.monotonic() + START_WAIT_S
        code, said = self._run(["-d"], env, None, START_WAIT_S)
        if code is None:
            raise self._failed(f"{CONTROL} -d did not return within {START_WAIT_S:g} s")
        if code != 0:
            raise self._failed(f"{CONTROL} -d exited {code}: {said or 'no message'}")
        while self._pid(index) is None:
            if time.monotonic() > deadline:
                raise self._failed(f"{CONTROL} -d wrote no {PID_FILE} in {pipe} within {START_WAIT_S:g} s")
            time.sleep(0.02)
        self.last_error = self.failed_at = None
        log.info("MPS control daemon started for GPU %d (%s)", index, pipe)
        return pipe

    def settle(self, wanted: set[int], now: float, linger_s: float = LINGER_S, most: int | None = 1) -> None:
        """Stop each daemon whose GPU has had no MPS job for `linger_s` (0: at once), at most
        `most` of them (None: all, as the worker stops): a stop that hangs costs up to twice
        QUIT_WAIT_S, and a pass that stopped every GPU's would stall the heartbeat that long."""
        for index in self._indices():
            if index in wanted or not self.pipe_dir(index).exists():
                self.emptied_at.pop(index, None)
                continue
            since = self.emptied_at.setdefault(index, now)
            if now - since >= linger_s and (most is None or most > 0):
                self.stop(index)
                self.emptied_at.pop(index, None)
                most = None if most is None else most - 1

    def stop(self, index: int) -> None:
        """`quit` to the daemon (it ends its servers), SIGKILL if it does not end; its pipe
        directory goes with it (its log directory stays)."""
        if not self._trusted():
            return
        if self.root is not None:
            try:
                self.root.mps("quit", index)
                log.info("MPS control daemon of GPU %d stopped by the root part", index)
            except (wire.Refused, wire.StarterGone) as e:
                self.last_error = f"the root part did not stop the MPS daemon of GPU {index}: {e}"
                log.warning("%s", self.last_error)
            return
        pid = self._pid(index)
        if pid is not None:
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir(index)),
            }
            if self._run([], env, b"quit\n", QUIT_WAIT_S)[0] is None:
                self.last_error = f"the MPS control daemon of GPU {index} did not take `quit` within {QUIT_WAIT_S:g} s"
                log.warning("%s", self.last_error)
            deadline = time.monotonic() + QUIT_WAIT_S
            while self._pid(index) == pid and time.monotonic() < deadline:
                time.sleep(0.02)
            if self._pid(index) == pid:  # still the control program, by its pid file in our directory
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            log.info("MPS control daemon of GPU %d stopped", index)
        shutil.rmtree(self.pipe_dir(index), ignore_errors=True)

    def _run(self, args: list[str], env: dict[str, str], stdin: bytes | None, timeout: float) -> tuple[int | None, str]:
        """Run the control program: (exit code or None past `timeout`, what it said). Its
        output goes to a file, not a pipe: the daemon `-d` leaves behind may hold a pipe
        open for its life. Past the timeout its whole process group is killed."""
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.Popen(
                    [self.control or CONTROL, *args],
                    env=env,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                )
            except OSError as e:
                return 127, str(e)
            try:
                if stdin is not None:
                    proc.stdin.write(stdin)  # type: ignore[union-attr]
                    proc.stdin.close()  # type: ignore[union-attr]
                code: int | None = proc.wait(timeout=timeout)
            except (subprocess.TimeoutExpired, OSError):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()
                code = None
            out.seek(0)
            return code, out.read(300).decode(errors="replace").strip()

    def _trusted(self, *below: str) -> bool:
        """`base` verified at `open` and still this account's own directory, nobody else's to
        change; so is each directory `below` it along the way (base/0, base/0/pipe): a member
        who planted them before an admin made `base` the worker's must not be trusted either."""
        if not self.opened:
            return False
        path = self.base
        for part in ("", *below):
            path = path / part if part else path
            try:
                st = os.lstat(path)
            except OSError:
                return False
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != self.owner or st.st_mode & 0o022:
                return False
        return True

    def _indices(self) -> list[int]:
        if not self._trusted():
            return []
        try:
            return sorted(
                int(e.name)
                for e in os.scandir(self.base)
                if e.name.isascii() and e.name.isdigit() and self._trusted(e.name)
            )
        except OSError:
            return []

    def _pid(self, index: int) -> int | None:
        """The daemon's pid if it runs: its pid file (in a directory only this account can
        change, checked), and a process of that pid, of this account, that is the control
        program (not a reused pid)."""
        if not self._trusted(str(index), "pipe"):
            return None
        try:
            fd = os.open(self.pipe_dir(index) / PID_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            text = os.read(fd, 32).strip()
        except OSError:
            return None
        finally:
            os.close(fd)
        if not (text.isascii() and text.isdigit()):
            return None
        pid = int(text)
        try:
            if os.stat(f"/proc/{pid}").st_uid != self.owner:
                return None
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0]
            with open(f"/proc/{pid}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            return None
        return pid if not zombie and os.path.basename(argv0).decode(errors="replace").startswith(CONTROL) else None

    def _failed(self, why: str) -> MpsError:
        self.last_error, self.failed_at = why, time.monotonic()
        return MpsError(why)
