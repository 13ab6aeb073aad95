"""A container's client runs as the job's owner (created users; CI runs as root): a root
worker starts docker's client as the owner (the stand-in runtimes, tests/fake_runtime.py),
and real podman (rootless, the member's own) and docker (a socket the team's group may use)
run the job as its owner. Moved from tests/test_security.py with the extra."""

from __future__ import annotations

import grp
import os
import shutil

import pytest
from team import ALICE, TEAM, drop_as

from conftest import wait_until

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("useradd"),
        reason="creating users needs root and useradd (CI runs as root)",
    ),
    pytest.mark.slow,
]
ANA = ALICE


def test_a_root_worker_runs_a_container_as_its_owner(shared, users, shared_code):
    """docker's client runs as the job's owner, its daemon as root (tests/fake_runtime.py
    stands in): inside, the job is its owner, with its groups, and no more."""
    import fake_runtime

    runtimes = fake_runtime.StandIns(shared.root.parent / "runtimes", shared_code[0])
    try:
        work = shared.root.parent / "work"
        work.mkdir()
        os.chmod(work, 0o777)
        ana = users[ANA]
        shared.start_worker("a", "1x80GiB", env=runtimes.worker_env())
        drop_as(
            shared,
            ana,
            "boxed.yaml",
            f"command: id -u; id -G; touch made-here\ngpus: 0\nworkdir: {work}\n"
            "container: {image: pytorch:2, runtime: docker}\n",
        )
        record = wait_until(lambda: shared.finished("boxed"), what="boxed to run")
        assert record["state"] == "done", shared.log("boxed")
        team = grp.getgrnam(TEAM).gr_gid
        lines = shared.log("boxed").splitlines()
        assert str(ana.pw_uid) in lines and any(set(line.split()) == {str(ana.pw_gid), str(team)} for line in lines)
        assert os.stat(work / "made-here").st_uid == ana.pw_uid  # its files are the owner's
        run = runtimes.calls("run")[-1]
        assert run["uid"] == ana.pw_uid and run["args"][run["args"].index("--user") + 1] == f"{ana.pw_uid}:{ana.pw_gid}"
        assert "no-new-privileges" in run["args"] and "ALL" in run["args"]
    finally:
        runtimes.close()


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_real_container_runs_as_its_owner(shared, users, runtime):
    """The client runs as the job's owner: rootless podman of their own, or docker's client
    on a socket their group may use (config container_env names it)."""
    import real_runtimes

    dockerd, pod, owner = None, None, users[ANA]
    try:
        if runtime == "podman":
            pod = real_runtimes.MemberPodman(shared.root.parent / "podman", f"gqt-pod-{os.getpid() % 100000}", TEAM)
            owner, env = pod.user, pod.env
        else:
            dockerd = real_runtimes.Dockerd(group=TEAM)
            env = dockerd.env
    except real_runtimes.RuntimeUnavailable as e:
        pytest.skip(f"{runtime} cannot run containers here: {e}")
    try:
        work = shared.root.parent / "work"
        work.mkdir()
        os.chmod(work, 0o777)
        shared.write_config(allow_root_jobs=False, container_env=env)
        shared.start_worker("a", "1x80GiB")
        drop_as(
            shared,
            owner,
            "real.yaml",
            f"command: id -u; touch made-here\ngpus: 0\nworkdir: {work}\n"
            f"container: {{image: '{real_runtimes.IMAGE}', runtime: {runtime}}}\n",
        )
        record = wait_until(lambda: shared.finished("real"), timeout=120, what=f"the {runtime} job")
        assert record["state"] == "done", shared.log("real")
        assert str(owner.pw_uid) in shared.log("real").splitlines()
        assert os.stat(work / "made-here").st_uid == owner.pw_uid
    finally:
        if dockerd is not None:
            dockerd.stop()
        if pod is not None:
            shared.close()
            pod.stop()
