"""Attacks on a team's Slurm bridge (security review C7 and its [S] items), as created users
against the recommended setup: the bridge runs as the queue's account, and sbatch runs as
each job's owner, started by the root part (so Slurm takes the job as theirs: no --uid). Slurm
is stood in for by scripts on the bridge's PATH: `sbatch` logs the uid it runs as and its
arguments, and answers with a job id; `squeue` says every job is still pending, so the bridge
keeps following it and ends nothing."""

from __future__ import annotations

import json
import os
import signal
import stat
from pathlib import Path

import psutil
import pytest
from team import ALICE, BOB, needs_root

from conftest import wait_until

pytestmark = needs_root
SLURM_ID = "4242"


class StandInSlurm:
    """sbatch, squeue, scontrol and scancel on a directory put first on the bridge's PATH."""

    def __init__(self, base: Path) -> None:
        self.bin = base / "fake-slurm"
        self.bin.mkdir()
        calls = base / "slurm-calls"  # sbatch runs as each job's owner: a place every member may write
        calls.mkdir()
        calls.chmod(0o1777)
        self.calls = calls / "sbatch-calls.log"
        self.calls.touch()
        self.calls.chmod(0o666)
        scripts = {
            # (its environment is whole before its call is logged: a test waits for the call)
            "sbatch": f"#!/bin/sh\nenv > {self.calls}.env.tmp && mv {self.calls}.env.tmp {self.calls}.env\n"
            f'echo "uid=$(id -u) args: $*" >> {self.calls}\n'
            f"cat > /dev/null\necho {SLURM_ID}\n",
            "squeue": f"#!/bin/sh\necho '{SLURM_ID} PENDING'\n",
            "scontrol": "#!/bin/sh\nexit 0\n",
            "scancel": f'#!/bin/sh\necho "uid=$(id -u) scancel: $*" >> {self.calls}\n',
        }
        for name, text in scripts.items():
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{os.environ['PATH']}", **extra}

    def submitted(self, job_id: str) -> list[str]:
        """The sbatch calls for `job_id` (its claim is in the --comment)."""
        lines = self.calls.read_text().splitlines() if self.calls.exists() else []
        return [line for line in lines if f"--comment=gpuq:{job_id}@" in line]


@pytest.fixture
def bridge(team):
    slurm = StandInSlurm(team.base)
    team.write_config(backend="slurm")
    return slurm


def paused(team, host: str) -> psutil.Process:
    proc = team.worker_process(host)
    wait_until(lambda: proc.status() == psutil.STATUS_STOPPED, timeout=30, what=f"{host} paused at its pause point")
    return proc


def rejected(team, job_id: str) -> bool:
    """Refused, with its reason written (the spec is moved first, its .error a moment later)."""
    return any((team.root / "state" / "rejected").glob(f"{job_id}*.error"))


