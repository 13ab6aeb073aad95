"""`python worker.py` / `gpuq-worker`: one worker per host, started by cron every minute.

A start while a worker already runs on this host exits at once, quietly, with status 0.
The first start daemonizes (or stays in the foreground) and logs to logs/worker-<host>.log.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

from gpuq.host.hostinfo import (
    NETWORK_FILESYSTEMS,
    UnsafePath,
    ensure_private_dir,
    filesystem_type,
    open_to_append,
)
from gpuq.model import config as config_mod
from gpuq.model.names import HOST_RE, ID_RULE
from gpuq.single_instance import WORKER_LOCK_NAME, holds_lock_at, take_worker_lock, this_host
from gpuq.slurm.bridge import BridgeWorker
from gpuq.spool import strictmodes
from gpuq.spool.layout import Layout, RootError, resolve_root
from gpuq.worker.loop import Worker


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="worker.py", description="Run the gpuq worker of this host.")
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
    """`lock_fd`: the worker lock, when worker.py could take it before loading gpuq."""
    args = parse_args(argv)
    try:
        layout = Layout(resolve_root(args.root, launcher_dir))
        config = config_mod.load(layout.config_file)
    except (RootError, config_mod.ConfigError) as e:
        print(f"gpuq worker: {e}", file=sys.stderr)
        return 2
    host = args.host or this_host()
    if not HOST_RE.match(host):
        print(f"gpuq worker: --host {host!r} is not a valid host name ({ID_RULE})", file=sys.stderr)
        return 2
    if os.geteuid() == 0 and (
        unsafe := strictmodes.problems(layout, os.geteuid(), launcher_dir and os.path.join(launcher_dir, "worker.py"))
    ):
        print("gpuq worker: refusing to run as root:\n  " + "\n  ".join(unsafe), file=sys.stderr)
        return 2
    layout.ensure()
    local_dir = layout.local_dir(host, config.local_dir)
    if (fs := filesystem_type(local_dir)) in NETWORK_FILESYSTEMS:
        print(
            f"gpuq worker: local_dir {local_dir} is on {fs}, a network file system: the job locks "
            f"kept there would not exclude across hosts. Fix: set local_dir in {layout.config_file} "
            f"to a local disk, e.g. /var/tmp/gpuq-{{host}}",
            file=sys.stderr,
        )
        return 2
    if (problem := _local_dir_problem(local_dir, layout)) is not None:
        print(f"gpuq worker: {problem}", file=sys.stderr)
        return 2
    if lock_fd is not None and not holds_lock_at(lock_fd, str(local_dir / WORKER_LOCK_NAME)):
        os.close(lock_fd)  # the early scan locked another local_dir than the config names: not ours
        lock_fd = None
    if lock_fd is None and (lock_fd := take_worker_lock(str(local_dir / WORKER_LOCK_NAME))) is None:
        return _already_running(host, args.verbose)
    daemon = not (args.foreground or args.once)
    log_fd, log_problem = _open_worker_log(layout.worker_log(host))  # before: cron mails a problem
    if daemon and _daemonize():
        return 0  # the cron-started parent: the daemon carries on (flock follows the descriptor)

    _setup_logging(log_fd, to_stderr=not daemon or log_fd is None, verbose=args.verbose)
    if log_problem:
        logging.getLogger("gpuq.worker").warning("%s", log_problem)
    worker_class = BridgeWorker if config.backend == "slurm" else Worker
    # SIGTERM (shutdown, `kill`) ends the worker cleanly; running jobs live on under their
    # supervisors and the next worker reattaches to them.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        worker_class(layout, config, host, args.fake_gpus).run(once=args.once, exit_when_idle=args.exit_when_idle)
    except KeyboardInterrupt:
        pass
    finally:
        logging.getLogger("gpuq.worker").info("worker %s stopped; running jobs continue under their supervisors", host)
        os.close(lock_fd)
    return 0


def _local_dir_problem(local_dir: Path, layout: Layout) -> str | None:
    """Why local_dir cannot be the worker's private directory (created here when missing),
    if it cannot: the worker keeps its locks, lease, stop requests and job lock files there,
    and trusts them, so nobody else may be able to swap any part of its path."""
    try:
        ensure_private_dir(local_dir)
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


def _open_worker_log(path: Path) -> tuple[int | None, str | None]:
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


def _setup_logging(log_fd: int | None, to_stderr: bool, verbose: bool) -> None:
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
