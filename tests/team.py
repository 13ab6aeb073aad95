"""A team on one box, as README's setup makes it: a root made by `gpuq init DIR --group TEAM`,
a root worker, and created users (CI runs as root) who run gpuq as themselves.

- `alice` is the victim, `bob` the attacker; both are in the team group. `eve` is not.
- Users run the CLI with an interpreter they can reach (a venv made from the system Python,
  in a shared place, never one under root's 0700 home) and a root-owned copy of the code
  (as docs/security.md's recipe has it: code and config are root's, the spool is the team's).

Import the fixtures into a test module: `from team import team, users, as_user, ...`.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
import pytest
from filelock import FileLock

from conftest import PY, REPO, Queue

# Names of this test process's own: two copies of the suite may run side by side, and one
# must not delete the users the other is using.
TAG = str(os.getpid() % 100000)
TEAM = f"gqt-team-{TAG}"
ALICE, BOB, EVE = f"gqt-alice-{TAG}", f"gqt-bob-{TAG}", f"gqt-eve-{TAG}"
QUEUE = f"gqt-q-{TAG}"  # the queue's own account, made by `gpuq init --queue-user`
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd"), reason="creating users needs root and useradd (CI runs as root)"
)


def _reachable_by_others(path: str) -> bool:
    """Whether every directory above `path` lets others in (o+x) and the file is o+rx."""
    p = Path(path).resolve()
    try:
        if not os.stat(p).st_mode & 0o005 == 0o005:
            return False
        return all(os.stat(d).st_mode & 0o001 for d in p.parents)
    except OSError:
        return False


def _shared_python() -> str:
    """An interpreter every created user can run, with gpuq's dependencies: this one where
    it is reachable, else a venv made from the system Python in /tmp (kept for the session's
    later runs, keyed by the dependencies)."""
    if _reachable_by_others(PY) and os.access(PY, os.X_OK):
        return PY
    deps = ("filelock>=4.0", "nvidia-ml-py>=12.535", "pyyaml>=6.0", "psutil>=5.9")
    base = shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin") or sys.executable
    key = hashlib.sha256(" ".join((base, *deps)).encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"gpuq-team-python-{key}"
    python = venv / "bin" / "python"
    # Under a lock: a second copy of the suite started beside this one on a new machine would
    # otherwise remove the venv this one is installing into.
    with FileLock(f"{venv}.lock"):
        if not (venv / ".ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *deps], check=True, capture_output=True)
            (venv / ".ready").write_text("ok\n")
        subprocess.run(["chmod", "-R", "go+rX,go-w", str(venv)], check=True)
    return str(python)


@pytest.fixture(scope="session")
def shared_code(tmp_path_factory) -> tuple[str, Path]:
    """(interpreter, code dir) that the created users run the CLI with: the code is a
    root-owned 0755 copy of the checkout's gpuq.py, worker.py and package."""
    python = _shared_python()
    code = Path(tempfile.mkdtemp(prefix="gpuq-team-code-"))
    for name in ("gpuq.py", "worker.py", "config.yaml"):
        shutil.copy2(REPO / name, code / name)
    shutil.copytree(REPO / "gpuq", code / "gpuq", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "go+rX,go-w", str(code)], check=True)
    yield python, code
    shutil.rmtree(code, ignore_errors=True)


@pytest.fixture(scope="session")
def users() -> dict[str, pwd.struct_passwd]:
    """alice and bob in the team group, eve outside it; removed at the end."""
    subprocess.run(["groupadd", "-f", TEAM], check=True)
    for name in (ALICE, BOB, EVE):
        if subprocess.run(["id", name], capture_output=True).returncode:
            extra = ["-G", TEAM] if name != EVE else []
            subprocess.run(["useradd", "-M", "-d", f"/nonexistent/{name}", *extra, "-s", "/bin/sh", name], check=True)
    yield {name: pwd.getpwnam(name) for name in (ALICE, BOB, EVE)}
    for name in (ALICE, BOB, EVE, QUEUE):
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
        # What their commands left in the shared /tmp under their uid (`gpuq run`'s socket
        # directory, podman's runtime directories): a later test's user may get the same uid.
        for left in (f"/tmp/gpuq-{uid}", f"/tmp/podman-run-{uid}", f"/tmp/containers-user-{uid}"):
            shutil.rmtree(left, ignore_errors=True)
        subprocess.run(["userdel", name], capture_output=True)
    subprocess.run(["groupdel", TEAM], capture_output=True)


