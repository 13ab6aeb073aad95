"""`gpuq run` and `gpuq shell`: a job that waits in the queue like any other, then runs
attached to the member's terminal, on the box they typed it on (Slurm's `srun --pty` and
`salloc`).

The member's side listens on a Unix socket in a directory only they may enter, submits the job
with `attach:` naming it and `hosts:` this box, and shows why it waits until the job's end of
the session (attach.py, run by the worker as this member) connects; Ctrl-C while it waits
cancels the job. Then it carries its terminal to the job and back (raw, for a terminal) and
exits as the command did. Nothing of the member's environment is written into the spec (the
team reads specs): it travels over the socket.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import secrets
import select
import signal
import socket
import stat
import sys
import tempfile
import termios
import threading
import time
import tty
from pathlib import Path
from typing import Any, Iterator

from gpuq.cli.common import open_layout, read_config
from gpuq.cli.requests import run_request
from gpuq.cli.submit import cmd_submit
from gpuq.extras.interactive import wire
from gpuq.model.config import Config
from gpuq.model.text import safe_text
from gpuq.model.units import format_mib, parse_size_mib
from gpuq.single_instance import this_host
from gpuq.spool.layout import Layout
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats
from gpuq.views.show import find_job

POLL_S = 1.0
FINAL = frozenset({"done", "failed", "cancelled", "timeout", "lost", "rejected"})


def cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("gpuq run: give the command after --, e.g. gpuq run --gpu-mem 10GiB -- python eval.py", file=sys.stderr)
        return 2
    return _session(args, command)


def cmd_shell(args: argparse.Namespace) -> int:
    if sys.stdin is None or not sys.stdin.isatty():
        print("gpuq shell: needs a terminal; for a command, use gpuq run -- COMMAND", file=sys.stderr)
        return 2
    return _session(args, [os.environ.get("SHELL") or "/bin/sh"], shell=True)


# Ctrl-C, a closed terminal, a kill: each ends the session (a waiting job is cancelled).
ENDING_SIGNALS = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}


def _session(args: argparse.Namespace, command: list[str], shell: bool = False) -> int:
    verb = "shell" if shell else "run"
    layout = open_layout(args)
    config = read_config(layout)
    idle_s = config.shell_idle_timeout_s if shell else None  # a command may be quiet for hours
    host = this_host()
    if (problem := _box_problem(layout, config, host, args)) is not None:
        print(f"gpuq {verb}: {problem}", file=sys.stderr)
        return 2
    try:
        directory, made = _private_dir()
    except OSError as e:
        print(f"gpuq {verb}: {e}", file=sys.stderr)
        return 2
    path = directory / f"{secrets.token_hex(6)}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # A closed terminal (SIGHUP) or a kill (SIGTERM) is a Ctrl-C: the job is cancelled while it
    # waits, the terminal restored and the socket removed once attached.
    for sig in ENDING_SIGNALS:
        signal.signal(sig, _interrupted)
    job_id: str | None = None
    attached = False
    try:
        listener.bind(str(path))
        listener.listen(1)
        with _signals_held():  # one that comes meanwhile comes once the job's id is known
            job_id = _submit(args, command, host, {"socket": str(path), "idle_s": idle_s}, verb)
        if job_id is None:
            return 2
        conn = _wait(args, layout, config, listener, job_id, verb)
        if isinstance(conn, int):
            return conn
        attached = True
        with conn:
            return Terminal(conn, shell).attach()
    except KeyboardInterrupt as stop:
        status = 128 + getattr(stop, "signum", signal.SIGINT)
        if job_id is None or attached:  # attached: the job's end of the session hangs the command up
            return status
        return _cancel(args, job_id, verb, status)
    except wire.WireError as e:  # the job's end was killed mid-frame (a cancel's grace ran out)
        with contextlib.suppress(_Interrupted):
            _say(f"gpuq {verb}: {job_id} broke off the session: {e}; `gpuq logs {job_id}` says why")
        return 1
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        if made:
            os.rmdir(directory)


class _Interrupted(KeyboardInterrupt):
    """A signal that ends the session, or our own stderr gone while we wait (SIGHUP: a closed
    terminal; SIGPIPE: a closed pipe): `gpuq run` exits 128 + it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupted(signum: int, frame: object) -> None:
    """The first ending signal ends the session; the others are ignored from then on: a
    closing terminal sends SIGHUP, then its shell SIGTERM, and the second interrupted the
    cancel of the first (the job was left pending, or lost half-cancelled)."""
    _ignore_ending_signals()
    raise _Interrupted(signum)


def _ignore_ending_signals() -> None:
    for sig in ENDING_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING_SIGNALS)


def _cancel(args: argparse.Namespace, job_id: str, verb: str, status: int) -> int:
    """The waiting job cancelled, with nothing to interrupt it. Said if it can be."""
    _ignore_ending_signals()
    said = io.StringIO()  # what the cancel says, kept from a terminal that may be gone (EIO: exit 1)
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        run_request(args, "cancel", (job_id,), shown_as="cancel", quiet=True)
    with contextlib.suppress(_Interrupted):  # (said if it can be)
        _say(said.getvalue().rstrip() or f"\ngpuq {verb}: cancelled {job_id}")
    return status


