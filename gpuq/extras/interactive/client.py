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
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from gpuq.cli import build_parser
from gpuq.cli.common import open_layout, read_config
from gpuq.cli.requests import run_request
from gpuq.cli.submit import cmd_submit
from gpuq.extras.interactive import wire
from gpuq.extras.interactive.terminal import Interrupted, MemberSide, Terminal
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
        with contextlib.suppress(Interrupted):
            _say(f"gpuq {verb}: {job_id} broke off the session: {e}; `gpuq logs {job_id}` says why")
        return 1
    finally:
        listener.close()
        path.unlink(missing_ok=True)
        if made:
            os.rmdir(directory)


def _interrupted(signum: int, frame: object) -> None:
    """The first ending signal ends the session; the others are ignored from then on: a
    closing terminal sends SIGHUP, then its shell SIGTERM, and the second interrupted the
    cancel of the first (the job was left pending, or lost half-cancelled)."""
    _ignore_ending_signals()
    raise Interrupted(signum)


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
    with contextlib.suppress(Interrupted):  # (said if it can be)
        _say(said.getvalue().rstrip() or f"\ngpuq {verb}: cancelled {job_id}")
    return status


def _say(text: str) -> None:
    """A line on our stderr; where it is gone (a closed terminal: EIO; a closed pipe: EPIPE),
    the session is over as if by SIGHUP or SIGPIPE, and nothing more is written there."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError as e:
        sys.stderr = open(os.devnull, "w")  # (the interpreter's last flush too)
        raise Interrupted(signal.SIGPIPE if isinstance(e, BrokenPipeError) else signal.SIGHUP) from None


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
    submit = build_parser("submit")  # its own parser: this command's has only its own verb
    ns = submit.parse_args([*argv, "--", *command], namespace=argparse.Namespace(**vars(args)))
    ns.parser = submit
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
            with contextlib.suppress(Interrupted):  # (said if it can be: the job is over)
                _say(f"gpuq {verb}: {job_id} {state} before it could attach: {safe_text(str(why))}")
            return 1
        line = f"{job_id} is starting on {job.get('host')}" if state == "running" else _waiting(job)
        if line != said:
            _say(f"gpuq {verb}: {line}")
            said = line


def _waiting(job: dict[str, Any]) -> str:
    reason = job.get("reason") or "in the queue"
    position = f" (#{job['position']} in the queue)" if job.get("position") else ""
    return f"{job.get('id')} waits{position}: {safe_text(str(reason))}; Ctrl-C cancels it"
