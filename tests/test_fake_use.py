"""Fake GPU memory registered by jobs (`gpuq fake-use`): a file per process in a directory
every user may create in, read by the worker as the hostile input it is."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

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