class TeamQueue(Queue):
    """A root made by `gpuq init --group TEAM` (run by root), driven by a root worker and
    by the team's members through their own CLI."""

    def __init__(self, base: Path, python: str, code: Path, users: dict[str, pwd.struct_passwd]) -> None:
        self.base, self.python, self.code, self.users = base, python, code, users
        self.root = base / "root"
        self.local_base = base / "local"
        self.workers: dict[str, subprocess.Popen] = {}
        self.started: list[tuple[subprocess.Popen, Path]] = []
        # The CLI's init in this process (it keeps root: cli.KEEPS_ROOT); a process for each of
        # the team tests was a quarter of a second of CPU. test_doctor runs it as a process.
        harness.gpuq(base, "init", str(self.root), "--group", TEAM, "--queue-user", QUEUE)
        self.write_config()

    def queue_file(self, name: str) -> Path:
        """A path the queue's account may create (a fault log its worker and supervisors write)."""
        d = self.base / f"{name}.d"
        d.mkdir(exist_ok=True)
        os.chown(d, pwd.getpwnam(QUEUE).pw_uid, -1)
        return d / name

    def cli_command(self) -> list[str]:
        """Root's gpuq, as an admin runs it: from the venv every member reaches (it acts as the
        queue's account in a team root, which must be able to run it)."""
        return [self.python, str(self.code / "gpuq.py")]

    def worker_command(self) -> list[str]:
        """Root starts the team's workers with the team's interpreter and the root-owned code:
        the worker itself runs as the queue's account, which must be able to run both."""
        return [self.python, str(self.code / "worker.py")]

    def write_config(self, **overrides: object) -> None:
        """As an admin edits it: root's file, in place (its owner and mode stay init's)."""
        overrides.setdefault("allow_root_jobs", False)
        mode = os.stat(self.root / "config.yaml").st_mode & 0o7777
        super().write_config(**overrides)
        os.chmod(self.root / "config.yaml", mode)

    def as_user(
        self, name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess:
        """`gpuq --root ROOT ARGS` run by user `name` with the team's interpreter."""
        return self.run_as(
            name,
            [self.python, str(self.code / "gpuq.py"), "--root", str(self.root), *args],
            env=env,
            timeout=timeout,
            input=input,
        )

    def run_as(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        timeout: float = 60,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Any command, as user `name` with their groups (the team's for alice and bob)."""
        base_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "USER": name,
            "LOGNAME": name,
            "LANG": "C.UTF-8",
        }
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd="/",
            env={**base_env, **(env or {})},
            **self.identity(name),
        )

    def identity(self, name: str) -> dict:
        """subprocess's arguments that run a process as user `name`, with their groups."""
        pw = self.users[name]
        return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": os.getgrouplist(pw.pw_name, pw.pw_gid)}

    def popen_as(self, name: str, code: str) -> subprocess.Popen:
        """Python code left running in the background as user `name` (an attacker's script)."""
        return subprocess.Popen(
            [self.python, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd="/",
            **self.identity(name),
        )

    def py_as(self, name: str, code: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Python code run by user `name` (an attacker's script)."""
        return self.run_as(name, [self.python, "-c", code], timeout=timeout)

    def drop_as(self, name: str, file_name: str, text: str, mode: int = 0o644) -> Path:
        """A spec written into jobs/ by user `name`, as their editor would (temp, then rename)."""
        code = (
            f"import os; p = {str(self.root / 'jobs')!r}; tmp = os.path.join(p, '.' + {file_name!r} + '.tmp')\n"
            f"with open(tmp, 'w') as f: f.write({text!r})\n"
            f"os.chmod(tmp, {mode}); os.rename(tmp, os.path.join(p, {file_name!r}))\n"
        )
        done = self.py_as(name, code)
        assert done.returncode == 0, done.stderr
        return self.root / "jobs" / file_name


@pytest.fixture
def team(users, shared_code):
    """A fresh team root under /tmp (pytest's own tmp dir is root's 0700)."""
    python, code = shared_code
    base = Path(tempfile.mkdtemp(prefix="gpuq-team-"))
    os.chmod(base, 0o755)
    q = TeamQueue(base, python, code, users)
    yield q
    q.close()
    if not os.environ.get("GPUQ_TEST_KEEP"):
        subprocess.run(["rm", "-rf", str(base)])  # rm: a member's tree may be 2000 deep (shutil recurses)


def team_gid() -> int:
    return grp.getgrnam(TEAM).gr_gid


# A queue root every created user reaches, and a spec dropped into it as one of them: test_security's,
# and the containers extra's tests of its client run as the job's owner.


@pytest.fixture
def shared(tmp_path_factory):
    """A queue root every test user can reach (pytest's own tmp dir is root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="gpuq-shared-"))
    os.chmod(base, 0o755)
    q = Queue(base / "root", base / "local")
    q.write_config(allow_root_jobs=False)
    yield q
    q.close()
    shutil.rmtree(base, ignore_errors=True)


def drop_as(queue: Queue, user: pwd.struct_passwd, name: str, text: str, mode: int = 0o644) -> Path:
    tmp = queue.root / "jobs" / f".{name}.tmp"
    tmp.write_text(text)
    os.chown(tmp, user.pw_uid, user.pw_gid)
    os.chmod(tmp, mode)
    os.rename(tmp, queue.root / "jobs" / name)
    return queue.root / "jobs" / name
