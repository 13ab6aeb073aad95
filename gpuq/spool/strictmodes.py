"""What a root worker refuses to trust, as sshd's StrictModes does: a config.yaml, a queue
root, a state/ or code that someone other than root and the worker's own account could
change. Whoever can write config.yaml sets alert_command (run by the worker) and admins;
whoever can write the code or the interpreter runs as root at the next cron start.

A file is safe when it, and every directory above it, is owned by root or the worker's
account and is not writable by others (group write is allowed only for group root). A
sticky directory above (like /tmp) is fine: nobody can rename what its owner put there.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gpuq.host.hostinfo import chain_problems
from gpuq.spool.layout import Layout


def problems(layout: Layout, worker_uid: int, launcher: str | None = None) -> list[str]:
    """One line per unsafe path, each with its fix; empty when all is well."""
    found: list[str] = []
    for path, what in (
        (layout.config_file, "config.yaml"),
        (layout.root, "the queue root"),
        (layout.state, "state/"),
        (layout.logs, "logs/"),
    ):
        _check_chain(path, what, worker_uid, found)
    code = Path(__file__).resolve().parents[1]
    _check_chain(code, "gpuq's code", worker_uid, found)
    for part in sorted(code.rglob("*")):  # every package and module; a link: where it leads too
        if part.suffix == ".py" or (part.is_dir() and part.name != "__pycache__"):
            _check_chain(part, "gpuq's code", worker_uid, found)
    for extra in (launcher, sys.executable):
        if extra:
            _check_chain(
                Path(extra),
                "the worker's launcher" if extra == launcher else "the Python it runs on",
                worker_uid,
                found,
            )
    return list(dict.fromkeys(found))


def _check_chain(path: Path, what: str, worker_uid: int, found: list[str]) -> None:
    """`path`, every directory above it as written, and where it really leads (hostinfo)."""
    if path.exists():  # missing: whoever needs it says so
        found += [_message(problem, what) for problem in chain_problems(path, worker_uid)]


def _message(problem: tuple[str, str, str], what: str) -> str:
    entry, why, fix = problem
    return f"{entry} ({what}) {why}; whoever can change it can change what the worker runs. Fix: {fix}"