def _say(text: str) -> None:
    """A line on our stderr; where it is gone (a closed terminal: EIO; a closed pipe: EPIPE),
    the session is over as if by SIGHUP or SIGPIPE, and nothing more is written there."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError as e:
        sys.stderr = open(os.devnull, "w")  # (the interpreter's last flush too)
        raise _Interrupted(signal.SIGPIPE if isinstance(e, BrokenPipeError) else signal.SIGHUP) from None


def _box_problem(layout: Layout, config: Config, host: str, args: argparse.Namespace) -> str | None:
    """Why no GPU of this box could ever hold the job, with where it could run; None if one can."""
    gpus = 1 if args.gpus is None else args.gpus
    try:
        mem = parse_size_mib(args.gpu_mem) if args.gpu_mem else None
    except ValueError as e:
        return f"--gpu-mem {args.gpu_mem!r}: {e}"
    now = time.time()
    fits = []
    here = None
    largest = 0
    for hb in load_heartbeats(layout):
        if not heartbeat_alive(hb, now):
            continue
        usable = [g["mem_total_mib"] - config.gpu_mem_reserve_mib for g in hb.get("gpus") or []]
        largest = max([largest, *usable])
        ok = len(usable) >= gpus and (mem is None or sum(u >= mem for u in usable) >= gpus)
        if hb.get("host") == host:
            here = ok
        elif ok:
            fits.append(str(hb.get("host")))
    ask = f"{gpus} GPU{'s' if gpus != 1 else ''}" + (f" with {format_mib(mem)} each" if mem else "")
    elsewhere = (
        f"{', '.join(sorted(fits))} could: ssh {sorted(fits)[0]}, then run it there"
        if fits
        else f"no box of the queue could. Fix: ask for less (the largest GPU holds {format_mib(largest)} usable)"
        if largest
        else "no box of the queue could"
    )
    if here is None:
        return f"no gpuq worker runs on this box ({host}); {elsewhere}"
    if not here:
        return f"no GPU on this box ({host}) can hold {ask}; {elsewhere}"
    return None


def _private_dir() -> tuple[Path, bool]:
    """A directory only this user may enter, for the socket, and whether it was made for this
    session alone (to remove after): $XDG_RUNTIME_DIR/gpuq (systemd makes the parent so), else
    /tmp/gpuq-UID, made 0700, or made so where it is ours; where that name is another's (or a
    link, or no directory), a fresh one of our own (mkdtemp): nobody can block a session."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) / "gpuq" if runtime else Path(f"/tmp/gpuq-{os.getuid()}")
    try:
        base.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return Path(tempfile.mkdtemp(prefix=f"gpuq-{os.getuid()}-")), True
    # Judged and mended on the directory opened (never through a link): a name in /tmp that
    # another user made, or pointed elsewhere, is passed over for a fresh one.
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return Path(tempfile.mkdtemp(prefix=f"gpuq-{os.getuid()}-")), True
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            return Path(tempfile.mkdtemp(prefix=f"gpuq-{os.getuid()}-")), True
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)  # ours: made private again
    finally:
        os.close(fd)
    return base, False


def _submit(args: argparse.Namespace, command: list[str], host: str, attach: dict, verb: str) -> str | None:
    """The job, submitted as `gpuq submit` would with these options (its checks and messages):
    on this box only, not preemptible, none of the environment in the spec."""
    argv = ["submit", "--hosts", host, "--export", "NONE", "-J", args.name or verb]
    for option, value in (("--gpus", args.gpus), ("--gpu-mem", args.gpu_mem), ("--time-limit", args.time_limit)):
        if value is not None:
            argv += [option, str(value)]
    for option, value in (("--cpus", args.cpus), ("--mem", args.mem), ("--priority", args.priority)):
        if value is not None:
            argv += [option, str(value)]
    ns = args.parser.parse_args([*argv, "--", *command], namespace=argparse.Namespace(**vars(args)))
    ns.attach = attach
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # submit prints only the id on stdout
        rc = cmd_submit(ns)
    job_id = out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else None
    return job_id if rc == 0 else None


def _wait(
    args: argparse.Namespace, layout: Layout, config: Config, listener: socket.socket, job_id: str, verb: str
) -> socket.socket | int:
    """The job's end of the session once it connects; or the exit status when the job ended
    without (refused, cancelled by someone, failed to start). A signal, or our stderr gone,
    ends it with KeyboardInterrupt: the caller cancels the job."""
    said = None
    member = MemberSide(listener)
    while True:
        if member.ready(POLL_S):
            conn, _ = listener.accept()
            if wire.peer_uid(conn) == os.getuid():
                return conn
            conn.close()  # (the directory is ours alone: only root could get here)
            continue
        job = find_job(layout, config, job_id) or {}
        state = job.get("state")
        if state in FINAL:
            why = job.get("reason") or state
            with contextlib.suppress(_Interrupted):  # (said if it can be: the job is over)
                _say(f"gpuq {verb}: {job_id} {state} before it could attach: {safe_text(str(why))}")
            return 1
        line = f"{job_id} is starting on {job.get('host')}" if state == "running" else _waiting(job)
        if line != said:
            _say(f"gpuq {verb}: {line}")
            said = line


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
        member's side ended, _Interrupted as SIGHUP (a terminal) or SIGPIPE (a pipe)."""
        events = dict(self.poller.poll(None if timeout_s is None else timeout_s * 1000))
        for fd, event in events.items():
            if fd in self.terminal and event & (select.POLLHUP | select.POLLERR):
                raise _Interrupted(signal.SIGHUP if self.terminal[fd] else signal.SIGPIPE)
        return self.sock.fileno() in events


def _waiting(job: dict[str, Any]) -> str:
    reason = job.get("reason") or "in the queue"
    position = f" (#{job['position']} in the queue)" if job.get("position") else ""
    return f"{job.get('id')} waits{position}: {safe_text(str(reason))}; Ctrl-C cancels it"


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
            except _Interrupted as gone:  # a terminal closed, or a reader gone, with no word to write
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
