"""`gpuq init` and `gpuq doctor`, through the CLI: a root made ready for a team, and each
finding with the command that fixes it (NFS options, permissions, clocks, versions, cron)
from a stand-in mount table and hand-made heartbeats."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from team import ALICE, QUEUE, TEAM, needs_root

from conftest import PY, REPO
from gpuq import __version__


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return subprocess.run(
        [PY, str(REPO / "gpuq.py"), *args], capture_output=True, text=True, timeout=60, env={**clean, **(env or {})}
    )


@pytest.mark.slow
@needs_root
def test_init_makes_a_team_root_and_prints_the_cron_line(tmp_path, users):
    root = tmp_path / "queue"
    out = run("init", str(root), "--group", TEAM, "--queue-user", QUEUE)
    assert out.returncode == 0, out.stderr
    installed = Path(PY).parent / "gpuq-worker"  # README's line where pip installed it, else the checkout's
    starts = str(installed) if installed.exists() else f"{PY} {REPO / 'worker.py'}"
    assert f"* * * * * {starts} --root {root}" in out.stdout
    assert (root / "config.yaml").read_text() == (REPO / "config.yaml").read_text()
    jobs = os.stat(root / "jobs").st_mode
    assert jobs & stat.S_ISVTX and jobs & stat.S_ISGID and jobs & stat.S_IWGRP and not jobs & stat.S_IRWXO
    for inbox in ("jobs", "requests"):  # the only places members create files (docs/security.md)
        assert stat.S_IMODE(os.stat(root / inbox).st_mode) == 0o3770
    for mine in ("", "state", "state/control", "state/running", "logs"):  # the worker's; the team reads
        assert stat.S_IMODE(os.stat(root / mine).st_mode) == 0o2750
    assert stat.S_IMODE(os.stat(root / "config.yaml").st_mode) == 0o644
    queue = pwd.getpwnam(QUEUE)  # made by init: a system account, whose the spool is
    assert queue.pw_uid < 1000 and queue.pw_shell.endswith(("nologin", "false"))
    assert [os.stat(root / d).st_uid for d in ("state", "logs", "config.yaml")] == [queue.pw_uid, queue.pw_uid, 0]
    # A second box: init again makes the queue's account there with the uid state/ has. Here a
    # low system uid (useradd hands system accounts out from the top: a copy of the suite
    # beside this one, making its own, took the uid that userdel freed, and init rightly
    # refused, "UID 988 is not unique"), from a block of this process's own: the copy beside
    # it, picking by the same rule from a shared range, took this one's uid for its usermod
    # below ("UID 388 is not unique").
    block = 200 + (os.getpid() % 100) * 8
    free = [u for u in range(block, block + 8) if not _uid_taken(u)]
    uid = free[0]
    subprocess.run(["chown", "-R", f"--from={queue.pw_uid}", str(uid), str(root)], check=True)
    subprocess.run(["userdel", QUEUE], check=True)
    second = run("init", str(root), "--group", TEAM, "--queue-user", QUEUE)
    assert second.returncode == 0 and f"made the queue's account {QUEUE} (uid {uid}," in second.stdout, second.stderr
    queue = pwd.getpwnam(QUEUE)
    assert queue.pw_uid == uid == os.stat(root / "state").st_uid
    for other in free[1:]:  # a box where it was made by hand, otherwise
        # A free uid, taken in one step: a system account made meanwhile may take one between
        # a look and usermod (usermod then exits 4: taken).
        if subprocess.run(["usermod", "-u", str(other), QUEUE], capture_output=True).returncode == 0:
            break
    assert pwd.getpwnam(QUEUE).pw_uid != uid, f"no free uid in {block}-{block + 7} for the mismatch"
    try:
        mismatch = run("init", str(root), "--group", TEAM, "--queue-user", QUEUE)
        assert mismatch.returncode == 2 and f"Fix: `usermod -u {queue.pw_uid} {QUEUE}`" in mismatch.stderr
        assert os.stat(root / "state").st_uid == queue.pw_uid  # nothing handed to the wrong uid
    finally:
        subprocess.run(["usermod", "-u", str(queue.pw_uid), QUEUE], check=True)
    person = run("init", str(tmp_path / "other"), "--group", TEAM, "--queue-user", ALICE)
    assert person.returncode == 2 and "a person's account" in person.stderr, person.stderr
    assert not (tmp_path / "other").exists()
    again = run("init", str(root))
    assert again.returncode == 2 and "already a gpuq root" in again.stderr
    bad = run("init", str(tmp_path / "other"), "--group", "no-such-group-xyz")
    assert bad.returncode == 2 and "groupadd no-such-group-xyz" in bad.stderr
    assert not (tmp_path / "other").exists()


def _root(tmp_path):
    root = tmp_path / "root"
    assert run("init", str(root)).returncode == 0
    return root


def _beat(root, host: str, t: float, mtime: float, version: str = __version__, **extra) -> None:
    path = root / "state" / "workers" / f"{host}.json"
    path.write_text(
        json.dumps({"host": host, "t": t, "seq": 1, "version": version, "gpus": [], "poll_interval": 1.0, **extra})
    )
    os.utime(path, (mtime, mtime))


def _findings(root, env=None) -> tuple[int, dict[str, list[dict]]]:
    out = run("--root", str(root), "doctor", "--json", env=env)
    by_check: dict[str, list[dict]] = {}
    for f in json.loads(out.stdout)["findings"]:
        by_check.setdefault(f["check"], []).append(f)
    return out.returncode, by_check


def _nvml_works() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.slow
def test_doctor_names_each_problem_with_its_fix(tmp_path):
    root = _root(tmp_path)
    now = time.time()
    _beat(
        root,
        "box-a",
        now,
        now,
        runtimes={"podman": "4.3.1"},
        runtime_problems={"docker": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock"},
    )
    _beat(root, "box-b", now + 7, now, version="0.0.9")  # its clock is 7 s ahead; an old gpuq
    os.chmod(root / "jobs", 0o777)  # shared, not sticky
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "1 0 0:1 / / rw - ext4 /dev/vda rw\n"
        f"2 1 0:2 / {root} rw,relatime - nfs4 server:/export rw,vers=4.2,actimeo=30\n"
    )
    code, found = _findings(root, {"GPUQ_TEST_MOUNTINFO": str(mountinfo)})
    assert code == 1
    perm = found["permissions"][0]
    assert perm["level"] == "fail" and perm["fix"] == f"chmod +t {root / 'jobs'}"
    nfs = {f["fix"] for f in found["nfs"]}
    assert nfs == {
        f"mount {root} with -o lookupcache=positive (or none)",
        f"mount {root} with -o acdirmax=1 (or actimeo=1)",
        # a shared root on sec=sys: whoever is root on any client can claim any uid
        "let no member be root on a client that mounts it, or export it with sec=krb5 (docs/security.md, Shared disks)",
    }
    clocks = found["clocks"][0]
    assert clocks["level"] == "warn" and "differ by 7.0 s" in clocks["message"] and "chrony" in clocks["fix"]
    version = found["version"][0]
    assert version["level"] == "fail" and "box-b runs gpuq 0.0.9" in version["message"]
    nvml = found["nvml"][0]  # this machine's NVML: a GPU box has it, CI has not
    if _nvml_works():
        assert nvml["level"] == "ok"
    else:
        assert nvml["level"] == "warn" and "NVML is not usable" in nvml["message"] and "--fake-gpus" in nvml["fix"]
    cron = found["cron"][0]  # nothing here starts a worker for this new root
    assert (
        cron["level"] == "fail"
        and f"starts a gpuq worker for {root}" in cron["message"]
        and cron["fix"].endswith((f"/gpuq-worker --root {root}", f"worker.py --root {root}"))
    )
    docker, podman = found["containers"]
    assert docker["level"] == "warn" and "box-a: docker is installed but unusable: Cannot connect" in docker["message"]
    assert "systemctl start docker" in docker["fix"] and podman == {
        "level": "ok",
        "check": "containers",
        "message": "box-a: podman 4.3.1",
        "fix": "",
    }
    text = run("--root", str(root), "doctor", env={"GPUQ_TEST_MOUNTINFO": str(mountinfo)}).stdout
    assert "FAIL permissions" in text and "fix: chmod +t" in text


@pytest.mark.slow
def test_doctor_refuses_a_local_dir_on_nfs_and_is_quiet_on_a_sound_root(tmp_path):
    root = _root(tmp_path)
    now = time.time()
    _beat(root, "box-a", now, now)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("1 0 0:1 / / rw - nfs4 server:/export rw,lookupcache=positive,actimeo=1\n")
    code, found = _findings(root, {"GPUQ_TEST_MOUNTINFO": str(mountinfo)})
    assert (
        found["local_dir"][0]["level"] == "fail" and "local_dir: /var/tmp/gpuq-{host}" in found["local_dir"][0]["fix"]
    )
    assert "nfs" not in found  # lookupcache=positive and actimeo=1: nothing to say
    assert found["permissions"][0]["level"] == "ok" and found["clocks"][0]["level"] == "ok"


def _complete(tmp_path, root, words: list[str]) -> list[str]:
    """Run the generated bash completion for `words` (the last one being completed)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gpuq").write_text(f'#!/bin/sh\nexec {PY} {REPO / "gpuq.py"} "$@"\n')
    (bin_dir / "gpuq").chmod(0o755)
    script = run("completion", "bash").stdout
    quoted = " ".join(f"'{w}'" for w in ["gpuq", "--root", str(root), *words])
    probe = f'{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={len(words) + 2}; _gpuq; printf "%s\\n" "${{COMPREPLY[@]}}"'
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")},
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
    }
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    return [w for w in out.stdout.splitlines() if w]


