"""The job's end of a `gpuq run` or `gpuq shell` session: what the job runs (wrapper.py puts
it around the spec's command), as the job's owner, under its keeper, with its GPUs. It connects
to the socket the member's `gpuq run` listens on (on this box; same owner, checked by the
kernel's SO_PEERCRED), takes the member's environment and directory from it, and runs the
command with its input and output carried over that socket: in a pseudo-terminal where the
member's side is a terminal (a shell, a debugger), else through pipes. The command is in the
job's process tree, so the plan counts it, its limits apply and its GPU memory is the job's.

It ends when the command ends (its exit status is the job's and `gpuq run`'s); when the member's
side goes away (the command is hung up on, as ssh does); when the job is stopped (a cancel, a
time limit: SIGTERM is passed on, the keeper's SIGKILL follows the grace); and, for a shell,
after `idle_s` with no input or output.

Run as `hooks.module_argv("extras.interactive.attach") SOCKET IDLE_S -- COMMAND...` (wrapper.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import queue
import select
import signal
import socket
import struct
import sys
import termios
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from gpuq.extras.interactive import wire

CONNECT_TIMEOUT_S = 10.0
HELLO_TIMEOUT_S = 30.0
HANGUP_GRACE_S = 2.0
INPUT_CHUNKS = 64  # frames of the member's input waiting for the command (64 KiB each at most)
DRAIN_S = 1.0  # after the command ends: what it wrote last, unless a child of it holds the output open
# What the job's own environment adds to the member's: its GPUs and gpuq's variables.
JOB_PREFIXES = ("GPUQ_", "CUDA_")


def main(argv: list[str]) -> int:
    try:
        socket_path, idle_text, dashes, *command = argv
    except ValueError:
        command, dashes = [], ""
    if dashes != "--" or not command:
        print("gpuq: usage: attach SOCKET IDLE_S -- COMMAND...", file=sys.stderr)
        return 2
    idle_s = float(idle_text) if idle_text != "-" else None
    try:
        sock = _connect(socket_path)
    except OSError as e:
        print(f"gpuq: nobody is attached: the `gpuq run` that asked for this job is gone ({e})", file=sys.stderr)
        return 1
    with sock:
        try:
            return Session(sock, command, idle_s).run()
        except (wire.WireError, OSError) as e:
            print(f"gpuq: the session broke off: {e}", file=sys.stderr)
            return 1


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(path)
        if wire.peer_uid(sock) != os.getuid():  # only the job's own owner's `gpuq run`
            raise PermissionError(f"{path} is another user's")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


@dataclass
class Session:
    sock: socket.socket
    command: list[str]
    idle_s: float | None
    reader: wire.Reader = field(init=False)
    pid: int = 0
    fds: dict[int, int] = field(default_factory=dict)  # output fd -> channel (OUT or ERR)
    stdin_fd: int | None = None  # where the member's input goes: the pty's master or a pipe
    input: "Input" = field(init=False)  # what goes there, written by a thread of its own
    tty: bool = False
    status: int | None = None  # the command's, once it ended
    early: list[tuple[int, bytes]] = field(default_factory=list)  # frames that came with the hello
    last_activity: float = 0.0
    stopping: bool = False
    released: bool = False  # a shell released after its idle time

    def __post_init__(self) -> None:
        self.reader = wire.Reader(self.sock)

    def run(self) -> int:
        wire.send_json(
            self.sock,
            wire.READY,
            {
                "job": os.environ.get("GPUQ_JOB_ID"),
                "host": os.environ.get("GPUQ_HOST"),
                "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            },
        )
        hello = self._hello()
        if hello is None:  # closed before it said hello: its terminal closed as the job started
            print("gpuq: gpuq run went away before the command started; nothing ran", file=sys.stderr)
            return 128 + signal.SIGHUP
        self._start(hello)
        # SIGTERM (a cancel, a time limit, fencing) is passed on to the command; the loop notices.
        wakeup_r, wakeup_w = os.pipe()
        os.set_blocking(wakeup_w, False)
        signal.set_wakeup_fd(wakeup_w)
        signal.signal(signal.SIGTERM, self._terminated)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.last_activity = time.monotonic()
        self._from_member(self.early)
        while self.status is None:
            self._step(wakeup_r)
        self._drain()
        code, sig = (None, -self.status) if self.status < 0 else (self.status, None)
        if self.released:  # as configured: the session's end, not the command's failure
            code, sig = 0, None
        if not self.reader.closed:
            try:
                wire.send_json(self.sock, wire.EXIT, {"code": code, "signal": sig})
            except OSError:
                pass  # gone at the last moment: the job's own status says it all the same
        return 128 + sig if sig is not None else code or 0

    def _terminated(self, signum: int, frame: object) -> None:
        """SIGTERM (a cancel, a time limit, fencing) passed on to the command at once: this
        process may be blocked sending to a member's side that is stopped (Ctrl-Z, SIGSTOP),
        and the SIGKILL after the grace must not be the first the command hears of it."""
        self._signal(signal.SIGTERM)
        self.stopping = True  # the loop says so to the member

    def _hello(self) -> dict[str, Any] | None:
        """The member's hello; what came with it (input, its end) waits in `early`. None when
        the member's side closed without one."""
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        while time.monotonic() < deadline:
            if select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))[0]:
                try:
                    frames = self.reader.read()
                except ConnectionResetError:
                    return None
                for i, (channel, data) in enumerate(frames):
                    if channel == wire.HELLO:
                        self.early = frames[i + 1 :]
                        return wire.control(data)
                if self.reader.closed:
                    return None
        raise wire.WireError("no hello from gpuq run")

    def _start(self, hello: dict[str, Any]) -> None:
        given = hello.get("env")
        env = {str(k): str(v) for k, v in given.items()} if isinstance(given, dict) else {}
        env.update({k: v for k, v in os.environ.items() if k.startswith(JOB_PREFIXES)})
        cwd = hello.get("cwd") if isinstance(hello.get("cwd"), str) else None
        self.tty = hello.get("tty") is True
        if self.tty:
            self.pid, master = pty.fork()
            if self.pid == 0:  # the child: its own session, the pty its controlling terminal
                _exec(self.command, env, cwd)
            _set_winsize(master, hello)
            self.fds, self.stdin_fd, self.input = {master: wire.OUT}, master, Input(master, close_at_end=False)
            return
        # Pipes, forked as the pty's child is (not subprocess: its Popen reaps a child that ended
        # at once when dropped, and a command not found must be said as a terminal says it).
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.setsid()  # its own session: a stop reaches what it started too
            for fd, to in ((in_r, 0), (out_w, 1), (err_w, 2)):
                os.dup2(fd, to)
            os.closerange(3, 65536)
            _exec(self.command, env, cwd)
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        self.fds, self.stdin_fd = {out_r: wire.OUT, err_r: wire.ERR}, in_w
        self.input = Input(in_w, close_at_end=True)

    def _step(self, wakeup_r: int) -> None:
        """One wait: for the member's frames (only while the command's input has room: a command
        that reads slowly holds the member's side back, never this loop), the command's output,
        a signal, or the member's side closing (POLLRDHUP, seen even while its frames wait)."""
        timeout = 1.0 if self.idle_s is None else min(1.0, self.idle_s)
        poller = select.poll()
        poller.register(wakeup_r, select.POLLIN)
        poller.register(self.sock, select.POLLRDHUP | (0 if self.input.full() else select.POLLIN))
        for fd in self.fds:
            poller.register(fd, select.POLLIN)
        events = dict(poller.poll(timeout * 1000))
        ready = {fd for fd, ev in events.items() if ev & (select.POLLIN | select.POLLHUP | select.POLLERR)}
        if wakeup_r in ready:
            os.read(wakeup_r, 512)
        if self.stopping:
            self.stopping = False
            self._send(wire.NOTE, {"text": "gpuq: the job is being stopped (cancel or limit)"})
        sock_events = events.get(self.sock.fileno(), 0)
        if sock_events & select.POLLIN:
            self._read_member()
        elif sock_events:  # closed (or broken) while its frames wait for room: gone all the same
            self._member_gone()
        for fd in [fd for fd in self.fds if fd in ready]:
            self._output(fd)
        self._reap()
        if self.idle_s is not None and self.status is None and time.monotonic() - self.last_activity > self.idle_s:
            idle = f"{self.idle_s / 60:g} min" if self.idle_s >= 60 else f"{self.idle_s:g} s"
            text = f"gpuq shell: released after {idle} without input or output (config shell_idle_timeout)"
            self._send(wire.NOTE, {"text": text})
            print(text, file=sys.stderr)
            self._hang_up()
            self.released = True

    def _read_member(self) -> None:
        try:
            frames = self.reader.read()
        except ConnectionResetError:  # gone with bytes of ours unread
            frames, self.reader.closed = [], True
        self._from_member(frames)

    def _from_member(self, frames: list[tuple[int, bytes]]) -> None:
        for channel, data in frames:
            self.last_activity = time.monotonic()
            if channel == wire.IN:
                self.input.put(data)
            elif channel == wire.WINSIZE and self.tty and self.stdin_fd is not None:
                _set_winsize(self.stdin_fd, wire.control(data))
            elif channel == wire.EOF and not self.tty:
                self.input.put(None)
        if self.reader.closed:
            self._member_gone()

    def _member_gone(self) -> None:
        """The member's terminal is gone: hang up, as ssh does."""
        self.reader.closed = True
        if self.status is None:  # (once it ended, its pid may be another's)
            verb = "gpuq shell" if self.idle_s is not None else "gpuq run"
            print(f"gpuq: {verb} went away; the command was hung up on", file=sys.stderr)
            self._hang_up()

    def _output(self, fd: int) -> None:
        try:
            data = os.read(fd, wire.CHUNK)
        except OSError:  # a pty whose other end is closed: EIO
            data = b""
        if not data:
            os.close(fd)
            del self.fds[fd]
            return
        self.last_activity = time.monotonic()
        self._send(self.fds[fd], data)

    def _send(self, channel: int, data: bytes | dict[str, Any]) -> None:
        """A frame to the member's side; one that cannot go (that side is gone: `gpuq run ...
        | head` ended) hangs the command up, as a closed terminal does."""
        if self.reader.closed:
            return
        try:
            wire.send(self.sock, channel, data if isinstance(data, bytes) else json.dumps(data).encode())
        except OSError:
            self._member_gone()

    def _reap(self) -> None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.status = os.waitstatus_to_exitcode(status)

    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_S
        while self.fds and time.monotonic() < deadline:
            ready = select.select(list(self.fds), [], [], max(0.0, deadline - time.monotonic()))[0]
            for fd in ready:
                self._output(fd)
        for fd in self.fds:
            os.close(fd)

    def _signal(self, sig: int) -> None:
        """To the command's session; to the command itself while it has none yet (just forked,
        before its setsid: a hang-up then had no one to reach, and SIGKILL ended it 2 s later)."""
        if self.pid <= 0:  # (not started: 0 would be this process's own group)
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def _hang_up(self) -> None:
        """SIGHUP to the command's session, then SIGKILL after a grace; wait for it."""
        self._signal(signal.SIGHUP)
        self._signal(signal.SIGCONT)
        deadline = time.monotonic() + HANGUP_GRACE_S
        while self.status is None and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        if self.status is None:
            self._signal(signal.SIGKILL)
            self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


