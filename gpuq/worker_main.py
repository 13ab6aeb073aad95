"""`python worker.py` / `gpuq-worker`: one worker per host, started by cron every minute.

A start while a worker already runs on this host exits at once, quietly, with status 0.
The first start (as root on a team's box) checks what it is about to trust, makes the box's
local directory for the queue's account, daemonizes (or stays in the foreground) and becomes
the box's starter (the root part, host/privsep.py), which runs the worker (worker_run.py) as
the queue's account. It loads no more of gpuq than that: the starter and the keepers it forks
are root, so the less they hold the better.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

from gpuq import hooks
from gpuq.host import privsep, wire
from gpuq.host.hostinfo import (
    NETWORK_FILESYSTEMS,
    UnsafePath,
    ensure_private_dir,
    filesystem_type,
    open_to_append,
)
from gpuq.host.owners import writable_by_others
from gpuq.model import config as config_mod
from gpuq.model.names import HOST_RE, ID_RULE
from gpuq.single_instance import (
    FAKE_GPUS_ENV,
    WORKER_LOCK_NAME,
    fake_gpus_dir,
    holds_lock_at,
    take_worker_lock,
    this_host,
)
from gpuq.spool import strictmodes
from gpuq.spool.layout import Layout, RootError, resolve_root


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # As it was started: `python worker.py` from the checkout, or the installed `gpuq-worker`.
    prog = os.path.basename(sys.argv[0]) or "worker.py"
    p = argparse.ArgumentParser(prog=prog, description="Run the gpuq worker of this host.")
    p.add_argument("--root", help="queue root (default: $GPUQ_ROOT, else the checkout)")
    p.add_argument(
        "--host",
        help="host name to act as (default: this machine's short name); "
        "lets tests run several stand-in boxes on one machine",
    )
    p.add_argument(
        "--fake-gpus",
        metavar="SPEC",
        help="use fake GPUs: COUNTxSIZE like 4x80GiB, or a JSON file (also $GPUQ_FAKE_GPUS)",
    )
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument(
        "--exit-when-idle",
        action="store_true",
        help="exit once nothing runs here and nothing this box could start is left (a sweep's "
        "members, released dependencies, an opportunistic job waiting out idle_after_s)",
    )
    p.add_argument("--foreground", action="store_true", help="do not daemonize; log to stderr too")
    p.add_argument("-v", "--verbose", action="store_true", help="log every decision")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, launcher_dir: str | None = None, lock_fd: int | None = None) -> int:
    """`lock_fd`: the worker lock, when worker.py could take it before loading gpuq. Started by
    cron (or by hand), this process becomes the box's starter (host/privsep.py), which runs
    the worker as the queue's account; the worker is this same main, told so by its starter."""
    args = parse_args(argv)
    try:
        layout = Layout(resolve_root(args.root, launcher_dir))
        # Its problems are the worker's to say, in its log (worker_run.py): cron's starter has
        # nowhere to say them. What the starter needs of it (local_dir) is read as far as it goes.
        config = config_mod.load(layout.config_file, [])
        account = privsep.Account.of_root(str(layout.root))
    except (RootError, config_mod.ConfigError, wire.Refused) as e:
        print(f"gpuq worker: {e}", file=sys.stderr)
        return 2
    host = args.host or this_host()
    if not HOST_RE.match(host):
        print(f"gpuq worker: --host {host!r} is not a valid host name ({ID_RULE})", file=sys.stderr)
        return 2
    if os.geteuid() == 0 and (problem := _root_problem(layout, account, launcher_dir)):
        print(f"gpuq worker: refusing to run as root:\n  {problem}", file=sys.stderr)
        return 2
    local_dir = layout.local_dir(host, config.local_dir)
    if (fs := filesystem_type(local_dir)) in NETWORK_FILESYSTEMS:
        print(
            f"gpuq worker: local_dir {local_dir} is on {fs}, a network file system: the job locks "
            f"kept there would not exclude across hosts. Fix: set local_dir in {layout.config_file} "
            f"to a local disk, e.g. /var/tmp/gpuq-{{host}}",
            file=sys.stderr,
        )
        return 2
    queue_uid = account.uid if os.geteuid() == 0 else os.geteuid()
    if (problem := local_dir_problem(local_dir, layout, queue_uid)) is not None:
        print(f"gpuq worker: {problem}", file=sys.stderr)
        return 2
    if os.geteuid() == 0 and (args.fake_gpus or os.environ.get(FAKE_GPUS_ENV)):
        # Beside the private local_dir, where the queue's account may not create: the jobs,
        # which run as their owners, read the fake GPUs there and register their use.
        try:
            ensure_private_dir(fake_gpus_dir(local_dir), "the fake GPUs' directory", others_read=True, owner=queue_uid)
        except (UnsafePath, OSError) as e:
            print(f"gpuq worker: {e}", file=sys.stderr)
            return 2
    if lock_fd is not None and not holds_lock_at(lock_fd, str(local_dir / WORKER_LOCK_NAME)):
        os.close(lock_fd)  # the early scan locked another local_dir than the config names: not ours
        lock_fd = None
    if lock_fd is None and (lock_fd := take_worker_lock(str(local_dir / WORKER_LOCK_NAME))) is None:
        return _already_running(host, args.verbose)
    if not (args.foreground or args.once):
        if problem := _cannot_start(layout, account):  # said now: a daemon's stderr goes nowhere
            print(f"gpuq worker: {problem}", file=sys.stderr)
            os.close(lock_fd)
            return 2
        if _daemonize():
            return 0  # the cron-started parent: the starter carries on (flock follows the descriptor)
    try:
        return privsep.serve(
            _worker_argv(argv, layout), account, dict(os.environ), f"{local_dir}-mps", _member_programs()
        )
    finally:
        os.close(lock_fd)


