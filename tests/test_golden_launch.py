"""A job's command line on the host, after its venv, conda and setup prelude: the exact
command line and environment, kept as a golden file (tests/golden/; the containers extra keeps
its runtimes' beside its tests)."""

from __future__ import annotations

from pathlib import Path

import pytest
from golden_launch import check_golden, golden_text

GOLDEN = Path(__file__).resolve().parent / "golden"
HOST = "venv: /shared/envs/proj\nconda: torch-2.3\nsetup: ['export HF_HOME=/scratch/hf', './fetch_data.sh --quiet']\n"


def test_the_host_command_line_after_venv_conda_and_setup_matches_its_golden_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = golden_text("host-venv-conda-setup", HOST, monkeypatch)
    check_golden(GOLDEN, "host-venv-conda-setup", text)
    assert text.splitlines()[1] == "/bin/sh" and "shell.posix activate torch-2.3" in text
