"""`gpuq init DIR [--group TEAM]`: a new queue root — config.yaml (the commented one that ships
with gpuq), jobs/, logs/, state/ — set up for a team when a group is named (group-owned,
setgid directories; members write only in the sticky jobs/ and requests/: docs/security.md,
"Who writes what"), and the cron line that starts a worker on each box."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import sys
from pathlib import Path

from gpuq.spool.layout import Layout

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "config.yaml"
MINIMAL_CONFIG = (
    '# gpuq config: every key and its default are in docs/reference.md, "Config reference".\npoll_interval: 1\n'
)


class InitError(Exception):
    pass


def worker_command(root: Path) -> str:
    """How cron should start a worker for `root`, by absolute paths (cron's PATH is
    /usr/bin:/bin): the checkout's worker.py with this interpreter, else the gpuq-worker
    installed beside this interpreter (a venv's bin/, run without activating it)."""
    launcher = SHIPPED_CONFIG.parent / "worker.py"
    if launcher.exists():
        return f"{sys.executable} {launcher} --root {root}"
    beside = Path(sys.executable).parent / "gpuq-worker"
    return f"{beside if beside.exists() else shutil.which('gpuq-worker') or 'gpuq-worker'} --root {root}"


def cron_line(root: Path) -> str:
    return f"* * * * * {worker_command(root)}"


def init_root(directory: Path, group: str | None) -> list[str]:
    """Make the root; returns what was done, one line each."""
    root = directory.resolve()
    layout = Layout(root)
    if layout.jobs.is_dir() and layout.config_file.exists():
        raise InitError(
            f"{root} is already a gpuq root (it has jobs/ and config.yaml); start workers with: {cron_line(root)}"
        )
    gid = None
    if group is not None:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise InitError(
                f"--group {group}: no such group. Fix: `groupadd {group}` and add the team "
                f"to it (`usermod -aG {group} NAME`), or leave --group out for one user"
            ) from None
    done = []
    root.mkdir(parents=True, exist_ok=True)
    layout.ensure()
    if not os.path.lexists(layout.config_file):
        shipped = SHIPPED_CONFIG.exists()  # beside a checkout; an installed package has only the minimal one
        # Created, never written through a name planted in a directory someone else could write.
        fd = os.open(layout.config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(SHIPPED_CONFIG.read_text() if shipped else MINIMAL_CONFIG)
        done.append(
            f"wrote {layout.config_file} "
            + (
                "(every key commented; defaults suit most teams)"
                if shipped
                else '(minimal; every key and its default are in docs/reference.md, "Config reference")'
            )
        )
    done.append(f"made {layout.jobs}/, {layout.requests}/, {layout.logs}/ and {layout.state}/")
    if gid is not None:
        share_with_team(layout, gid)
        done.append(
            f"shared it with group {group}: members create files only in the sticky jobs/ and "
            f"requests/; config.yaml, logs/ and state/ are {_me()}'s, which the team reads; "
            "nothing for others"
        )
    return done


def share_with_team(layout: Layout, gid: int) -> None:
    """The trust boundary on disk (docs/security.md): the worker's account owns
    everything; the team reads all of it (setgid directories keep new files the team's) and
    creates files only in the two sticky inboxes, where nobody can rename or remove another
    member's file. config.yaml is 0644: the worker refuses one that others can write."""
    inboxes = set(layout.member_writable())
    for path in (layout.root, *layout.directories(), layout.config_file):
        mode = (
            0o644
            if path == layout.config_file
            else 0o3770
            if path in inboxes
            else 0o2700  # taken requests: the worker's alone
            if path == layout.taken_requests
            else 0o2750
        )
        try:  # changed on the descriptor of the very file checked, never through a link
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise InitError(f"{path} cannot be opened ({e.strerror}): make the root in a new directory") from None
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise InitError(
                    f"{path} is not a file or directory of yours (a link, or someone else's): "
                    "make the root in a new directory"
                )
            os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
