"""Fake GPU memory registered by jobs (`gpuq fake-use`): a file per process in a directory
every user may create in, read by the worker as the hostile input it is."""

from __future__ import annotations

import json
import os
import subprocess

import harness
import pytest

from conftest import PY, REPO
from gpuq.host.fake_nvml import registered


@pytest.mark.slow  # a process of its own, to register
@pytest.mark.skipif(os.geteuid() != 0, reason="gives a file to another user (CI runs as root)")
def test_a_registration_counts_only_for_a_live_process_of_the_files_own_owner(tmp_path):
    use = tmp_path / "use"
    use.mkdir(mode=0o1777)
    mine = os.getpid()
    (use / f"{mine}.json").write_text(json.dumps([{"gpu": 0, "used_mib": 9216, "util": 50}]))
    # Someone else's file naming this (root's) process: it would make root's process a GPU user.
    forged = use / "1.json"  # pid 1 is root's
    forged.write_text(json.dumps([{"gpu": 0, "used_mib": 80000, "util": 100}]))
    os.chown(forged, 65534, 65534)
    (use / "not-a-pid.json").write_text("[]")
    (use / "99999999.json").write_text(json.dumps([{"gpu": 0, "used_mib": 1, "util": 1}]))  # no such pid
    sleeper, deep = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    try:
        (use / f"{sleeper.pid}.json").write_text("{garbage")
        (use / f"{deep.pid}.json").write_text("[" * 3000 + "]" * 3000)  # too deep for json: no crash
        os.symlink(use / f"{mine}.json", use / f"{os.getppid()}.json")  # a link is never read
        (use / "2.json").write_text(json.dumps([{"gpu": "0", "used_mib": -5, "util": 1}]))  # bad values
        for n in range(1100):  # junk that sorts first must not hide the registrations
            (use / f"-{n:04d}").write_text("x")
        assert registered(use) == [{"pid": mine, "gpu": 0, "used_mib": 9216, "util": 50}]
    finally:
        for process in (sleeper, deep):
            process.kill()
            process.wait()


def test_the_clis_fake_use_refuses_a_bad_size_and_a_process_outside_a_job_by_name(tmp_path, monkeypatch):
    """`gpuq fake-use` through the CLI: the same arguments as the launcher's own path below."""
    monkeypatch.delenv("GPUQ_FAKE_GPUS", raising=False)
    bad = harness.gpuq(tmp_path, "fake-use", "--mem", "lots", "--seconds", "0", check=False)
    assert (bad.returncode, bad.stderr) == (
        2,
        "gpuq fake-use: --mem: 'lots' is not a size; write it like 20GiB, 20G, 20480MiB\n",
    )
    outside = harness.gpuq(tmp_path, "fake-use", "--mem", "1GiB", "--seconds", "0", check=False)
    assert outside.returncode == 2 and "GPUQ_FAKE_GPUS does not name a fake GPU file" in outside.stderr


@pytest.mark.slow  # the launcher, in a process of its own
def test_the_launcher_runs_fake_use_without_loading_the_cli(tmp_path):
    """Nearly every job on fake GPUs starts one: `python gpuq.py fake-use` skips the CLI's imports."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['gpuq.py', 'fake-use', '--mem', '1GiB', '--util', '7', '--seconds', '0']\n"
        "try:\n"
        "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    print(e.code, 'gpuq.cli' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUQ_FAKE_GPUS"}
    done = subprocess.run([PY, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout == "2 False\n", done.stdout + done.stderr
    assert "GPUQ_FAKE_GPUS does not name a fake GPU file" in done.stderr
