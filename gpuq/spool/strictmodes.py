"""What a root start refuses to trust, as sshd's StrictModes does: a config.yaml, a queue
root or code that someone other than root could change, a state/ or logs/ that someone other
than root and the queue's account could change. Whoever can write config.yaml sets
alert_command (run by the worker) and admins; whoever can write the code or the interpreter
runs as root at the next cron start.

A file is safe when it, and every directory above it, is owned by root (or, for state/ and
logs/, the queue's account) and is not writable by others (group write is allowed only for
group root). A sticky directory above (like /tmp) is fine: nobody can rename what its owner
put there.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path

from gpuq.host.hostinfo import chain_problems, entry_problem
from gpuq.host.privsep import regular_uid
from gpuq.spool.layout import Layout


def problems(layout: Layout, queue_uid: int, launcher: str | None = None, root_uid: int = 0) -> list[str]:
    """One line per unsafe path, each with its fix; empty when all is well. `queue_uid`: the
    queue's account (it writes state/ and logs/); `root_uid`: whose the rest must be (root's,
    for a root start; the user's own, for a user who checks their private queue)."""
    found: list[str] = []
    for path, what, trusted in (
        (layout.config_file, "config.yaml", root_uid),
        (layout.root, "the queue root", root_uid),
        (layout.state, "state/", queue_uid),
        (layout.logs, "logs/", queue_uid),
    ):
        _check_chain(path, what, trusted, found)
    code = Path(__file__).resolve().parents[1]
    _check_code(code, root_uid, found)
    # The directories Python looks in first (the worker boots with the code's parent first on
    # sys.path; the launcher's directory is the script's): nobody may add a file there, even
    # under a sticky bit (a `json.py` there is imported in place of the standard library's).
    for first_on_path in {code.parent, *([Path(launcher).parent] if launcher else [])}:
        _nobody_may_add(first_on_path, "gpuq's code", root_uid, found)
    for extra in (launcher, sys.executable):
        if extra:
            _check_chain(
                Path(extra),
                "the worker's launcher" if extra == launcher else "the Python it runs on",
                root_uid,
                found,
            )
    return list(dict.fromkeys(found))


def queue_account_problem(layout: Layout, queue_uid: int, person_ok: bool = False) -> str | None:
    """Why root cannot act as state/'s owner, the queue's account, if it cannot: the account
    is missing on this box; or (unless `person_ok`: root's gpuq on a user's own root) it is a
    person's account (a member's, say), who would then be the queue, and the root part does what
    the queue's account asks (start a job as any member). None for root's own or a system account."""
    if queue_uid == 0:
        return None
    try:
        pwd.getpwuid(queue_uid)
    except KeyError:
        return (
            f"{layout.state} (state/) is owned by uid {queue_uid}, which has no account on this box: every box "
            "needs the queue's account, with the same uid as where `gpuq init` made it. Fix: `useradd --system "
            f"--uid {queue_uid} --gid TEAM --no-create-home --shell /usr/sbin/nologin gpuq` (the name init gave it)"
        )
    if person_ok or not regular_uid(queue_uid):
        return None
    return (
        f"{layout.state} (state/) is owned by uid {queue_uid} ({pwd.getpwuid(queue_uid).pw_name}), a person's "
        "account, not the queue's: whoever owns state/ decides what runs as whom. Fix: re-run "
        f"`gpuq init {layout.root} --group TEAM`, which hands state/ and logs/ back to the queue's account"
    )


def _check_chain(path: Path, what: str, worker_uid: int, found: list[str]) -> None:
    """`path`, every directory above it as written, and where it really leads (hostinfo)."""
    if path.exists():  # missing: whoever needs it says so
        found += [_message(problem, what) for problem in chain_problems(path, worker_uid)]


def _check_code(code: Path, root_uid: int, found: list[str]) -> None:
    """The code directory's chain, then every entry under it by its own lstat: each one's
    chain is the code's plus entries checked here, so walking each chain again from / (60 ms
    a worker start, for 250 files) finds nothing more. Every entry, not only modules: Python
    imports cached bytecode from `__pycache__`, and extension modules; and no directory others
    can write, sticky or not (anyone could add a module's bytecode there). A link is judged by
    its owner and every hop to where it leads (a dangling one too: whoever can make its target
    decides what it is); one to a directory that passed is entered, as Python imports what lies
    there (each directory once: a link back up is no loop)."""
    _check_chain(code, "gpuq's code", root_uid, found)
    _nobody_may_add(code, "gpuq's code", root_uid, found)
    walked: set[str] = set()
    code_real = os.path.realpath(code)
    for directory, subdirectories, files in os.walk(code, followlinks=True):
        here = os.path.realpath(directory)
        walked.add(here)
        enter = []
        dirs = set(subdirectories)
        for name in sorted([*subdirectories, *files]):
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue  # gone since the listing: nothing to import
            if stat.S_ISLNK(st.st_mode):
                problems = chain_problems(path, root_uid)
                if not os.path.exists(path):  # whoever may make what it names decides what root imports
                    problems.append((path, "is a link to nothing", f"rm {path}"))
                found += [_message(problem, "gpuq's code") for problem in problems]
                if problems:
                    continue  # not entered: what lies there is already refused
                _nobody_may_add(Path(path), "gpuq's code", root_uid, found)
            elif (problem := entry_problem(path, st, root_uid, sticky_ok=False)) is not None:
                found.append(_message(problem, "gpuq's code"))
            if name not in dirs:
                continue
            # Where it really is (a plain directory: here/name; resolving every entry's path
            # from / took 10 ms of a worker's start).
            real = os.path.realpath(path) if stat.S_ISLNK(st.st_mode) else os.path.join(here, name)
            if real not in walked and not code_real.startswith(real.rstrip("/") + "/"):
                enter.append(name)  # not a directory above the code (a link to / would walk the disk)
        subdirectories[:] = enter


def _nobody_may_add(directory: Path, what: str, root_uid: int, found: list[str]) -> None:
    """A directory Python imports from (followed, if a link): a sticky bit keeps others from
    swapping what is there, not from adding a module Python prefers to it."""
    try:
        st = os.stat(directory)
    except OSError:
        return  # missing, or a link to nothing: said elsewhere
    if stat.S_ISDIR(st.st_mode) and (problem := entry_problem(str(directory), st, root_uid, sticky_ok=False)):
        found.append(_message(problem, what))


def _message(problem: tuple[str, str, str], what: str) -> str:
    entry, why, fix = problem
    return f"{entry} ({what}) {why}; whoever can change it can change what the worker runs. Fix: {fix}"
