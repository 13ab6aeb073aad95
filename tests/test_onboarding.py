"""Onboarding: follow README's first command exactly as a newcomer would — a fresh
virtualenv, a fresh copy of the project, then the command as README writes it — and check
that the demonstration shows its jobs finishing. Also a script: `python
tests/test_onboarding.py` prints how long each step took."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here starts processes

REPO = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    """The commands of README's "First two commands" block, in order."""
    text = (REPO / "README.md").read_text()
    section = text.split("## First two commands", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README lost its first-two-commands block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def fresh_copy(dest: Path) -> Path:
    """The project as a newcomer has it after cloning: the working tree, without what an
    install or a run here left behind."""
    shutil.copytree(
        REPO,
        dest,
        ignore=shutil.ignore_patterns(".git", "*.egg-info", "__pycache__", ".venv*", ".pytest_cache", "build", "dist"),
    )
    return dest


def run_first_command(workdir: Path) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    timings = {}
    venv = workdir / "venv"
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    timings["venv"] = time.monotonic() - t
    t = time.monotonic()
    project = fresh_copy(workdir / "gpuq")
    timings["copy"] = time.monotonic() - t
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUQ_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env["VIRTUAL_ENV"] = str(venv)
    t = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", readme_commands()[0]], cwd=project, env=env, capture_output=True, text=True, timeout=900
    )
    timings["first command"] = time.monotonic() - t
    return result, timings


def check(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    finished = re.search(r"(\d+)/(\d+) jobs finished", result.stdout)
    assert finished and finished.group(1) == finished.group(2) != "0", result.stdout[-3000:]
    assert "RUNNING" in result.stdout and "FINISHED" in result.stdout  # the status screen was shown


@pytest.mark.long
def test_readme_first_command_in_a_fresh_virtualenv(tmp_path):
    result, _ = run_first_command(tmp_path)
    check(result)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="gpuq-onboarding-") as tmp:
        outcome, took = run_first_command(Path(tmp))
        check(outcome)
        print(
            f"README's first command, `{readme_commands()[0]}`, in a fresh virtualenv: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in took.items())
            + f"; total {sum(took.values()):.1f}s"
        )
        print(outcome.stdout.strip().splitlines()[-1])