@pytest.mark.slow
def test_bash_completion_offers_verbs_options_ids_and_hosts(tmp_path):
    root = _root(tmp_path)
    for name in ("train-1", "train-2", "eval-1"):
        (root / "jobs" / f"{name}.yaml").write_text("command: 'true'\n")
    (root / "state" / "finished" / "train-0.json").write_text("{}")
    _beat(root, "box-a", time.time(), time.time())
    assert _complete(tmp_path, root, ["dr"]) == ["drain"]
    assert "--after-any" in _complete(tmp_path, root, ["submit", "--af"])
    assert _complete(tmp_path, root, ["cancel", "tr"]) == ["train-0", "train-1", "train-2"]
    assert _complete(tmp_path, root, ["drain", ""]) == ["box-a"]
    assert "bashcompinit" in run("completion", "zsh").stdout


def test_zsh_completion_through_bashcompinit(tmp_path):
    import shutil

    import pytest

    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed here (the bash test covers the shared function)")
    root = _root(tmp_path)
    (root / "jobs" / "train-1.yaml").write_text("command: 'true'\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gpuq").write_text(f'#!/bin/sh\nexec {PY} {REPO / "gpuq.py"} "$@"\n')
    (bin_dir / "gpuq").chmod(0o755)
    # bashcompinit calls the function under `emulate -L sh` (0-based arrays), as here
    probe = (
        f'eval "$(gpuq completion zsh)"; t() {{ emulate -L sh; local -a COMP_WORDS; '
        f'COMP_WORDS=(gpuq --root {root} cancel tr); COMP_CWORD=4; _gpuq; print -l -- "${{COMPREPLY[@]}}"; }}; t'
    )
    out = subprocess.run(
        ["zsh", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)},
    )
    assert out.stdout.split() == ["train-1"], out.stderr