def _member_programs() -> dict[str, list[str]]:
    """The programs gpuq's extras registered to run as a member (hooks.Registry.member_programs),
    each as the starter runs it (hooks.module_argv). The starter runs only these argvs; an
    order only names one."""
    programs = {}
    for name, module in hooks.registry().member_programs.items():
        try:
            programs[name] = hooks.module_argv(module)
        except ValueError:
            continue  # not a module's name: never made into code to run
    return programs


def _worker_argv(argv: list[str] | None, layout: Layout, boot: str = "") -> list[str]:
    """The worker's command line: this interpreter, isolated (-I: no PYTHON* variables, no user
    site, no current directory on sys.path), gpuq's code by its absolute path, the same options
    with the root spelled out. `boot`: other code to run than the worker's, with gpuq's there."""
    package_parent = str(Path(__file__).resolve().parents[1])
    boot = f"import sys; sys.path.insert(0, {package_parent!r}); " + (
        boot or "from gpuq.worker_run import main; sys.exit(main(sys.argv[1:]))"
    )
    rest = list(sys.argv[1:] if argv is None else argv)
    return [sys.executable, "-I", "-c", boot, *rest, "--root", str(layout.root)]


def _cannot_start(layout: Layout, account: privsep.Account) -> str | None:
    """Why the worker could not start as the queue's account, found before this process
    becomes a daemon (whose stderr goes nowhere): cron started a worker that could not run the
    interpreter (under root's 0700 home), or not import gpuq's dependencies in isolated mode,
    and it exited 0 with no word anywhere. The worker's own start, tried: its interpreter and
    imports, as that account."""
    argv = _worker_argv([], layout, boot="import gpuq.worker_run")
    fix = "Fix: install gpuq in a venv every member and the queue's account can run (README: On a GPU box)"
    who = f"the queue's account (uid {account.uid})" if os.geteuid() == 0 and account.uid != 0 else "this account"
    try:
        done = subprocess.run(
            argv, preexec_fn=lambda: privsep.become(account), capture_output=True, text=True, timeout=300, cwd="/"
        )
    except (OSError, subprocess.SubprocessError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return f"cannot start the worker: {who} cannot run {sys.executable} ({why}). {fix}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"cannot start the worker: {who} cannot load gpuq with {sys.executable} -I ({last}). {fix}"
    return None


def _root_problem(layout: Layout, account: privsep.Account, launcher_dir: str | None) -> str | None:
    """Why root must not start this queue, if it must not: code or config others could change
    (strictmodes), or a root others share (jobs/ writable by others) whose state/ is root's,
    which would have root read and act on members' files, or whose state/ is a person's (who
    would then be the queue: the starter trusts what state/'s owner asks of it)."""
    if problem := strictmodes.queue_account_problem(layout, account.uid):
        return problem
    unsafe = strictmodes.problems(layout, account.uid, launcher_dir and os.path.join(launcher_dir, "worker.py"))
    if unsafe:
        return "\n  ".join(unsafe)
    if account.uid == 0 and writable_by_others(_mode(layout.jobs)):
        return (
            f"{layout.jobs} is writable by others, but {layout.state} is root's: members' specs "
            "would be read by root. Fix: make it a team root with a queue account, "
            f"`gpuq init {layout.root} --group TEAM` (docs/security.md)"
        )
    return None


def _mode(path: Path) -> int:
    try:
        return os.stat(path).st_mode
    except OSError:
        return 0


def local_dir_problem(local_dir: Path, layout: Layout, owner: int) -> str | None:
    """Why local_dir cannot be the worker's private directory (created here when missing, for
    `owner`, the queue's account), if it cannot: the worker keeps its locks, lease, stop
    requests and job lock files there, and trusts them, so nobody else may be able to swap
    any part of its path."""
    try:
        ensure_private_dir(local_dir, owner=owner)
    except UnsafePath as e:
        return str(e)
    except OSError as e:
        return (
            f"cannot create local_dir {local_dir}: {e.strerror or e}. Fix: set local_dir in "
            f"{layout.config_file} to a local directory this worker's account may create"
        )
    return None


def _already_running(host: str, verbose: bool) -> int:
    if verbose:
        print(f"gpuq worker: a worker already runs for {host} on this root", file=sys.stderr)
    return 0


def _daemonize() -> bool:
    """Double fork into a new session. Returns True in the original process."""
    if os.fork() > 0:
        return True
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return False


def open_worker_log(path: Path) -> tuple[int | None, str | None]:
    """The worker's log, opened to append, never through a link, a FIFO or a file that is not
    the worker's user's: (descriptor, None), or (None, why) after saying so on stderr (logs/
    may have been writable by others, and a root worker must not append where they point)."""
    try:
        return open_to_append(path, 0o644, os.geteuid(), f"worker log {path}", "this worker's user")[0], None
    except OSError as e:
        problem = (
            f"cannot write the worker log: {e.strerror or e}; logging to stderr only. "
            f"Fix: remove {path} (the worker creates it)"
        )
        print(f"gpuq worker: {problem}", file=sys.stderr)
        return None, problem


def setup_logging(log_fd: int | None, to_stderr: bool, verbose: bool) -> None:
    handlers: list[logging.Handler] = []
    if log_fd is not None:
        handlers.append(
            logging.StreamHandler(open(log_fd, "a", buffering=1, encoding="utf-8", errors="backslashreplace"))
        )
    if to_stderr:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        handlers=handlers,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    logging.getLogger("filelock").setLevel(logging.WARNING)  # its per-acquire debug lines drown ours
