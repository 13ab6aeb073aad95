"""`gpuq init DIR [--group TEAM] [--queue-user NAME]`: a new queue root — config.yaml (the
commented one that ships with gpuq), jobs/, logs/, state/ — set up for a team when a group is
named: the queue's own account (NAME, default `gpuq`, made when missing, as Slurm's
SlurmUser) owns the spool and runs the workers; the team's group reads it; members create
files only in the sticky jobs/ and requests/ (docs/security.md, "Who writes what"). Run again
on a root made before the queue account existed, it hands the spool to that account. Prints
the cron line that starts a worker on each box."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from gpuq.host.privsep import regular_uid
from gpuq.spool.layout import Layout

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "config.yaml"
DEFAULT_QUEUE_USER = "gpuq"
MINIMAL_CONFIG = (
    '# gpuq config: every key and its default are in docs/reference.md, "Config reference".\npoll_interval: 1\n'
)


class InitError(Exception):
    pass


def worker_command(root: Path) -> str:
    """How cron should start a worker for `root`, by absolute paths (cron's PATH is
    /usr/bin:/bin): the gpuq-worker installed beside this interpreter (a venv's bin/, run
    without activating it: README's line), else the checkout's worker.py with this interpreter."""
    beside = Path(sys.executable).parent / "gpuq-worker"
    launcher = SHIPPED_CONFIG.parent / "worker.py"
    if beside.exists() or not launcher.exists():
        return f"{beside if beside.exists() else shutil.which('gpuq-worker') or 'gpuq-worker'} --root {root}"
    return f"{sys.executable} {launcher} --root {root}"


def cron_line(root: Path) -> str:
    return f"* * * * * {worker_command(root)}"


def init_root(directory: Path, group: str | None, queue_user: str = DEFAULT_QUEUE_USER) -> list[str]:
    """Make the root (or, run again by root with --group, hand an existing team root to the
    queue's account); returns what was done, one line each."""
    root = directory.resolve()
    layout = Layout(root)
    gid = _group_id(group) if group is not None else None
    exists = layout.jobs.is_dir() and layout.config_file.exists()
    if exists and (gid is None or os.geteuid() != 0):
        raise InitError(
            f"{root} is already a gpuq root (it has jobs/ and config.yaml); start workers with: {cron_line(root)}"
        )
    done: list[str] = []
    # The account first: a refused one (a person's) leaves nothing behind. A root init made on
    # another box already has the account's uid on state/: every box's account must have it.
    state_uid = _owner(layout.state) if exists else None
    uid = state_uid if state_uid not in (None, 0) else None
    queue = queue_account(queue_user, group or "", gid, done, uid) if gid is not None and os.geteuid() == 0 else None
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
        share_with_team(layout, gid, queue)
        owner = queue.pw_name if queue else _me()
        done.append(
            f"shared it with group {group}: members create files only in the sticky jobs/ and "
            f"requests/; logs/ and state/ are {owner}'s, config.yaml is {_me()}'s, and the team "
            "reads them; nothing for others"
        )
    return done


def _owner(path: Path) -> int | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_uid if stat.S_ISDIR(st.st_mode) else None


def _group_id(group: str) -> int:
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise InitError(
            f"--group {group}: no such group. Fix: `groupadd {group}` and add the team "
            f"to it (`usermod -aG {group} NAME`), or leave --group out for one user"
        ) from None


def queue_account(name: str, group: str, gid: int, done: list[str], uid: int | None = None) -> pwd.struct_passwd:
    """The queue's account (as root): a system account in the team's group that logs in
    nowhere, made with useradd when missing (with `uid`, the one the shared root's state/ has,
    when init made it on another box: the account is the same on every box). The workers run
    as it; jobs never do."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd", path="/usr/sbin:/usr/bin:/sbin:/bin")
        if useradd is None:
            raise InitError(f"no useradd on this host: make the account {name} (in group {group}) yourself") from None
        shell = "/usr/sbin/nologin" if os.path.exists("/usr/sbin/nologin") else "/bin/false"
        made = subprocess.run(
            [
                useradd,
                "--system",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                shell,
                "--gid",
                group,
                *(["--uid", str(uid)] if uid is not None else []),
                name,
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise InitError(f"useradd {name} failed: {made.stderr.strip()}") from None
        pw = pwd.getpwnam(name)
        done.append(
            f"made the queue's account {name} (uid {pw.pw_uid}, a system account in group {group}; it logs in nowhere)"
        )
    if uid is not None and pw.pw_uid != uid:
        raise InitError(
            f"the queue's account {name} has uid {pw.pw_uid} here, but the root's state/ is uid {uid}'s (the account "
            f"init made on the first box): it must be the same on every box. Fix: `usermod -u {uid} {name}`"
        )
    if pw.pw_uid == 0:
        raise InitError(f"--queue-user {name} is root: the queue's account must be an account of its own")
    if regular_uid(pw.pw_uid):
        raise InitError(
            f"--queue-user {name} is a person's account (uid {pw.pw_uid}): the queue's account decides what runs "
            "as whom, so it must be a system account of its own. Fix: leave --queue-user out (init makes `gpuq`)"
        )
    if gid not in os.getgrouplist(name, pw.pw_gid):
        raise InitError(
            f"the queue's account {name} is not in group {group} (another team's queue?). Fix: give this "
            f"queue its own account with --queue-user (e.g. --queue-user gpuq-{group}), or "
            f"`usermod -aG {group} {name}` to share one account between the teams' queues"
        )
    return pw


def share_with_team(layout: Layout, gid: int, queue: pwd.struct_passwd | None = None) -> None:
    """The trust boundary on disk (docs/security.md): the queue's account owns the spool (or,
    with no such account, whoever runs init); config.yaml and the root itself stay init's
    (root's); the team reads all of it (setgid directories keep new files the team's) and
    creates files only in the two sticky inboxes, where nobody can rename or remove another
    member's file. config.yaml is 0644: the worker refuses one that others can write. What the
    spool already holds that is init's own (records of an earlier root worker) becomes the
    queue account's; members' files stay theirs."""
    inboxes = set(layout.member_writable())
    uid = queue.pw_uid if queue is not None else os.geteuid()
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
        owner = os.geteuid() if path in (layout.root, layout.config_file) else uid
        try:  # changed on the descriptor of the very file checked, never through a link
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise InitError(f"{path} cannot be opened ({e.strerror}): make the root in a new directory") from None
        try:
            st = os.fstat(fd)
            if st.st_uid not in (os.geteuid(), uid) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise InitError(
                    f"{path} is not a file or directory of yours (a link, or someone else's): "
                    "make the root in a new directory"
                )
            os.fchown(fd, owner if os.geteuid() == 0 else -1, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    if uid != os.geteuid():
        for top in (layout.state, layout.logs):
            _hand_over(top, uid)


def _hand_over(top: Path, uid: int) -> None:
    """Every file and directory under `top` that is root's becomes `uid`'s (no link is
    followed: walked by directory descriptor, each changed where it lies)."""
    for _, dirs, files, dir_fd in os.fwalk(top, follow_symlinks=False):
        for name in dirs + files:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if st.st_uid == 0 and not stat.S_ISLNK(st.st_mode) and (stat.S_ISDIR(st.st_mode) or st.st_nlink == 1):
                    os.chown(name, uid, -1, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                pass


def _me() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
