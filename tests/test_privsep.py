"""The privilege boundary (docs/security.md, "What runs as root"), as a team on README's setup
meets it: the root part's orders checked on their own, a job that inherits nothing but its
stdio, and an audit of every process that keeps root while members' jobs of every kind run.

Each test was seen failing on the code before the boundary (the worker, its spawner and its
supervisors ran as root there; a job inherited the lock file's descriptor)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from team import ALICE, BOB, EVE, needs_root

from conftest import REPO, wait_until
from gpuq import hooks

pytestmark = needs_root

_WORKER = """
import json, os, sys
from gpuq.host import rootorders, wire
orders = rootorders.orders()
out = {}
def order(name, do):
    try:
        out[name] = do()
    except wire.Refused as e:
        out[name] = "refused: " + str(e)
ROOT = sys.argv[1]
def spec(name):
    return os.open(os.path.join(ROOT, "jobs", name), os.O_RDONLY)
def run(uid, fd, argv=("sh", "-c", "id -u; ls /proc/$$/fd")):
    status, text = orders.run(uid, list(argv), {"PATH": "/usr/bin:/bin"}, fd)
    return [status, text.split()]
"""


def _as_queue_account(team, code: str, timeout: float = 60) -> dict:
    """Run `code` as the queue's "worker" under a real starter (root, host/privsep.serve), for
    the team's root; returns what it put in `out`."""
    boot = f"import sys; sys.path.insert(0, {str(team.code)!r})\n" + _WORKER + code + "\nprint(json.dumps(out))\n"
    starter = (
        f"import sys; sys.path.insert(0, {str(team.code)!r})\n"
        "from gpuq.host import privsep\n"
        f"account = privsep.Account.of_root({str(team.root)!r})\n"
        f"sys.exit(privsep.serve([{team.python!r}, '-I', '-c', {boot!r}, {str(team.root)!r}], account, "
        "{'PATH': '/usr/bin:/bin'}))\n"
    )
    done = subprocess.run([team.python, "-c", starter], capture_output=True, text=True, timeout=timeout, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_root_part_checks_each_order_on_its_own(team, users):
    """Whatever the queue's account asks (its code may have a bug, or be someone's), the root
    part runs nothing as root, as the queue account, as a non-member, or as anyone but the
    owner of the claimed spec it is shown; it gives away only the queue account's own plain
    files, and only to members."""
    alice, eve = users[ALICE].pw_uid, users[EVE].pw_uid
    queue_uid = os.stat(team.root / "state").st_uid
    team.drop_as(ALICE, "a.yaml", "command: x\n")
    team.drop_as(BOB, "b.yaml", "command: x\n")
    found = _as_queue_account(
        team,
        f"""
a, b = spec("a.yaml"), spec("b.yaml")
order("as root", lambda: run(0, a))
order("as the queue account", lambda: run({queue_uid}, a))
order("as eve", lambda: run({eve}, a))
order("as alice, bob's spec", lambda: run({alice}, b))
order("as alice, no spec", lambda: run({alice}, None))
order("as alice", lambda: run({alice}, a))
mine = os.open(os.path.join(ROOT, "state", "given"), os.O_RDWR | os.O_CREAT, 0o640)
order("give to eve", lambda: orders.give(mine, {eve}))
order("give bob's file", lambda: orders.give(b, {alice}))
os.link(os.path.join(ROOT, "state", "given"), os.path.join(ROOT, "state", "given2"))
order("give a file with two links", lambda: orders.give(mine, {alice}))
os.unlink(os.path.join(ROOT, "state", "given2"))
order("give to alice", lambda: orders.give(mine, {alice}) or os.fstat(mine).st_uid)
order("an unknown order", lambda: orders._ask({{"op": "chown"}}, [mine], 10))
""",
    )
    assert found["as root"] == "refused: a team queue never runs anything as root"
    assert found["as the queue account"] == "refused: the queue's own account runs no jobs"
    assert found["as eve"].startswith(f"refused: {EVE} is not in the queue's group")
    assert found["as alice, bob's spec"] == f"refused: the claimed spec is not a plain file of {ALICE}'s"
    assert found["as alice, no spec"] == "refused: a start shows the claimed spec"
    status, words = found["as alice"]
    assert status == 0 and words[0] == str(alice), found  # her uid, and nothing but 0, 1, 2 open
    assert words[1:] == ["0", "1", "2"], f"the job inherited more than its stdio: {words}"
    assert found["give to eve"].startswith(f"refused: {EVE} is not in the queue's group")
    assert found["give bob's file"] == "refused: only a file of the queue's account is given"
    assert found["give a file with two links"] == "refused: only a plain file with one link is given"
    assert found["give to alice"] == alice
    assert found["an unknown order"] == "refused: unknown order 'chown'"
    assert queue_uid != 0 and os.stat(team.root / "state" / "given").st_uid == alice


def test_a_teams_worker_and_supervisors_run_as_the_queue_account_and_jobs_as_their_owners(team, users):
    """README's setup: `gpuq init --group` made the queue account; root starts the worker;
    every gpuq process but the starter and the keepers runs as the queue account, in `/`, with
    nothing but the stdlib and gpuq's code on sys.path; the job runs as alice, in her workdir."""
    import psutil

    work = team.base / "alice-work"
    work.mkdir()
    os.chown(work, users[ALICE].pw_uid, users[ALICE].pw_gid)
    team.start_worker("a", "1x80GiB")
    go = work / "go"
    team.drop_as(
        ALICE,
        "al.yaml",
        f"command: id -u; pwd; ls /proc/$$/fd; while [ ! -e {go} ]; do sleep 0.05; done\ngpus: 0\nworkdir: {work}\n",
    )
    wait_until(lambda: f"\n{work}\n" in team.log("al"), what="al to run (it printed its workdir)")
    queue_uid = os.stat(team.root / "state").st_uid
    starter = psutil.Process(team.workers["a"].pid)
    seen: dict[str, list[int]] = {}
    for p in starter.children(recursive=True):
        try:
            cmd, uid, cwd = " ".join(p.cmdline()), p.uids().effective, p.cwd()
        except psutil.Error:
            continue
        kind = (
            "worker"
            if "worker_run" in cmd
            else "spawner"
            if "gpuq.run.spawner" in cmd
            else "job"
            if uid == users[ALICE].pw_uid
            else "keeper"
            if uid == 0
            else "other"
        )
        seen.setdefault(kind, []).append(uid)
        if kind in ("worker", "spawner"):
            assert cwd == "/" and " -I " in f" {cmd} ", (kind, cmd, cwd)
    assert set(seen["worker"]) == set(seen["spawner"]) == {queue_uid}, seen
    assert seen.get("keeper") and seen.get("job"), seen
    go.touch()
    record = wait_until(lambda: team.finished("al"), what="al to finish")
    lines = team.log("al").splitlines()
    assert record["state"] == "done" and str(users[ALICE].pw_uid) in lines and str(work) in lines
    fds = lines[lines.index(str(work)) + 1 : lines.index(str(work)) + 4]
    assert fds == ["0", "1", "2"], f"the job inherited more than its stdio: {lines}"


def _audited(team, path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_every_process_that_keeps_root_touches_nothing_a_member_can_write(team, users):
    """The proof that can fail: every process that keeps root (the starter, its keepers, root's
    CLI) runs with an audit hook (gpuq/host/audit.py) while members' jobs of each kind run
    (plain, venv, conda, a container through a stand-in client, MPS through a stand-in control
    program, an array, a retry, a cancel). No open, listing, chdir, import, exec or signal of
    theirs touches a path a member can write or a process they did not start, and every gpuq
    function that acted as root is one docs/security.md lists."""
    import fake_runtime
    from fake_mps import STAND_IN, end_stand_in_daemons

    mps = bool(hooks.registry().gpu_sharing)  # the mps extra (not in a core without it)
    audit = team.base / "audit.jsonl"
    queue_uid = os.stat(team.root / "state").st_uid
    env = {"GPUQ_TEST_AUDIT": str(audit), "GPUQ_TEST_AUDIT_TRUST": str(queue_uid)}
    work = team.base / "work"
    work.mkdir(exist_ok=True)
    venv = work / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f"VIRTUAL_ENV={venv}; export VIRTUAL_ENV\n")
    conda = work / "conda"  # a stand-in conda: what `conda shell.posix activate` prints
    conda.write_text(
        "#!/bin/sh\n[ \"$1 $2\" = 'shell.posix activate' ] || exit 2\necho \"export CONDA_DEFAULT_ENV='$3'\"\n"
    )
    conda.chmod(0o755)
    for path in (work, venv, venv / "bin", venv / "bin" / "activate", conda):
        os.chown(path, users[ALICE].pw_uid, users[ALICE].pw_gid)
    # A trap in the member's workdir: root must never import it (F2).
    for module in ("datetime", "base64", "glob", "json", "socket"):
        (work / f"{module}.py").write_text(f"open({str(team.base / 'imported-as-root')!r}, 'a').write('{module}')\n")
    mps_bin = team.base / "mps-bin"
    mps_bin.mkdir()
    (mps_bin / "nvidia-cuda-mps-control").write_text(STAND_IN)
    (mps_bin / "nvidia-cuda-mps-control").chmod(0o755)
    runtimes = fake_runtime.StandIns(team.base / "runtimes", team.python)
    try:
        team.write_config(gpu_sharing="mps", container_clients={"podman": str(runtimes.bin / "podman")})
        team.start_worker("a", "1x80GiB", env={**env, "PATH": f"{mps_bin}:{os.environ['PATH']}"})
        kinds = {
            "plain": "command: echo plain\ngpus: 0\n",
            "venv": f"command: echo venv-$VIRTUAL_ENV\ngpus: 0\nvenv: {venv}\n",
            "conda": f"command: echo conda-$CONDA_DEFAULT_ENV\ngpus: 0\nconda: torch\nenv: {{CONDA_EXE: {conda}}}\n",
            "array": "command: echo task-$GPUQ_ARRAY_INDEX\ngpus: 0\narray: 0-2\n",
            "failing": "command: exit 3\ngpus: 0\n",
        }
        if "container" in hooks.registry().spec_fields:  # the containers extra (not in a core without it)
            kinds["boxed"] = "command: echo boxed\ngpus: 0\ncontainer: {image: img, runtime: podman}\n"
        if mps:  # the mps extra's daemons, started by the root part's `mps` order
            kinds["mps1"] = "command: echo PIPE=$CUDA_MPS_PIPE_DIRECTORY\ngpu_mem: 4GiB\n"
        for name, text in kinds.items():
            team.drop_as(ALICE, f"{name}.yaml", text + f"workdir: {work}\n")
        team.drop_as(BOB, "long.yaml", "command: sleep 60\ngpus: 0\nworkdir: /\ntime_limit: 1h\nmem: 1GiB\n")
        for name in [k for k in kinds if k != "array"]:
            wait_until(lambda name=name: team.finished(name), timeout=30, what=f"{name} to finish")
        wait_until(lambda: all(team.finished(f"array_{i}") for i in range(3)), what="the array")
        said = {"venv": f"venv-{venv}", "conda": "conda-torch", "boxed": "boxed", "mps1": "PIPE=/"}
        for name in said.keys() & kinds.keys():
            assert team.finished(name)["state"] == "done" and said[name] in team.log(name), (name, team.log(name))
        if "boxed" in kinds:
            assert runtimes.calls("run")[-1]["uid"] == users[ALICE].pw_uid
        wait_until(lambda: (team.record("long") or {}).get("state") == "running", what="bob's long job")
        retried = team.as_user(ALICE, "retry", "failing")
        assert retried.returncode == 0, retried.stderr
        cancelled = team.as_user(BOB, "cancel", "long")
        assert cancelled.returncode == 0, cancelled.stderr
        wait_until(lambda: (team.finished("long") or {}).get("state") == "cancelled", what="long cancelled")
        wait_until(lambda: (team.finished("failing") or {}).get("attempt") == 2, what="the retry")
        for verb in (["status"], ["hold", "nothing-here"]):  # root's own CLI, audited too
            subprocess.run(
                [*team.cli_command(), "--root", str(team.root), *verb],
                capture_output=True,
                text=True,
                env={**os.environ, **env},
            )
        team.stop_worker("a")
    finally:
        runtimes.close()
        end_stand_in_daemons(mps_bin)
    events = _audited(team, audit)
    assert events, "the audit hook recorded nothing: it was not installed"
    assert not [e for e in events if "error" in e], [e for e in events if "error" in e][:3]
    touched = [e for e in events if e.get("member")]
    assert not touched, json.dumps(touched[:5], indent=1)
    assert not (team.base / "imported-as-root").exists()
    functions, modules = documented_as_root()
    acted = {e["by"] for e in events if e.get("by") and not e["by"].endswith(":<module>")}
    imported = {e["by"].split(":")[0] for e in events if (e.get("by") or "").endswith(":<module>")}
    assert acted <= functions, f"acted as root, not in docs/security.md: {sorted(acted - functions)}"
    assert imported <= modules, f"imported as root, not in docs/security.md: {sorted(imported - modules)}"
    assert {"gpuq.host.keeper:_signal_job"} | ({"gpuq.host.privsep:_mps"} if mps else set()) <= acted, acted


def documented_as_root() -> tuple[set[str], set[str]]:
    """docs/security.md's lists of what runs as root: gpuq functions (`module:function`) and
    the modules root imports."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    section = text.split("## What runs as root", 1)[1].split("\n## ", 1)[0]
    names = set(re.findall(r"`(gpuq[\w.]*(?::\w+)?)`", section))
    return {n for n in names if ":" in n}, {n for n in names if ":" not in n}


MUTANTS = {  # the boundary switched off in one place each; the audit must see it
    "the job keeps root": (
        '        if os.geteuid() == 0 and who.uid != 0:\n            step = "switch to the job\'s owner"',
        '        if False:\n            step = "switch to the job\'s owner"',
    ),
    "the job enters its workdir before it drops": (
        "        os.setpgid(0, 0)\n",
        "        os.chdir(order['cwd'])\n        os.setpgid(0, 0)\n",
    ),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_the_audit_sees_the_boundary_switched_off(team, users, mutant):
    """The check can fail: run from a copy of the code with the boundary switched off in one
    place, one ordinary job of alice's is enough for the audit to record root in her world."""
    old, new = MUTANTS[mutant]
    code = Path(tempfile.mkdtemp(prefix="gpuq-mutant-"))
    try:
        shutil.copytree(team.code, code, dirs_exist_ok=True)
        keeper_py = code / "gpuq" / "host" / "keeper.py"
        text = keeper_py.read_text()
        assert text.count(old) == 1, f"the mutant's anchor moved: {old!r}"
        keeper_py.write_text(text.replace(old, new))
        subprocess.run(["chmod", "-R", "go+rX,go-w", str(code)], check=True)
        team.code = code
        audit = team.base / "audit.jsonl"
        queue_uid = os.stat(team.root / "state").st_uid
        work = team.base / "work"
        work.mkdir()
        os.chown(work, users[ALICE].pw_uid, users[ALICE].pw_gid)
        team.start_worker("a", "1x80GiB", env={"GPUQ_TEST_AUDIT": str(audit), "GPUQ_TEST_AUDIT_TRUST": str(queue_uid)})
        team.drop_as(ALICE, "al.yaml", f"command: echo hi\ngpus: 0\nworkdir: {work}\n")
        wait_until(lambda: team.finished("al") or team.record("al"), what="alice's job to be taken")
        wait_until(lambda: [e for e in _audited(team, audit) if e.get("member")], what=f"the audit to see: {mutant}")
    finally:
        shutil.rmtree(code, ignore_errors=True)


STARTER_COUNTING_SELECTS = """
import os, select, sys
from gpuq.host import privsep
calls = [0]
real = select.select
def counted(*args):
    calls[0] += 1
    return real(*args)
privsep.select.select = counted
me = privsep.Account(os.getuid(), os.getgid())
closes_then_works = 'eval "exec $%s>&-"; sleep 2' % privsep.WORKER_FD_ENV
code = privsep.serve(['/bin/sh', '-c', closes_then_works], me, dict(os.environ))
print(code, calls[0])
"""


EMPTY_MESSAGE_THEN_AN_ORDER = """
import json, os, socket
sock = socket.socket(fileno=int(os.environ[%r]))
sock.send(b"")
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
socket.send_fds(sock, [json.dumps({"op": "nope"}).encode()], [theirs.fileno()])
mine.settimeout(30)
print(mine.recv(65536).decode())
"""


HOSTILE_REPLIES_THEN_AN_ORDER = """
import json, os, socket
sock = socket.socket(fileno=int(os.environ[%r]))
order = json.dumps({"op": "nope"}).encode()
r, w = os.pipe()
socket.send_fds(sock, [order], [r])  # a pipe where the reply socket goes
full, kept = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
full.setblocking(False)
try:
    while True:
        kept.send(b"x" * 4096, socket.MSG_DONTWAIT)  # fills full's queue: nothing more goes to it
except BlockingIOError:
    pass
socket.send_fds(sock, [order], [kept.fileno()])  # an answer on kept would wait for ever
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
socket.send_fds(sock, [order], [theirs.fileno()])
mine.settimeout(30)
print(mine.recv(65536).decode())
"""


@pytest.mark.slow
def test_a_reply_descriptor_that_is_no_socket_or_a_full_one_neither_stops_nor_blocks_the_starter(tmp_path):
    """The queue's side chooses the reply descriptor: a pipe made root's starter raise out of
    its loop (the worker killed with it), and a socket whose other end is full and kept open
    blocked it for good (answering nothing, reaping no one). It answers the order after both."""
    worker = tmp_path / "worker.py"
    worker.write_text(HOSTILE_REPLIES_THEN_AN_ORDER % "GPUQ_STARTER_FD")
    starter = (
        "import os, sys\nfrom gpuq.host import privsep\n"
        "me = privsep.Account(os.getuid(), os.getgid())\n"
        f"sys.exit(privsep.serve([{sys.executable!r}, {str(worker)!r}], me, dict(os.environ)))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", starter], cwd=REPO, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the starter blocked on a reply socket whose other end is full")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"error": "unknown order 'nope'"}, done.stdout


@pytest.mark.slow
def test_an_empty_message_is_no_end_of_file_and_the_starter_answers_the_next_order(tmp_path):
    """An empty message reads as zero bytes, as the end of file does: the starter must not take
    it for the worker's going, and must answer the orders after it."""
    worker = tmp_path / "worker.py"
    worker.write_text(EMPTY_MESSAGE_THEN_AN_ORDER % "GPUQ_STARTER_FD")
    starter = (
        "import os, sys\nfrom gpuq.host import privsep\n"
        "me = privsep.Account(os.getuid(), os.getgid())\n"
        f"sys.exit(privsep.serve([{sys.executable!r}, {str(worker)!r}], me, dict(os.environ)))\n"
    )
    done = subprocess.run([sys.executable, "-c", starter], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"error": "unknown order 'nope'"}, done.stdout


@pytest.mark.slow
def test_the_starter_waits_for_a_worker_that_closed_its_order_socket_without_spinning():
    """A worker closes its end of the order socket before it exits (a --once worker does so
    after its pass): the end of file stays readable, and a starter that kept selecting on it
    spun a core until the worker was reaped. It answers no more orders and waits."""
    done = subprocess.run(
        [sys.executable, "-c", STARTER_COUNTING_SELECTS], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    code, selects = map(int, done.stdout.split())
    assert code == 0
    # The worker's two seconds: the order, its end of file, SIGCHLD, and a 1-s timeout or two.
    assert selects < 10, selects