def flip_to_link(team, job_id: str, target: Path) -> None:
    """bob replaces his pending jobs/<id>.yaml by a symlink to `target` (his own file: the
    sticky jobs/ lets him)."""
    jobs = team.root / "jobs"
    done = team.py_as(
        BOB,
        f"import os; os.symlink({str(target)!r}, {str(jobs / ('.' + job_id + '.lnk'))!r}); "
        f"os.rename({str(jobs / ('.' + job_id + '.lnk'))!r}, {str(jobs / (job_id + '.yaml'))!r})",
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("whose", ["alice's", "root's"])
def test_a_spec_flipped_to_a_link_between_intake_and_claim_is_never_submitted_as_its_target(team, bridge, users, whose):
    """C7: the bridge has read bob's spec and is about to claim it (paused there); bob swaps
    the file for a symlink to alice's file, or to a root-owned one. The claim takes the link.
    Before the fix, sbatch ran with --uid=alice, or without --uid at all (as root) for the
    root-owned target. Now the claimed file is checked itself: a link is refused."""
    bob, alice = users[BOB], users[ALICE]
    target = team.base / "notes.yaml"
    target.write_text("command: echo the target's own\ngpus: 0\n")
    if whose == "alice's":
        os.chown(target, alice.pw_uid, alice.pw_gid)
    team.start_worker("bridge", "1x80GiB", env=bridge.env(GPUQ_TEST_PAUSE_AT="bridge:planned"))

    # Unflipped, bob's own spec is submitted as bob: the stand-in and the pause point work.
    team.drop_as(BOB, "mine.yaml", "command: echo mine\ngpus: 0\n")
    paused(team, "bridge").send_signal(signal.SIGCONT)
    calls = wait_until(lambda: bridge.submitted("mine"), timeout=30, what="mine handed to the stand-in sbatch")
    # sbatch ran as bob himself (the root part started it so), never as root with --uid
    assert len(calls) == 1 and calls[0].startswith(f"uid={bob.pw_uid} args: --parsable --comment=gpuq:mine@")
    assert "--uid" not in calls[0]

    team.drop_as(BOB, "pwn.yaml", "command: id -u > /tmp/gpuq-bridge-pwned\ngpus: 0\n")
    stopped = paused(team, "bridge")
    flip_to_link(team, "pwn", target)
    stopped.send_signal(signal.SIGCONT)
    wait_until(lambda: rejected(team, "pwn") or bridge.submitted("pwn"), timeout=30, what="pwn refused or submitted")
    assert bridge.submitted("pwn") == [], f"pwn was submitted through a link to {whose} file"
    error = next((team.root / "state" / "rejected").glob("pwn*.error")).read_text()
    assert "is a symbolic link" in error
    assert team.record("pwn") is None  # no record as anyone
    assert target.read_text() == "command: echo the target's own\ngpus: 0\n"  # the target is untouched


def test_a_root_bridge_precreates_every_array_log_as_the_owner(team, bridge, users):
    """[S] A sweep's logs/<id>-<task>.log (Slurm's --output per array task) are created first,
    the owner's 0640, like <id>.log: never through a link planted in logs/ (which fails the
    hand-over instead)."""
    alice = users[ALICE]
    team.start_worker("bridge", "1x80GiB", env=bridge.env())
    sweep = "command: echo lr={lr}\ngpus: 0\nsweep: {lr: [1, 2, 3]}\n"
    team.drop_as(ALICE, "hp.yaml", sweep)
    wait_until(lambda: bridge.submitted("hp"), timeout=30, what="hp handed to the stand-in sbatch")
    assert bridge.submitted("hp")[0].startswith(f"uid={alice.pw_uid} args:")
    for task in range(3):
        st = os.lstat(team.root / "logs" / f"hp-{task}.log")
        assert stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_mode & 0o777) == (alice.pw_uid, 0o640)

    planted = team.root / "logs" / "hq-1.log"  # as a member could where logs/ was the team's
    os.symlink("/etc/gpuq-bridge-clobbered", planted)
    os.lchown(planted, users[BOB].pw_uid, users[BOB].pw_gid)
    team.drop_as(ALICE, "hq.yaml", sweep)
    failed = wait_until(lambda: team.finished("hq"), timeout=30, what="hq refused")
    assert failed["state"] == "failed" and "cannot hand to Slurm" in failed["reason"]
    assert bridge.submitted("hq") == [] and not os.path.lexists("/etc/gpuq-bridge-clobbered")


def test_a_root_bridge_hands_sbatch_the_owners_clean_environment_not_its_own(team, bridge, users):
    """M5 for the bridge: sbatch's --export=ALL gives the job sbatch's environment. A root
    bridge started with a secret of root's gives sbatch the owner's HOME and USER, a plain
    PATH, and nothing of root's."""
    team.start_worker("bridge", "1x80GiB", env=bridge.env(ROOT_VAULT_TOKEN="root-only-vault-token"))
    team.drop_as(ALICE, "who.yaml", "command: id\ngpus: 0\n")
    wait_until(lambda: bridge.submitted("who"), timeout=30, what="who handed to the stand-in sbatch")
    env = dict(line.split("=", 1) for line in Path(f"{bridge.calls}.env").read_text().splitlines() if "=" in line)
    assert "ROOT_VAULT_TOKEN" not in env and "root-only-vault-token" not in json.dumps(env)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (users[ALICE].pw_dir, ALICE, ALICE)
    assert str(bridge.bin) not in env["PATH"]  # not root's PATH