@pytest.mark.slow
def test_the_nvml_check_says_ok_with_the_driver_and_warns_with_the_error(monkeypatch, tmp_path):
    """Both findings, whatever this machine has: a stand-in pynvml that works, and one that fails."""
    import types

    from gpuq.cli import doctor
    from gpuq.spool.layout import Layout

    layout = Layout(_root(tmp_path))  # this process's own: it runs the workers

    works = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetCount=lambda: 8,
    )
    monkeypatch.setitem(sys.modules, "pynvml", works)
    ok = doctor.check_nvml(layout)
    assert (ok.level, ok.check) == ("ok", "nvml") and ok.message.endswith(": driver 550.54.15, 8 GPU(s)")

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    warn = doctor.check_nvml(layout)
    assert warn.level == "warn" and warn.message.endswith(": NVML Shared Library Not Found")
    assert "--fake-gpus" in warn.fix and "nvidia-smi" in warn.fix


@pytest.mark.slow
def test_doctor_finds_only_a_cron_line_for_this_root(tmp_path):
    """Newcomer M9: doctor said `ok cron` for a root whose only crontab line was another
    root's. A system crontab (its own file; the commands do not exist, so a cron daemon that
    reads it meanwhile runs nothing) with another root's line, then with this root's."""
    import pytest

    if os.geteuid() != 0 or not os.path.isdir("/etc/cron.d"):
        pytest.skip("writes a system crontab: needs root and /etc/cron.d (CI runs as root)")
    root = _root(tmp_path)
    cron_file = f"/etc/cron.d/gpuq-test-doctor-{os.getpid()}"

    def cron_finding(line: str) -> dict:
        with open(cron_file, "w") as f:
            f.write(f"{line}\n")
        return _findings(root)[1]["cron"][0]

    try:
        other = cron_finding(f"* * * * * root /nonexistent/bin/gpuq-worker --root {tmp_path / 'other-root'}")
        assert other["level"] == "fail" and f"starts a gpuq worker for {root}" in other["message"], other
        checkout = cron_finding(f"* * * * * root cd {tmp_path / 'elsewhere'} && /nonexistent/python worker.py")
        assert checkout["level"] == "fail", checkout  # a checkout's worker.py serves its own root only
        this = cron_finding(f"* * * * * root /nonexistent/bin/gpuq-worker --root {root}")
        assert this["level"] in ("ok", "warn") and "starts the worker" in this["message"], this
    finally:
        os.unlink(cron_file)


@pytest.mark.slow
@needs_root
def test_init_never_writes_through_a_config_link_planted_in_its_directory(tmp_path, users):
    """`gpuq init DIR` on a directory that already exists: a config.yaml someone planted there
    as a dangling link must not make init (run as root, say) create the file it points to."""
    root = tmp_path / "queue"
    root.mkdir()
    target = tmp_path / "elsewhere" / "created-through-the-link"
    target.parent.mkdir()
    os.symlink(target, root / "config.yaml")
    out = run("init", str(root), "--group", TEAM, "--queue-user", QUEUE)
    assert not target.exists()
    assert out.returncode != 0 and "config.yaml" in out.stderr, out.stderr


def _uid_taken(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
