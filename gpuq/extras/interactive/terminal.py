"""The member's side of a session once the job has connected: the terminal (or pipes) carried
to the job and back (Terminal), and the member's side watched for its end while the run waits
or relays (MemberSide): a terminal's hang-up, a pipe's reader gone. client.py submits, waits
and cancels; wire.py is the framing both ends share."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import stat
import sys
import termios
import threading
import tty
from typing import Any

from gpuq.extras.interactive import wire
from gpuq.model.text import safe_text


class Interrupted(KeyboardInterrupt):
    """A signal that ends the session, or our own stderr gone while we wait (SIGHUP: a closed
    terminal; SIGPIPE: a closed pipe): `gpuq run` exits 128 + it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class MemberSide:
    """A socket waited on, and the member's side watched meanwhile: a terminal among stdin,
    stdout and stderr (its hang-up, seen even where no SIGHUP reaches us: `setsid`, `su`), and
    stdout or stderr as a pipe or socket (its reader gone). Not stdin as a pipe: its writer may
    be done long before the job starts (`echo x | gpuq run -- cat`)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        self.terminal: dict[int, bool] = {}  # watched descriptor -> whether it is a terminal
        for fd in (0, 1, 2):
            try:
                mode = os.fstat(fd).st_mode
            except OSError:
                continue  # not open (`<&-`)
            if os.isatty(fd) or (fd and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode))):
                self.terminal[fd] = os.isatty(fd)
                self.poller.register(fd, 0)  # only its hang-up or error

    def ready(self, timeout_s: float | None) -> bool:
        """Whether the socket has something within `timeout_s` (None: wait for it). Where the
        member's side ended, Interrupted as SIGHUP (a terminal) or SIGPIPE (a pipe)."""
        events = dict(self.poller.poll(None if timeout_s is None else timeout_s * 1000))
        for fd, event in events.items():
            if fd in self.terminal and event & (select.POLLHUP | select.POLLERR):
                raise Interrupted(signal.SIGHUP if self.terminal[fd] else signal.SIGPIPE)
        return self.sock.fileno() in events


class Terminal:
    """This process's stdin, stdout and stderr carried to the job and back: its input by a
    thread of its own (the job takes it only as fast as the command reads it), its output here."""

    def __init__(self, conn: socket.socket, shell: bool) -> None:
        self.conn, self.shell = conn, shell
        self.stdin = _fd_of(sys.stdin)
        self.tty = self.stdin is not None and os.isatty(self.stdin) and sys.stdout.isatty()
        self.reader = wire.Reader(conn)
        self.sending = threading.Lock()  # the input thread's frames and a resize's, never interleaved
        self.gone = False  # the terminal closed
        self.job = "the job"

    def attach(self) -> int:
        ready = self._ready()
        self.job = safe_text(str(ready.get("job") or "the job"))
        rows, cols = _size()
        hello = {"env": dict(os.environ), "cwd": os.getcwd(), "tty": self.tty, "rows": rows, "cols": cols}
        wire.send_json(self.conn, wire.HELLO, hello)
        saved = None
        previous = signal.signal(signal.SIGWINCH, self._resized) if self.tty else None
        try:
            try:
                gpus = ready.get("gpus") or "none"
                print(f"gpuq: {ready.get('job')} runs on {ready.get('host')}, GPUs {gpus}", file=sys.stderr)
                if self.tty and self.stdin is not None:
                    saved = termios.tcgetattr(self.stdin)
                    tty.setraw(self.stdin)
            except (OSError, termios.error):  # the terminal closed already: a hang-up, as later
                self.conn.shutdown(socket.SHUT_RDWR)
                return 128 + signal.SIGHUP
            threading.Thread(target=self._send_input, daemon=True).start()
            return self._relay()
        finally:
            if self.tty:
                signal.signal(signal.SIGWINCH, previous)
            if saved is not None and self.stdin is not None:
                with contextlib.suppress(termios.error):  # (a terminal that closed has nothing to restore)
                    termios.tcsetattr(self.stdin, termios.TCSADRAIN, saved)

    def _ready(self) -> dict[str, Any]:
        while True:
            for channel, data in self.reader.read():
                if channel == wire.READY:
                    return wire.control(data)
            if self.reader.closed:
                raise wire.WireError("the job went away before it was ready")

    def _resized(self, signum: int, frame: object) -> None:
        rows, cols = _size()
        with self.sending:
            wire.send_json(self.conn, wire.WINSIZE, {"rows": rows, "cols": cols})

    def _send_input(self) -> None:
        """stdin to the job until its end (then EOF), or until the session is over. A terminal
        that ends (closed: EOF or EIO, with or without a SIGHUP reaching us) ends the session:
        the job's end hangs the command up, as ssh does."""
        try:
            while self.stdin is not None and (data := os.read(self.stdin, wire.CHUNK)):
                with self.sending:
                    wire.send(self.conn, wire.IN, data)
        except OSError:
            if not self.tty:
                return  # the session ended meanwhile: the main thread says how
        try:
            if self.tty:
                self.gone = True
                self.conn.shutdown(socket.SHUT_RDWR)
            else:
                with self.sending:
                    wire.send_json(self.conn, wire.EOF, {})
        except OSError:
            pass

    def _relay(self) -> int:
        member = MemberSide(self.conn)
        while True:
            try:
                if not member.ready(None):
                    continue
            except Interrupted as gone:  # a terminal closed, or a reader gone, with no word to write
                with contextlib.suppress(OSError):
                    self.conn.shutdown(socket.SHUT_RDWR)  # the job's end hangs the command up
                return 128 + gone.signum
            for channel, data in self.reader.read():
                if channel in (wire.OUT, wire.ERR):
                    try:
                        _write_all(1 if channel == wire.OUT else 2, data)
                    except BrokenPipeError:  # `gpuq run ... | head`: end as a pipeline's writer does
                        return 128 + signal.SIGPIPE
                    except OSError:  # a terminal that closed (EIO): the job's end hangs the command up
                        with contextlib.suppress(OSError):
                            self.conn.shutdown(socket.SHUT_RDWR)
                        return 128 + signal.SIGHUP
                elif channel == wire.NOTE:
                    self._note(str(wire.control(data).get("text", "")))
                elif channel == wire.EXIT:
                    end = wire.control(data)
                    sig, code = end.get("signal"), end.get("code")
                    return 128 + sig if type(sig) is int else code if type(code) is int else 1
            if self.reader.closed:
                if self.gone:
                    return 128 + signal.SIGHUP
                self._note(f"gpuq: {self.job} ended without saying how: `gpuq logs {self.job}` says why")
                return 1

    def _note(self, text: str) -> None:
        end = "\r\n" if self.tty else "\n"  # a raw terminal moves down a line only
        with contextlib.suppress(OSError):  # said if it can be: a closed stderr ends nothing by itself
            _write_all(2, f"{safe_text(text)}{end}".encode())


def _fd_of(stream: Any) -> int | None:
    """A standard stream's descriptor; None where the process was started without it (`<&-`)."""
    try:
        return stream.fileno() if stream is not None else None
    except (OSError, ValueError):
        return None


def _size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:  # not a terminal, or one that closed
        return 24, 80
    return size.lines, size.columns


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]
