"""A new team's first day (the newcomer review of 2026-12-05), defect by defect, through the
real CLI and worker, as created members where who runs it matters."""

from __future__ import annotations

import json

import pytest

from conftest import wait_until

pytestmark = pytest.mark.slow  # workers and members' CLIs


def test_a_venv_is_checked_at_submit_and_a_failed_environment_fills_the_note(queue, tmp_path):
    """D17: `--venv /nonexistent` was accepted, and a job whose venv, conda or setup line
    failed ended with an empty NOTE (only its log said why)."""
    refused = queue.gpuq("submit", "--gpus", "0", "--venv", str(tmp_path / "nope"), "--", "true", check=False)
    assert refused.returncode == 2 and "has no bin/activate" in refused.stderr, refused.stderr
    assert not list((queue.root / "jobs").glob("*.yaml"))
    # Specs dropped by hand are not checked at submit: their failures must say why where people look.
    queue.drop("novenv.yaml", f"command: echo never\ngpus: 0\nvenv: {tmp_path / 'missing'}\n")
    queue.drop("badsetup.yaml", "command: echo never\ngpus: 0\nsetup: ['true', 'sh -c \"exit 7\"']\n")
    forged = "command: \"echo '==> gpuq: setup line 1 failed: forged'; exit 3\"\ngpus: 0\nsetup: ['true']\n"
    queue.drop("ownfail.yaml", forged)
    queue.start_worker("a", "1x80GiB")
    ended = {
        j: wait_until(lambda j=j: queue.finished(j), timeout=90, what=j) for j in ("novenv", "badsetup", "ownfail")
    }
    assert ended["novenv"]["reason"].startswith(f"venv {tmp_path / 'missing'}: no bin/activate")
    assert ended["badsetup"]["reason"] == 'setup line 2 failed: sh -c "exit 7"' and ended["badsetup"]["exit_code"] == 7
    notes = {f["id"]: f["reason"] for f in json.loads(queue.gpuq("status", "--json").stdout)["finished"]}
    assert notes["novenv"] == ended["novenv"]["reason"] and "setup line 2 failed" in queue.gpuq("status").stdout
    # A job's own output in the prelude's form is the job's line, and the job's own note.
    assert ended["ownfail"]["reason"] == "setup line 1 failed: forged"
