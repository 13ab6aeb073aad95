"""Attacks through a container's runtime options and mounts (security review C6, C6b, C6c and
its [S] list), as created users (tests/team.py) against a root-started team queue, with the
stand-in runtimes (tests/fake_runtime.py: options read as docker's pflag reads them,
`--env-file` read and pid files written by the client) and the real ones.

Options are an allow-list: every attack below is refused, naming the file, the field, the
option and the fix, by `gpuq submit` and by the worker's intake. The runtime's client runs as
the job's owner, so a mount reaches only what the owner can (rootless podman, apptainer);
docker, whose daemon is root, runs only where the admin allows it (config allow_docker).

Each test here was seen failing on the code before these defences."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fake_runtime
import pytest
from team import BOB, TEAM, needs_root

from conftest import wait_until

pytestmark = needs_root

# name -> (options as a spec gives them, what the refusal must say). SECRET, CLOBBER1/2 are
# root-only files (see _root_only); gpuq-victim-1 stands for another member's container.
ATTACKS: dict[str, tuple[object, str]] = {
    "c6-combined-short-flags": (["-iu0"], "option '-iu0' is a short flag"),
    "c6-short-flags-as-a-string": ("-i -u 0", "option '-i' is a short flag"),
    "c6b-env-file": (["--env-file=SECRET"], "option '--env-file=SECRET' is not allowed"),
    "c6c-pidfile": (["--pidfile=CLOBBER1"], "option '--pidfile=CLOBBER1' is not allowed"),
    "c6c-conmon-pidfile": (["--conmon-pidfile", "CLOBBER2"], "option '--conmon-pidfile' is not allowed"),
    "cidfile": (["--cidfile=CLOBBER1"], "option '--cidfile=CLOBBER1' is not allowed"),
    "volumes-from": (["--volumes-from", "gpuq-victim-1"], "option '--volumes-from' is not allowed"),
    "pid-container": (["--pid=container:gpuq-victim-1"], "option '--pid=container:gpuq-victim-1' is not allowed"),
    "network-container": (
        ["--network", "container:gpuq-victim-1"],
        "option --network value 'container:gpuq-victim-1' is not none|bridge|host",
    ),
    "oom-score-adj": (["--oom-score-adj=-1000"], "option '--oom-score-adj=-1000' is not allowed"),
    "label-file": (["--label-file=SECRET"], "option '--label-file=SECRET' is not allowed"),
    "authfile": (["--authfile", "SECRET"], "option '--authfile' is not allowed"),
    "privileged": (["--privileged"], "option '--privileged' is not allowed"),
    "user": (["--user=0:0"], "option '--user=0:0' is not allowed"),
    "userns": (["--userns=host"], "option '--userns=host' is not allowed"),
    "cap-add": (["--cap-add=ALL"], "option '--cap-add=ALL' is not allowed"),
    "security-opt": (["--security-opt", "seccomp=unconfined"], "option '--security-opt' is not allowed"),
    "device": (["--device=/dev/mem"], "option '--device=/dev/mem' is not allowed"),
    "group-add": (["--group-add=0"], "option '--group-add=0' is not allowed"),
    "volume": (["--volume=/:/host"], "option '--volume=/:/host' is not allowed"),
    "ipc-host": (["--ipc=host"], "option '--ipc=host' is not allowed"),
    "gpus": (["--gpus=all"], "option '--gpus=all' is not allowed"),
}


@pytest.fixture
def runtimes(team):
    r = fake_runtime.StandIns(team.base / "runtimes", team.python)
    yield r
    r.close()


def _root_only(team) -> dict[str, Path]:
    """Root's files, in a 0700 directory of root's: what the attacks aim at."""
    d = team.base / "rootonly"
    d.mkdir(mode=0o700)
    files = {
        "SECRET": ("ROOT_ONLY_SECRET=hunter2\n", 0o600),
        "CLOBBER1": ("precious 1\n", 0o600),
        "CLOBBER2": ("precious 2\n", 0o600),
        "TARGET": ("root-owned line\n", 0o644),
    }
    paths = {}
    for name, (text, mode) in files.items():
        paths[name] = d / name.lower()
        paths[name].write_text(text)
        os.chmod(paths[name], mode)
    return {"DIR": d, **paths}


def _with_paths(options: object, files: dict[str, Path]) -> object:
    def put(text: str) -> str:
        for name in ("SECRET", "CLOBBER1", "CLOBBER2"):
            text = text.replace(name, str(files[name]))
        return text

    return put(options) if isinstance(options, str) else [put(o) for o in options]  # type: ignore[union-attr]


def _workdir(team, owner) -> Path:
    work = team.base / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, owner.pw_uid, owner.pw_gid)
    return work


def _spec(options: object, command: str, work: Path, mounts: list[str] = ()) -> str:
    container = {"image": "img", "runtime": "docker", "options": options}
    if mounts:
        container["mounts"] = list(mounts)
    return f"command: {json.dumps(command)}\ngpus: 0\nworkdir: {work}\ncontainer: {json.dumps(container)}\n"


def _rejection(team, job_id: str) -> str | None:
    """The .error of a rejected spec, or "ran: ..." once the job has ended instead."""
    error = team.root / "state" / "rejected" / f"{job_id}.error"
    if error.exists():
        return error.read_text()
    done = team.finished(job_id)
    return f"ran: {done['state']}: {team.log(job_id)}" if done else None


# --- refused by `gpuq submit`, run by the attacker ----------------------------------------------


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_gpuq_submit_refuses_the_option_naming_it_and_the_fix(team, users, attack: str) -> None:
    bob = users[BOB]
    files = _root_only(team)
    options, said = ATTACKS[attack]
    mine = team.base / "bob-specs"
    mine.mkdir()
    os.chown(mine, bob.pw_uid, bob.pw_gid)
    spec = mine / f"{attack}.yaml"
    text = _spec(_with_paths(options, files), "id -u", _workdir(team, bob))
    done = team.run_as(BOB, ["/bin/sh", "-c", f"cat > {spec}"], input=text)
    assert done.returncode == 0, done.stderr
    refused = team.as_user(BOB, "submit", "--spec", str(spec))
    said = said.replace("SECRET", str(files["SECRET"])).replace("CLOBBER1", str(files["CLOBBER1"]))
    assert refused.returncode == 2, refused.stdout
    assert f"{spec}: field 'container': {said}" in refused.stderr
    assert "Fix: " in refused.stderr and "Nothing was written" in refused.stderr
    if "short flag" in said:
        assert "long form, as one argument (--name=value)" in refused.stderr
    assert not list((team.root / "jobs").glob("*.yaml"))


# --- refused by a root worker's intake: nothing reaches the runtime -----------------------------


def test_a_root_worker_refuses_every_attack_and_the_runtime_never_runs(team, users, runtimes) -> None:
    """C6: -iu0 made docker run bob's command as uid 0, writing into a root file; C6b: the
    client (root) read a root-only env file for the job; C6c: the client wrote pids into
    root-only files; [S]: other containers, root's credentials, the OOM killer's choice."""
    bob = users[BOB]
    files = _root_only(team)
    work = _workdir(team, bob)
    team.start_worker("a", "1x80GiB", env=runtimes.worker_env())
    commands = {
        "c6-combined-short-flags": f"id -u; echo BOB-WAS-HERE >> {files['TARGET']}",
        "c6b-env-file": 'echo "leaked=$ROOT_ONLY_SECRET"',
    }
    for attack, (options, _) in ATTACKS.items():
        team.drop_as(BOB, f"{attack}.yaml", _spec(_with_paths(options, files), commands.get(attack, "true"), work))
    for attack, (_, said) in ATTACKS.items():
        said = said.replace("SECRET", str(files["SECRET"])).replace("CLOBBER1", str(files["CLOBBER1"]))
        outcome = wait_until(lambda attack=attack: _rejection(team, attack), timeout=60, what=f"{attack} settled")
        assert f"jobs/{attack}.yaml: field 'container': {said}" in outcome, outcome
    assert runtimes.calls("run") == []
    assert files["TARGET"].read_text() == "root-owned line\n"
    assert files["CLOBBER1"].read_text() == "precious 1\n" and files["CLOBBER2"].read_text() == "precious 2\n"
    assert not any("hunter2" in p.read_text() for p in (team.root / "logs").glob("*.log"))


# --- mounts: the owner's own reach -------------------------------------------------------------


def test_a_mount_is_made_by_the_owners_own_client_and_reaches_only_what_they_can(team, users, runtimes) -> None:
    """Mounting a directory bob cannot reach (or a link of his to it) would show him files
    whose own mode lets anyone read them (a 0644 file under a 0700 directory). The client runs
    as bob (rootless podman: the kernel checks the mount in his user namespace; the stand-in
    does the same), so such a mount fails the job, and nothing of root's ever resolved a path
    of his. (This once took private binds made by root; there is no root in the path now.)"""
    bob = users[BOB]
    files = _root_only(team)
    os.chmod(files["TARGET"], 0o644)
    work = _workdir(team, bob)
    link = work / "innocent"
    os.symlink(files["DIR"], link)
    os.lchown(link, bob.pw_uid, bob.pw_gid)
    mine = work / "mine"
    team.run_as(BOB, ["/bin/sh", "-c", f"mkdir {mine} && echo bob-data > {mine}/target"])
    team.start_worker("a", "1x80GiB", env=runtimes.worker_env())
    cases = {
        "direct": (files["DIR"], "permission denied"),
        "link": (link, "permission denied"),
        "missing": (team.base / "nothing-here", "no such file or directory"),
        "own": (mine, None),
    }
    for job_id, (source, _) in cases.items():  # (the stand-in runs on the host: a mount where it is)
        submitted = team.as_user(
            BOB,
            *("submit", "--id", job_id, "--gpus", "0", "--container", "img", "--runtime", "podman"),
            *("--mount", f"{source}:{source}", "--workdir", str(work), "--", f"cat {source}/target"),
        )
        assert submitted.returncode == 0, submitted.stderr
    for job_id, (source, said) in cases.items():
        final = wait_until(lambda job_id=job_id: team.finished(job_id), timeout=30, what=f"{job_id} settled")
        log = team.log(job_id)
        if said is None:
            assert final["state"] == "done" and "\nbob-data\n" in log, log
        else:
            assert final["state"] == "failed" and f"Error: statfs {source}: {said}" in log, log
        assert "root-owned line" not in log
    runs = runtimes.calls("run")
    assert len(runs) == 4 and {c["uid"] for c in runs} == {bob.pw_uid}, runs  # each client was bob's
    assert not (Path(os.path.realpath(team.local_base / "a")) / "mounts").exists()


# --- what is allowed still works ----------------------------------------------------------------


def test_allowed_options_reach_the_runtime_as_checked_before_gpuqs_own(team, users, runtimes) -> None:
    bob = users[BOB]
    work = _workdir(team, bob)
    team.write_config(allow_docker=True)  # the admin's yes: docker's daemon is root
    team.start_worker("a", "1x80GiB", env=runtimes.worker_env())
    options = [
        "--shm-size",
        "1g",
        "--ulimit=memlock=-1",
        "--hostname=trainer",
        "--read-only",
        "--network=none",
        "--label",
        "project=x",
        "--tmpfs=/scratch:size=1g,noexec",
        "--entrypoint=",
        "--pull=never",
    ]
    spec = work / "ok.yaml"
    team.run_as(BOB, ["/bin/sh", "-c", f"cat > {spec}"], input=_spec(options, "id -u", work))
    submitted = team.as_user(BOB, "submit", "--spec", str(spec), "--id", "ok")
    assert submitted.returncode == 0, submitted.stderr
    final = wait_until(lambda: team.finished("ok"), timeout=30, what="ok finished")
    assert final["state"] == "done", team.log("ok")
    assert f"\n{bob.pw_uid}\n" in team.log("ok")  # as bob: gpuq's --user is the one used
    run = runtimes.calls("run")[-1]["args"]
    given = [
        "--shm-size=1g",
        "--ulimit=memlock=-1",
        "--hostname=trainer",
        "--read-only",
        "--network=none",
        "--label=project=x",
        "--tmpfs=/scratch:size=1g,noexec",
        "--entrypoint=",
        "--pull=never",
    ]
    assert run[1 : 1 + len(given)] == given and run[1 + len(given)] == "--rm"
    assert run[run.index("--user") + 1] == f"{bob.pw_uid}:{bob.pw_gid}"


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_real_runtime_runs_the_owners_mounts_and_takes_the_allowed_options(team, users, runtime: str) -> None:
    """The same, with a real rootless podman of a member's own and a real docker (installed by
    the test where missing; docker only where the admin allows it, its socket the team's): the
    options as gpuq writes them (one argument each, before gpuq's own) are ones the runtime
    accepts, the owner's mount is what the container sees, and (podman) a root-only directory
    cannot be mounted at all."""
    import real_runtimes

    member, dockerd, pod = BOB, None, None
    try:
        if runtime == "podman":
            pod = real_runtimes.MemberPodman(team.base / "podman", f"gqt-pod-{os.getpid() % 100000}", TEAM)
            member, env = pod.name, pod.env
            team.users = {**team.users, member: pod.user}
        else:
            dockerd = real_runtimes.Dockerd(group=TEAM)
            env = dockerd.env
    except real_runtimes.RuntimeUnavailable as e:
        pytest.skip(f"{runtime} cannot run containers here: {e}")
    try:
        owner = team.users[member]
        files = _root_only(team)
        work = _workdir(team, owner)
        data = work / "data"
        team.run_as(member, ["/bin/sh", "-c", f"mkdir {data} && echo owner-data > {data}/marker"])
        team.write_config(container_env=env, allow_docker=runtime == "docker")
        team.start_worker("a", "1x80GiB")
        options = [
            "--read-only",
            "--network=none",
            "--hostname=trainer",
            "--shm-size=64m",
            "--tmpfs=/scratch",
            "--pull=never",
        ]
        command = "cat /data/marker; id -u; echo $(cat /etc/hostname); touch /not-here 2>/dev/null || echo read-only"
        image = f'"image": "{real_runtimes.IMAGE}", "runtime": "{runtime}"'
        for job_id, source in (("real", data), ("roots", files["DIR"])):
            text = _spec(options, command, work, [f"{source}:/data:ro"]).replace(
                '"image": "img", "runtime": "docker"', image
            )
            team.drop_as(member, f"{job_id}.yaml", text)
        final = wait_until(lambda: team.finished("real"), timeout=120, what=f"the {runtime} job")
        log = team.log("real")
        assert final["state"] == "done", log
        assert f"\nowner-data\n{owner.pw_uid}\ntrainer\nread-only\n" in log
        assert f"--volume {data}:/data:ro" in log and f"{runtime} run --read-only" in log
        roots = wait_until(lambda: team.finished("roots"), timeout=120, what="the root-only mount")
        if runtime == "podman":  # the kernel's no, in the member's own user namespace: at the
            # mount (the container fails to start) or at the read (the shell goes on past `cat`)
            said = team.log("roots")
            assert "root-owned line" not in said, said
            assert roots["state"] == "failed" or "/data/marker': Permission denied" in said, said
        else:  # docker's daemon is root: the containers extra's README.md says so, and allow_docker is the admin's yes
            assert roots["state"] == "done", team.log("roots")
    finally:
        if dockerd is not None:
            dockerd.stop()
        if pod is not None:
            team.close()  # its jobs first: then the member goes
            pod.stop()


# --- from the boundary's attack session (tests/test_attacks_boundary.py): F1 -------------------


def _bobs_dir(team, users, name: str) -> Path:
    d = team.base / name
    d.mkdir()
    os.chown(d, users[BOB].pw_uid, users[BOB].pw_gid)
    return d


# --- F1: a spec's env never reaches a container's client --------------------------------------


def test_a_specs_path_and_ld_preload_never_reach_the_container_client(team, users):
    """F1: the root worker ran docker/podman as root with the spec's env merged in, looked up
    on that PATH: bob's `podman` script (and an LD_PRELOAD of his) ran as uid 0. Now the client
    is the admin's, run as bob with a clean environment; his variables reach only the job."""
    bob = users[BOB]
    runtimes = fake_runtime.StandIns(team.base / "runtimes", team.python)
    try:
        home = _bobs_dir(team, users, "bobhome")
        evil_bin = home / "bin"
        proof = team.base / "flags"
        proof.mkdir(mode=0o777)
        proof.chmod(0o777)
        team.run_as(BOB, ["/bin/sh", "-c", f"mkdir {evil_bin}"])
        trap = f"#!/bin/sh\nid -u >> {proof}/bobs-podman-ran\nexit 0\n"
        team.run_as(BOB, ["/bin/sh", "-c", f"cat > {evil_bin}/podman && chmod 755 {evil_bin}/podman"], input=trap)
        team.write_config(container_clients={"podman": str(runtimes.bin / "podman")})
        team.start_worker("a", "1x80GiB")
        spec = (
            "command: 'echo inside PATH=$PATH PRELOAD=$LD_PRELOAD; id -u'\ngpus: 0\n"
            f"workdir: {home}\ncontainer: {{image: any/image, runtime: podman}}\n"
            f'env: {{PATH: "{evil_bin}:/usr/bin:/bin", LD_PRELOAD: "{home}/evil.so"}}\n'
        )
        team.drop_as(BOB, "f1.yaml", spec)
        record = wait_until(lambda: team.finished("f1"), timeout=30, what="f1 to end")
        log = team.log("f1")
        assert record["state"] == "done", log
        assert not (proof / "bobs-podman-ran").exists(), "bob's own podman ran"
        run = runtimes.calls("run")[-1]
        assert run["uid"] == bob.pw_uid, run  # the admin's client, as bob: never root
        assert f"inside PATH={evil_bin}:/usr/bin:/bin PRELOAD={home}/evil.so" in log  # his env: the job's
        assert not [a for a in run["args"] if str(evil_bin) in a or "evil.so" in a]  # never on argv
    finally:
        runtimes.close()


def test_a_team_queue_runs_docker_only_where_the_admin_allows_it(team, users):
    """docker's daemon is root's: a member who may run docker jobs can become root. A team
    queue waits a docker job, saying so, until config allow_docker."""
    runtimes = fake_runtime.StandIns(team.base / "runtimes", team.python)
    try:
        team.write_config(container_clients={"docker": str(runtimes.bin / "docker")})
        team.start_worker("a", "1x80GiB")
        work = _bobs_dir(team, users, "work")
        team.drop_as(BOB, "dk.yaml", f"command: 'id -u'\ngpus: 0\nworkdir: {work}\ncontainer: any/image\n")
        reason = wait_until(
            lambda: next((j["reason"] for j in team.status()["pending"] if j["id"] == "dk"), None),
            what="dk to wait with a reason",
        )
        assert "docker" in reason, reason
        assert runtimes.calls("run") == []
        team.write_config(container_clients={"docker": str(runtimes.bin / "docker")}, allow_docker=True)
        team.stop_worker("a")
        team.start_worker("a", "1x80GiB")
        assert wait_until(lambda: team.finished("dk"), timeout=30, what="dk to run")["state"] == "done"
        assert runtimes.calls("run")[-1]["uid"] == users[BOB].pw_uid
    finally:
        runtimes.close()