class Input:
    """The member's input on its way to the command, written by a thread of its own: a command
    that reads slowly (or not at all) blocks that thread only. At most INPUT_CHUNKS frames wait;
    then the session stops reading the member's frames until there is room. None: the end of
    the input (the pipe is closed once all before it is written)."""

    def __init__(self, fd: int, close_at_end: bool) -> None:
        self.fd, self.close_at_end = fd, close_at_end
        # Unbounded, so that `put` never blocks the session: it reads no more frames once `full`,
        # and one read brings at most one socket buffer's worth past that.
        self.waiting: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._write, daemon=True).start()

    def full(self) -> bool:
        return self.waiting.qsize() >= INPUT_CHUNKS

    def put(self, data: bytes | None) -> None:
        self.waiting.put(data)

    def _write(self) -> None:
        broken = False
        while (data := self.waiting.get()) is not None:
            if not broken:
                try:
                    _write_all(self.fd, data)
                except OSError:  # the command closed its input, or ended: the rest goes nowhere
                    broken = True
        if self.close_at_end:
            os.close(self.fd)


def _exec(command: list[str], env: dict[str, str], cwd: str | None) -> None:
    """In the command's process: its directory (the member's, where it still is), then it."""
    try:
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        os.execvpe(command[0], command, env)
    except OSError as e:
        searched = f" (PATH={env.get('PATH', '')})" if "/" not in command[0] else ""
        os.write(2, f"gpuq: cannot run {command[0]}: {e.strerror}{searched}\r\n".encode())
    os._exit(127)


def _set_winsize(fd: int, size: dict[str, Any]) -> None:
    rows, cols = size.get("rows"), size.get("cols")
    if type(rows) is int and type(cols) is int and 0 < rows < 10000 and 0 < cols < 10000:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