def test_handed_over_ids_come_only_from_the_workers_own_plain_files(team, users):
    """[S] state/slurm/<id>.json decides the --dependency of later jobs. A file there that is
    not the worker's (root's, here: planted as a member could where state/ was the team's), a
    link, or one whose Slurm id is not digits is ignored: alice's exported script does not
    wait on bob's Slurm job."""
    directory = team.root / "state" / "slurm"
    directory.mkdir(exist_ok=True)
    os.chmod(directory, 0o755)
    planted = {"prep": {"slurm_id": "666"}, "data": {"slurm_id": "1,afterok:2"}, "ok": {"slurm_id": "41"}}
    for job_id, data in planted.items():
        (directory / f"{job_id}.json").write_text(json.dumps(data))
        os.chmod(directory / f"{job_id}.json", 0o644)
    os.chown(directory / "prep.json", users[BOB].pw_uid, users[BOB].pw_gid)
    (team.base / "bobs.json").write_text(json.dumps({"slurm_id": "777"}))
    os.symlink(team.base / "bobs.json", directory / "link.json")
    team.drop_as(ALICE, "train.yaml", "command: python train.py\ngpus: 0\nafter: [prep, data, ok, link]\n")
    out = team.as_user(ALICE, "export", "slurm", "train")
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --dependency=afterok:41\n" in out.stdout, out.stdout
    script = out.stdout.replace(str(team.root), "<root>")  # a random temp name may hold the digits
    assert "666" not in script and "777" not in script and "afterok:2" not in script


def test_a_slurm_job_someone_else_commented_with_a_claim_is_never_taken_for_it(monkeypatch, users):
    """A bridge that died between sbatch and noting the Slurm id finds the job again by its
    comment (`gpuq:<claim>`). Claims are in the records the team reads, and any Slurm user may
    comment a job of theirs so: only a job running as the record's owner is taken for it."""
    import subprocess

    import gpuq.extras.slurm.bridge as bridge
    from gpuq.model.record import Record
    from gpuq.model.states import State

    alice, bob = users[ALICE], users[BOB]
    claim = "train@bridge@b00t@77@c1a1m@a1.yaml"
    jobs = {
        "bob": f"JobId=7 UserId={BOB}({bob.pw_uid}) Comment=gpuq:{claim} JobState=RUNNING",
        "alice": f"JobId=8 UserId={ALICE}({alice.pw_uid}) Comment=gpuq:{claim} JobState=RUNNING",
    }
    record = Record(id="train", state=State.RUNNING, spec={}, uid=alice.pw_uid, claim=claim)
    for shown, expected in ((["bob", "alice"], "8"), (["bob"], None)):
        text = "\n\n".join(jobs[k] for k in shown)
        monkeypatch.setattr(bridge, "_slurm", lambda *cmd, text=text: subprocess.CompletedProcess(cmd, 0, text, ""))
        assert bridge._submitted_for(bridge._handed_over_by_comment(), record) == expected, shown


def test_a_value_with_a_newline_never_adds_sbatch_lines(team, users):
    """A newline in workdir or an env key added lines to the sbatch script (--qos=admin,
    --exclusive, ...). Now such a spec is refused for export, naming why."""
    spec = team.base / "inject.yaml"
    spec.write_text('command: "true"\ngpus: 0\nworkdir: "/tmp\\n#SBATCH --qos=admin"\n')
    spec.chmod(0o644)
    out = team.as_user(BOB, "export", "slurm", str(spec))
    assert out.returncode != 0 and "#SBATCH --qos=admin" not in out.stdout, out.stdout
    assert "newline or a control character" in out.stderr, out.stderr


def test_cancel_now_hands_slurm_a_kill(team, bridge, users):
    """`gpuq cancel --now` of a job the bridge handed to Slurm: scancel --signal=KILL, as the
    owner (a plain scancel leaves it Slurm's grace, KillWait). And the bridge applies the
    request: with no worker beside it, `gpuq cancel` waited for one that never came."""
    team.start_worker("bridge", "1x80GiB", env=bridge.env())
    team.drop_as(ALICE, "long.yaml", "command: sleep 600\ngpus: 0\n")
    wait_until(lambda: bridge.submitted("long"), timeout=30, what="long handed to the stand-in sbatch")
    done = team.as_user(ALICE, "cancel", "--now", "long")
    said = f"uid={users[ALICE].pw_uid} scancel: --signal=KILL {SLURM_ID}"
    assert done.returncode == 0, done  # the bridge applies it (no step did: it waited for a worker)
    wait_until(lambda: said in bridge.calls.read_text(), timeout=60, what="scancel --signal=KILL as alice")
