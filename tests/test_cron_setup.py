"""README's setup section run as written, against a real cron daemon (Debian's cron, installed
with apt-get where missing, as the Slurm tests install Slurm): a venv, `pip install`, `gpuq
init --group`, the crontab line init printed; then README's first example spec, dropped into
jobs/ by a member of the team, runs under the cron-started root worker and succeeds.

Needs root (cron runs system crontabs as their users; the job runs as the member) and pip's
package index (as tests/test_onboarding.py does). Up to a minute: cron starts the worker at the
next whole minute, while the test goes on with the demo and the member's project.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import debian
import psutil
import pytest
from team import ALICE, QUEUE, TEAM, needs_root

from conftest import REPO, remove_local_dir, wait_until
from gpuq.single_instance import default_local_dir, this_host

CRON_FILE = Path("/etc/cron.d") / f"gpuq-test-{os.getpid()}"
FAKE_GPUS = "1x24GiB"  # README: on a box without GPUs, GPUQ_FAKE_GPUS on the line above


def readme_block(heading: str, language: str) -> list[str]:
    """The lines of the first ```language block after `heading` in README.md."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(f"\n{heading}\n") :]
    match = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert match, f"README: no {language} block after {heading!r}"
    return match.group(1).splitlines()


def cron_binary() -> str:
    """Debian's cron daemon, installed where missing."""
    found = shutil.which("cron") or ("/usr/sbin/cron" if Path("/usr/sbin/cron").exists() else None)
    if found:
        return found
    if (why := debian.install(("cron",), ("cron",))) is not None:  # as the Slurm tests do, say so and skip
        pytest.skip(f"no cron daemon here: {why}")
    return "/usr/sbin/cron"


def running_cron() -> psutil.Process | None:
    for p in psutil.process_iter(["name"]):
        if p.info["name"] in ("cron", "crond"):
            return p
    return None


# Two copies of the suite may run side by side and share the one cron daemon: each holds a
# shared lock while it uses it; a daemon a test started is stopped by the last one to finish.
USERS_LOCK = Path(tempfile.gettempdir()) / "gpuq-test-cron.lock"
STARTED_BY_A_TEST = Path(tempfile.gettempdir()) / "gpuq-test-cron.pid"


@pytest.fixture
def cron():
    """A cron daemon: the one running, else one started here (stopped at the end)."""
    binary = cron_binary()
    lock = os.open(USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_SH)
    try:
        if running_cron() is None:
            started = subprocess.Popen(
                [binary, "-f"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
            STARTED_BY_A_TEST.write_text(str(started.pid))
            wait_until(lambda: running_cron() is not None, what="cron to start")
        yield
    finally:
        CRON_FILE.unlink(missing_ok=True)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no other copy is using it
            pid = int(STARTED_BY_A_TEST.read_text())
            if psutil.Process(pid).name() in ("cron", "crond"):
                psutil.Process(pid).terminate()
            STARTED_BY_A_TEST.unlink()
        except (BlockingIOError, FileNotFoundError, ValueError, psutil.NoSuchProcess):
            pass  # another copy still uses it, or no test started it
        os.close(lock)


def heartbeat(root: Path) -> Path | None:
    """The heartbeat file of the root's worker, once cron has started it."""
    beats = (root / "state" / "workers").glob("*.json")
    return next((p for p in beats if not p.name.endswith(".specs.json")), None)


@pytest.mark.long
@needs_root
def test_readme_setup_under_real_cron_runs_the_first_example(users, cron):  # noqa: F811
    base = Path(tempfile.mkdtemp(prefix="gpuq-cron-"))
    os.chmod(base, 0o755)  # the team must reach the root (pytest's own tmp dir is root's, 0700)
    code, venv, root, proj = base / "gpuq", base / "venv", base / "q", base / "proj"
    worker_pid = None
    try:
        shutil.copytree(
            REPO,
            code,
            ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "logs", "state", ".venv*"),
        )
        setup = readme_block("## On a GPU box", "sh")
        system_python = shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin")  # where this box has it
        paths = {
            "/shared/gpuq": str(code),
            "/opt/gpuq-venv": str(venv),
            "/shared/q": str(root),
            # The team and its queue's account (init's default, `gpuq`) are this test run's own.
            "--group team": f"--group {TEAM} --queue-user {QUEUE}",
            "/usr/bin/python3": str(system_python),
            # The members' group is the test's, and the link onto PATH goes in the test's own bin/.
            "-aG team ana": f"-aG {TEAM} {users[ALICE].pw_name}",
            "groupadd -f team": f"groupadd -f {TEAM}",
            "/usr/local/bin/gpuq": str(base / "bin" / "gpuq"),
        }

        def as_here(line: str) -> str:
            for placeholder, real in paths.items():
                line = line.replace(placeholder, real)
            return line

        (base / "bin").mkdir()
        commands = [as_here(line) for line in setup if not line.startswith(("* ", "crontab "))]
        (cron_line,) = [as_here(line) for line in setup if line.startswith("* * * * * ")]
        printed = ""
        # As root at a login shell: nothing of this test's Python (a PYTHONPATH would make the
        # venv's gpuq import another copy, and init print that copy's worker.py).
        shell_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "GPUQ_"))}
        for command in commands:  # one line at a time
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=600, env=shell_env)
            assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
            printed += done.stdout
        assert cron_line in printed.splitlines() or f"  {cron_line}" in printed.splitlines(), (
            f"README's cron line is not the one `gpuq init` printed:\n{cron_line}\n{printed}"
        )
        assert "WARNING" not in printed, printed  # the venv is one every member can run
        member_gpuq = [line for line in printed.splitlines() if line.startswith("and run gpuq as ")]
        assert member_gpuq == [f"and run gpuq as {venv / 'bin' / 'gpuq'} (or put it on PATH):"], printed
        # A system crontab (its own file, so no one's crontab is touched): README's line, as root.
        # Planted now: cron starts the worker at the next whole minute, and the demo and the
        # member's project below are made while it waits (the spec may wait in jobs/ for it).
        CRON_FILE.write_text(f"GPUQ_FAKE_GPUS={FAKE_GPUS}\n{cron_line[:10]}root {cron_line[10:]}\n")
        os.chmod(CRON_FILE, 0o644)

        # The installed package (no checkout beside it) runs the whole demo too.
        demo = subprocess.run(
            [str(venv / "bin" / "gpuq"), "demo", "--quick"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**shell_env, "TMPDIR": str(base)},
        )
        assert demo.returncode == 0 and "12/12 jobs finished" in demo.stdout, demo.stdout[-2000:] + demo.stderr[-2000:]

        # The member's project, and README's first example spec with its paths.
        member = users[ALICE]
        proj.mkdir()
        (proj / "train.py").write_text("import os, sys\nprint('trained', sys.argv[1:], os.getcwd(), sys.prefix)\n")
        shutil.chown(proj, member.pw_uid, member.pw_gid)
        shutil.chown(proj / "train.py", member.pw_uid, member.pw_gid)
        python3 = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        as_member = {
            "user": member.pw_uid,
            "group": member.pw_gid,
            "extra_groups": os.getgrouplist(member.pw_name, member.pw_gid),
        }
        made = subprocess.run(
            [python3, "-m", "venv", "--without-pip", str(proj / ".venv")],
            capture_output=True,
            text=True,
            cwd="/",
            **as_member,
        )
        assert made.returncode == 0, made.stderr
        spec = "\n".join(readme_block("## Submitting a job", "yaml")).replace("/home/ana/proj", str(proj)) + "\n"
        drop = subprocess.run(
            ["sh", "-c", f"cat > {root}/jobs/.train-a.tmp && mv {root}/jobs/.train-a.tmp {root}/jobs/train-a.yaml"],
            input=spec,
            capture_output=True,
            text=True,
            cwd="/",
            **as_member,
        )
        assert drop.returncode == 0, drop.stderr
        # The member's `gpuq`, the one link README puts on PATH (the venv's python is not there).
        status = subprocess.run(
            [str(base / "bin" / "gpuq"), "status"],
            capture_output=True,
            text=True,
            cwd="/",
            env={"GPUQ_ROOT": str(root)},
            **as_member,
        )
        assert status.returncode == 0 and "PENDING" in status.stdout, status.stderr
        beat = wait_until(
            lambda: heartbeat(root), timeout=150, what="cron to start the worker (at the next whole minute)"
        )
        worker_pid = json.loads(beat.read_text())["pid"]

        record_path = root / "state" / "finished" / "train-a.json"
        record = json.loads(
            wait_until(
                lambda: record_path.exists() and record_path.read_text(), timeout=120, what="README's example to finish"
            )
        )
        log = (root / "logs" / "train-a.log").read_text()
        assert record["state"] == "done" and record["user"] == ALICE, (record, log)
        assert f"trained ['--lr', '3e-4'] {proj} {proj / '.venv'}" in log, log
        # ... and the member runs the venv's gpuq, as README and init say.
        seen = subprocess.run(
            [str(venv / "bin" / "gpuq"), "--root", str(root), "status"],
            capture_output=True,
            text=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
            **as_member,
        )
        assert seen.returncode == 0 and "train-a" in seen.stdout, seen.stdout + seen.stderr
    finally:
        CRON_FILE.unlink(missing_ok=True)
        if worker_pid is None and (beat := heartbeat(root)) is not None:  # cron started it, the test failed first
            worker_pid = json.loads(beat.read_text())["pid"]
        if worker_pid is not None:
            try:
                os.kill(worker_pid, signal.SIGTERM)
                psutil.Process(worker_pid).wait(timeout=30)
            except (ProcessLookupError, psutil.NoSuchProcess):
                pass
        remove_local_dir(default_local_dir(str(root), this_host()))  # cron's worker: no --host
        shutil.rmtree(base, ignore_errors=True)
