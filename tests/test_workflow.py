"""The everyday workflow: dependencies (`after`: after success, cancelled down the chain when
one fails; `after_any`: after the end, whatever it was), hold / release / retry / edit, drain /
resume, sweeps and arrays. What a worker's pass does with them is driven in this process
(tests/harness.py: the CLI's main and a box's passes on a clock the test moves); services,
whose restarts are their supervisor's, run through the real worker; `edit` runs the person's editor, a process."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from harness import FOREVER, PassWorker, Run, Team, gpuq, status

from conftest import PY, REPO, wait_until
from gpuq.model.errors import SpecError
from gpuq.model.record import Record
from gpuq.model.spec import validate_spec
from gpuq.model.states import State
from gpuq.spool.deps import gate


def spec(**kw):
    return validate_spec({"command": "true", **kw}, "t.yaml")


def test_gate_waits_dooms_and_lets_go():
    s = spec(after=["a", "b"], after_any=["c"])
    assert gate(s, {"a": "done", "b": "running", "c": "failed"}) == ("waiting for b", None)
    assert gate(s, {"a": "done", "b": "done", "c": "pending"}) == ("waiting for c", None)
    assert gate(s, {"a": "done", "b": "done", "c": "failed"}) == (None, None)
    assert gate(s, {"a": "cancelled", "b": "running"}) == (None, "dependency a ended cancelled")
    assert gate(spec(after=["x"]), {}) == ("waiting for x (x: no such job yet)", None)
    assert gate(spec(after_any=["c"]), {"c": "timeout"}) == (None, None)


def test_a_dependency_another_member_queued_later_is_named_alone():
    """An attack review: the reason listed every later job of every other member (200 KB
    after 5,000 of bob's), not the dependency another member's file had taken."""
    origins = {"alprep": ("bob", 20.0), **{f"bp{i}": ("bob", 30.0 + i) for i in range(1000)}}
    waits, doom = gate(spec(after=["alprep"]), {"alprep": "done"}, origins, "alice", 10.0)
    assert waits == "waiting for alprep (alprep: no such job yet) (alprep is bob's, queued after this one)"
    assert doom is None


def submit(root: Path, *args: str) -> str:
    """`gpuq submit --gpus 0 ARGS` (in this process): the new job's id."""
    return gpuq(root, "submit", "--gpus", "0", *args).stdout.strip().splitlines()[-1]


def one_box(tmp_path: Path, runs: Callable[[Record], Run] | None = None) -> Team:
    """Box a (one 80 GiB GPU, two CPU slots) in this process, its worker past its first pass (it
    has published its heartbeat, as a started worker has); each job runs as `runs` says (by
    default it ends by itself with exit 0 a second after its launch)."""
    team = Team(tmp_path / "root", runs)
    team.add("a", "1x80GiB")
    team.step()
    return team


def ended(team: Team, job_id: str) -> Record:
    record = team.finished(job_id)
    assert record is not None, f"{job_id} has not ended"
    return record


def test_a_chain_runs_in_order(tmp_path):
    """Each link starts only once the one before has ended: with two CPU slots free, a
    worker that let a link start while the one before still ran ran them side by side
    (each runs 3 s: several passes see it running)."""
    team = one_box(tmp_path, lambda record: Run(seconds=3))
    first = submit(team.root, "--name", "prep", "--", "sleep 1")
    second = submit(team.root, "--name", "train", "--after", first, "--", "true")
    third = submit(team.root, "--name", "eval", "--after", second, "--", "true")
    reasons = {p["id"]: p["reason"] for p in status(team.root)["pending"]}
    assert reasons[second] == f"waiting for {first}" and reasons[third] == f"waiting for {second}"
    team.run_until_idle()
    done = [ended(team, j) for j in (first, second, third)]
    assert [r.state for r in done] == [State.DONE] * 3
    spans = [(r.started_at or 0, r.ended_at or 0) for r in done]
    assert spans[0][1] <= spans[1][0] and spans[1][1] <= spans[2][0], spans


def test_a_failed_dependency_cancels_the_chain_and_after_any_still_runs(tmp_path):
    # The chain is in place before anything runs (a job whose afterok has already failed is
    # refused at submit: `test_an_afterok_on_a_job_that_failed_is_refused_at_submit`).
    team = one_box(tmp_path, lambda record: Run(exit_code=3 if record.spec["name"] == "broken" else 0))
    broken = submit(team.root, "--name", "broken", "--", "sleep 0.5; exit 3")
    dependent = submit(team.root, "--name", "dependent", "--after", broken, "--", "true")
    grandchild = submit(team.root, "--name", "grandchild", "--after", dependent, "--", "true")
    cleanup = submit(team.root, "--name", "cleanup", "--after-any", broken, "--", "true")
    team.run_until_idle()
    assert ended(team, broken).state is State.FAILED
    dep = ended(team, dependent)
    assert (dep.state, dep.reason) == (State.CANCELLED, f"dependency {broken} ended failed")
    grand = ended(team, grandchild)
    assert (grand.state, grand.reason) == (State.CANCELLED, f"dependency {dependent} ended cancelled")
    assert ended(team, cleanup).state is State.DONE
    # Retried, the cancelled dependent would be cancelled again at once (a member's retry said
    # "back in the queue"): refused as submit refuses it, and the chain goes again from its root.
    refused = gpuq(team.root, "retry", dependent, check=False)
    assert refused.returncode == 1 and f"its dependency {broken} ended failed: it could never start" in refused.stderr
    assert f"Fix: `gpuq retry {broken}` first" in refused.stderr and ended(team, dependent).attempt == 1


def test_an_afterok_on_a_job_that_failed_is_refused_at_submit(tmp_path):
    """A Slurm user's `-d afterok:ID` on a job that had already failed was accepted, then
    cancelled by the worker at once."""
    team = one_box(tmp_path, lambda record: Run(exit_code=3))
    broken = submit(team.root, "--name", "broken", "--", "exit 3")
    team.run_until(lambda: team.finished(broken))
    refused = gpuq(team.root, "submit", "--gpus", "0", "-d", f"afterok:{broken}", "--", "true", check=False)
    assert refused.returncode == 2, refused
    assert f"--after (afterok) {broken} ended failed: this job could never start" in refused.stderr
    assert submit(team.root, "--after-any", broken, "--", "true")  # afterany: it ended, whatever the result


def test_after_an_array_waits_for_all_its_members_and_fails_with_one(tmp_path):
    """An array's id as a dependency stands for its members (Slurm's afterok on an array
    job): it used to wait for ever, "no such job yet", once the array was expanded."""

    def runs(record: Record) -> Run:  # ok's members run a while; bad_N exits N
        if record.id.startswith("ok_"):
            return Run(seconds=3)
        return Run(exit_code=int(record.id.removeprefix("bad_")) if record.id.startswith("bad_") else 0)

    team = one_box(tmp_path, runs)
    root = team.root
    ok = submit(root, "--id", "ok", "--array", "0-2", "--gpus", "0", "--", "sleep 0.3")
    after_ok = submit(root, "--id", "after-ok", "--after", ok, "--gpus", "0", "--", "true")
    bad = submit(root, "--id", "bad", "--array", "0-1", "--gpus", "0", "--", "exit $GPUQ_ARRAY_INDEX")
    after_bad = submit(root, "--id", "after-bad", "--after", bad, "--gpus", "0", "--", "true")
    any_bad = submit(root, "--id", "any-bad", "--after-any", bad, "--gpus", "0", "--", "true")
    team.run_until_idle()
    done = ended(team, after_ok)
    assert done.state is State.DONE
    members_ended = max(ended(team, f"ok_{i}").ended_at or 0 for i in range(3))
    assert (done.started_at or 0) >= members_ended
    cancelled = ended(team, after_bad)
    assert (cancelled.state, cancelled.reason) == (State.CANCELLED, "dependency bad ended failed")
    assert ended(team, any_bad).state is State.DONE


def test_a_spec_file_may_name_dependencies_and_submit_refuses_unknown_ids(tmp_path):
    team = Team(tmp_path / "root")
    box = team.add("a", "1x80GiB")  # its worker has not run a pass yet
    out = gpuq(team.root, "submit", "--after", "nosuchjob", "--", "true", check=False)
    assert out.returncode == 2 and "--after (afterok) nosuchjob: no such job" in out.stderr
    assert not list(team.root.glob("jobs/*.yaml"))
    team.drop("later.yaml", "command: 'true'\ngpus: 0\nafter: [early]\n")
    assert status(team.root)["pending"][0]["reason"] == "waiting for early (early: no such job yet)"
    team.step()
    team.step()
    assert box.launched() == []  # a pass of the worker leaves it waiting
    team.drop("early.yaml", "command: 'true'\ngpus: 0\n")
    team.run_until_idle()
    assert ended(team, "later").state is State.DONE
    assert box.launched() == ["early", "later"]


# --- hold / release / retry / edit ---------------------------------------------------------


def test_hold_keeps_a_job_back_and_release_restores_its_place(tmp_path):
    team = one_box(tmp_path)
    root = team.root
    first = submit(root, "--name", "one", "--", "true")
    second = submit(root, "--name", "two", "--", "true")
    assert gpuq(root, "hold", first).stdout.startswith(f"{first}: held")
    view = status(root)
    assert [p["id"] for p in view["pending"]] == [second]
    assert [(h["id"], h["reason"]) for h in view["held"]] == [(first, f"held by {getpass.getuser()}")]
    assert "HELD (1" in gpuq(root, "status").stdout
    again = gpuq(root, "hold", first, check=False)
    assert again.returncode == 1 and "already held" in again.stderr
    gpuq(root, "release", first)
    assert [p["id"] for p in status(root)["pending"]] == [first, second]  # its old place
    gpuq(root, "hold", second)
    team.run_until_idle()
    assert ended(team, first).state is State.DONE
    assert team.finished(second) is None and status(root)["held"][0]["id"] == second
    assert team.boxes["a"].launched() == [first]  # whole passes went by: the held one never started
    gpuq(root, "cancel", second)
    assert (ended(team, second).reason or "").endswith("while held") and status(root)["held"] == []


def test_retry_runs_an_ended_job_again_as_its_next_attempt(tmp_path):
    team = one_box(tmp_path, lambda record: Run(exit_code=1 if record.attempt == 1 else 0))  # fails the first time
    root = team.root
    flaky = submit(root, "--name", "flaky", "--", "exit $((GPUQ_ATTEMPT == 1))")
    team.run_until(lambda: team.finished(flaky))
    first = ended(team, flaky)
    assert first.state is State.FAILED
    refused = gpuq(root, "hold", flaky, check=False)
    assert refused.returncode == 1 and "not pending" in refused.stderr
    behind = submit(root, "--name", "behind", "--", "true")  # queued after flaky ended
    assert gpuq(root, "retry", flaky).stdout.strip() == f"{flaky}: back in the queue as attempt 2"
    # A retry queues anew: at the moment of the retry (the spec's ctime, on the machine's clock,
    # as the submit's was), behind a job queued after it ended, not at its old place.
    assert [p["id"] for p in status(root)["pending"]] == [behind, flaky]
    team.run_until(lambda: (r := team.finished(flaky)) and r.attempt == 2)
    again = ended(team, flaky)
    # (The supervisor's log header of the second attempt is test_faults.py's,
    # test_a_reboot_requeues_running_jobs_as_their_next_attempt.)
    assert again.state is State.DONE and again.queued_at > first.queued_at
    launched = [(r.id, r.attempt) for r in team.boxes["a"].spawner.launched]
    assert launched == [(flaky, 1), (behind, 1), (flaky, 2)], launched  # in queue order


EDITOR_RENAMES = "#!/bin/sh\nsed -i 's/^name: one$/name: renamed/' \"$1\"\n"


@pytest.mark.slow  # the editor is a process: the person's own program, which edit waits for
def test_edit_changes_a_pending_spec_in_place_and_refuses_an_invalid_one(tmp_path):
    team = one_box(tmp_path)
    root = team.root
    first = submit(root, "--name", "one", "--", "true")
    second = submit(root, "--name", "two", "--", "true")
    sed = tmp_path / "editor.sh"
    sed.write_text(EDITOR_RENAMES)
    sed.chmod(0o755)
    out = gpuq(root, "edit", first, env={"EDITOR": str(sed)})
    assert "edited, back at its place" in out.stdout
    view = status(root)
    assert [p["id"] for p in view["pending"]] == [first, second] and view["held"] == []
    assert "name: renamed" in (root / "jobs" / f"{first}.yaml").read_text()
    breaker = tmp_path / "breaker.sh"
    breaker.write_text("#!/bin/sh\necho 'gpus: many' >> \"$1\"\n")
    breaker.chmod(0o755)
    bad = gpuq(root, "edit", first, check=False, env={"EDITOR": str(breaker)})
    assert bad.returncode == 1 and "field 'gpus'" in bad.stderr and "unchanged" in bad.stderr
    assert "gpus: many" not in (root / "jobs" / f"{first}.yaml").read_text()
    assert [p["id"] for p in status(root)["pending"]] == [first, second]
    assert bad.stdout == ""  # D16: neither the hold nor the release around the editor is news


@pytest.mark.slow  # the editor is a process
def test_edit_checks_as_strictly_as_submit(tmp_path):
    """D16: `edit` kept `gpu_mem: 30GiB` on 24 GiB GPUs, which `submit` refuses."""
    box = PassWorker(tmp_path / "root", "a", "1x24GiB")
    box.run_pass()  # its heartbeat: the team's GPUs are known
    job = gpuq(box.root, "submit", "--hold", "--gpu-mem", "10GiB", "--", "true").stdout.split()[-1]
    grow = tmp_path / "grow.sh"
    grow.write_text("#!/bin/sh\nsed -i 's/^gpu_mem: .*/gpu_mem: 30GiB/' \"$1\"\n")
    grow.chmod(0o755)
    refused = gpuq(box.root, "edit", job, check=False, env={"EDITOR": str(grow)})
    assert refused.returncode == 1 and "no GPU in the team can ever hold this job" in refused.stderr, refused
    assert refused.stdout == "" and "unchanged" in refused.stderr
    assert "gpu_mem: 10GiB" in (box.root / "state" / "held" / f"{job}.yaml").read_text()
    # A dependency no job has is named as the spec's field the editor shows, not submit's option.
    typo = tmp_path / "typo.sh"
    typo.write_text("#!/bin/sh\necho 'after: [nosuchjob-1]' >> \"$1\"\n")
    typo.chmod(0o755)
    refused = gpuq(box.root, "edit", job, check=False, env={"EDITOR": str(typo)})
    assert refused.returncode == 1 and "field 'after' nosuchjob-1: no such job" in refused.stderr, refused.stderr
    assert "--after" not in refused.stderr


@pytest.mark.slow  # the editor is a process, and so is the edit a hang-up ends
@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_an_edit_its_terminal_hangs_up_on_puts_the_job_back_at_its_place(tmp_path, sig):
    """A dropped ssh session (SIGHUP) or a TERM ended `gpuq edit` with its editor open, and
    the job stayed held "being edited" for good. The edit now releases what it held, unchanged;
    while it is open, the hold says how to release it should the edit be gone (a KILL)."""
    team = one_box(tmp_path)
    root = team.root
    first = submit(root, "--name", "one", "--", "true")
    second = submit(root, "--name", "two", "--", "true")
    before = (root / "jobs" / f"{first}.yaml").read_bytes()
    opened = tmp_path / "opened"
    editor = tmp_path / "slow-editor.sh"
    editor.write_text(f"#!/bin/sh\necho 'gpus: 3' >> \"$1\"\ntouch {opened}\nexec sleep 300\n")
    editor.chmod(0o755)
    edit = subprocess.Popen(
        [PY, str(REPO / "gpuq.py"), "--root", str(root), "edit", first],
        env={**os.environ, "EDITOR": str(editor)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        wait_until(opened.exists, what="the editor open")
        held = status(root)["held"]
        assert [h["id"] for h in held] == [first] and f"gpuq release {first}" in held[0]["reason"], held
        edit.send_signal(sig)
        edit.wait(timeout=60)
    finally:
        if edit.poll() is None:
            os.killpg(edit.pid, signal.SIGKILL)
            edit.wait()
        else:  # the editor, in the edit's session, must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(edit.pid, signal.SIGKILL)
    said = edit.stderr.read()
    assert edit.returncode == 128 + sig and "Traceback" not in said, (edit.returncode, said)  # Ctrl-C: 130
    view = status(root)
    assert [p["id"] for p in view["pending"]] == [first, second] and view["held"] == []
    assert (root / "jobs" / f"{first}.yaml").read_bytes() == before


# --- drain / resume ---------------------------------------------------------------------------


def test_a_drained_host_finishes_its_jobs_and_takes_nothing_new(tmp_path):
    team = one_box(tmp_path, lambda record: FOREVER if record.spec["name"] == "long" else Run())
    root = team.root
    long = submit(root, "--name", "long", "--", "sleep 1000")  # runs until the test ends it
    team.run_until(lambda: [r for r in team.running() if r.id == long])
    out = gpuq(root, "drain", "a", "--reason", "driver update")
    assert out.stdout.startswith("a: draining")
    later = submit(root, "--name", "later", "--", "true")
    assert "DRAINING (1 running) by" in gpuq(root, "status").stdout
    team.end(long)
    for _ in range(3):  # drained: whole passes go by and later stays pending
        team.step()
    assert ended(team, long).state is State.DONE
    host = status(root)["hosts"][0]
    assert host["drain"]["reason"] == "driver update" and "DRAINED by" in gpuq(root, "status").stdout
    assert team.finished(later) is None and status(root)["pending"][0]["id"] == later
    # Its reason says why: the box is drained, not down ("no live host" of a box that was up).
    assert status(root)["pending"][0]["reason"] == "host a draining (`gpuq resume a` takes work again)"
    assert team.boxes["a"].launched() == [long]
    refused = gpuq(root, "drain", "nosuchhost", check=False)
    assert refused.returncode == 1 and "hosts: a" in refused.stderr
    assert gpuq(root, "resume", "a").stdout.startswith("a: resumed")
    team.run_until_idle()
    assert ended(team, later).state is State.DONE
    assert gpuq(root, "resume", "a", check=False).returncode == 1


def test_an_id_stem_names_the_script_and_never_a_word_of_python_code():
    from gpuq.spool.submit import readable_base

    assert readable_base(["python", "train.py", "--lr", "1e-3"], None) == "train"
    assert readable_base(["./run.sh"], None) == "run"
    assert readable_base(["python", "-c", "import torch; print(1)"], None) == "python"
    assert readable_base(["/usr/bin/python3 -c 'import x'"], None) == "python3"
    assert readable_base(["sh", "-c", "echo hi"], None) == "echo"  # a shell's code starts with a command
    assert readable_base(["/bin/bash", "/home/ana/s4.sh", "one"], None) == "s4"  # a batch script, by its name
    assert readable_base(["python", "-c", "x"], "eval") == "eval"  # -J wins
    assert readable_base(["x"], "train/v2") == "train-v2"  # a name is never cut to its last part
    assert readable_base(["/usr/bin/python3.11", "t.py"], None) == "t"


def test_a_sweep_in_a_copied_scripts_text_is_measured_whole():
    """An attack review: the text of a copied script (`sh -c TEXT PATH`) was left out of the
    sweep's size check, and its 60,000 placeholders made a worker write 116 MB of members."""
    script = "#!/bin/sh\necho " + "{x}" * 60000
    data = {"command": ["/bin/sh", "-c", script, "{x}"], "sweep": {"x": ["a" * 500, "b" * 500]}, "gpus": 0}
    with pytest.raises(SpecError, match="over the 4 MiB a sweep or array may write"):
        validate_spec(data, "boom.yaml")


# --- sweeps and arrays ------------------------------------------------------------------------


def test_sweep_members_have_readable_ids_and_their_values():
    from gpuq.model.groups import parse_array
    from gpuq.spool.sweeps import sweep_members

    data = {
        "command": "python train.py --lr {lr} --seed {seed}",
        "gpus": 0,
        "sweep": {"lr": ["1e-3", 0.0003], "seed": [1, 2]},
    }
    members = dict(sweep_members(data, "hp"))
    assert list(members) == ["hp_lr1e-3-seed1", "hp_lr1e-3-seed2", "hp_lr0.0003-seed1", "hp_lr0.0003-seed2"]
    m = members["hp_lr0.0003-seed2"]
    assert m["command"] == "python train.py --lr 0.0003 --seed 2" and "sweep" not in m
    assert m["env"] == {"GPUQ_GROUP": "hp", "GPUQ_SWEEP_LR": "0.0003", "GPUQ_SWEEP_SEED": "2"}
    odd = dict(sweep_members({"command": "x {a}", "sweep": {"a": ["x y", "x/y"]}}, "g"))
    assert list(odd) == ["g_0", "g_1"]  # "axy" twice: not distinct, so numbered
    assert parse_array("0-9:3,20") == [0, 3, 6, 9, 20] and parse_array("5") == [5]


def test_a_dropped_sweep_becomes_its_jobs_and_one_id_shows_and_cancels_them(tmp_path):
    team = Team(tmp_path / "root")
    box = team.add("a", "1x80GiB")
    root = team.root
    team.drop(
        "hp.yaml",
        "command: echo lr={lr} seed={seed} $GPUQ_SWEEP_LR\ngpus: 0\nsweep: {lr: [1e-3, 3e-4], seed: [1, 2, 3]}\n",
    )
    assert status(root)["pending"][0]["reason"] == "a sweep: the next worker pass turns it into its jobs"
    team.run_until_idle()
    ids = [f"hp_lr{lr}-seed{s}" for lr in ("1e-3", "3e-4") for s in (1, 2, 3)]
    assert [ended(team, job_id).state for job_id in ids] == [State.DONE] * 6
    # What each member's job is started with; that a spec's env reaches its job is
    # test_attack_supervisor.py's, and the values in a real job's output test_submit_from_shell.py's.
    member = next(r for r in box.spawner.launched if r.id == "hp_lr3e-4-seed2")
    assert member.spec["command"] == "echo lr=3e-4 seed=2 $GPUQ_SWEEP_LR"
    assert member.spec["env"]["GPUQ_SWEEP_LR"] == "3e-4"
    shown = gpuq(root, "show", "hp").stdout
    assert shown.startswith("sweep hp: 6 jobs (6 done)") and "hp_lr1e-3-seed3" in shown
    assert not (root / "jobs" / "hp.yaml").exists()
    # a bad sweep is rejected with the field and the fix
    team.drop("bad.yaml", "command: echo {lr}\ngpus: 0\nsweep: {seed: [1]}\n")
    error = root / "state" / "rejected" / "bad.error"
    team.run_until(error.exists)
    assert "field 'sweep': seed is not used in command. Fix: write {seed} in command" in error.read_text()


def test_an_array_sets_its_index_and_cancels_as_one(tmp_path):
    team = one_box(tmp_path, lambda record: FOREVER if record.id.startswith("slow") else Run())
    box, root = team.boxes["a"], team.root
    out = gpuq(root, "submit", "--gpus", "0", "--name", "arr", "--array", "0-3", "--", "echo index=$GPUQ_ARRAY_INDEX")
    group = out.stdout.strip().splitlines()[-1]
    assert group == "arr-1" and out.stdout == "arr-1\n" and "4 jobs, arr-1_0 ... arr-1_3" in out.stderr
    team.run_until_idle()
    for i in range(4):
        assert ended(team, f"arr-1_{i}").state is State.DONE
    # Each member's job is started with its index (a real job's output: test_submit_from_shell.py).
    assert {r.id: r.spec["env"]["GPUQ_ARRAY_INDEX"] for r in box.spawner.launched} == {
        f"arr-1_{i}": str(i) for i in range(4)
    }
    held = gpuq(
        root,
        "submit",
        "--gpus",
        "0",
        "--name",
        "wait",
        "--array",
        "1-3",
        "--after",
        "nosuch",
        "--",
        "true",
        check=False,
    )
    assert held.returncode == 2 and "no such job" in held.stderr
    second = gpuq(root, "submit", "--gpus", "0", "--name", "slow", "--array", "0-2", "--", "sleep 30")
    group = second.stdout.strip().splitlines()[-1]
    team.run_until(lambda: [r for r in team.running() if r.id == f"{group}_0"])
    cancelled = gpuq(root, "cancel", group)
    assert cancelled.stdout.count("cancel") == 3
    team.run_until(lambda: all(team.finished(f"{group}_{i}") for i in range(3)))
    assert [ended(team, f"{group}_{i}").state for i in range(3)] == [State.CANCELLED] * 3
    assert json.loads(gpuq(root, "show", group, "--json").stdout)["members"][0]["state"] == "cancelled"
    bad = gpuq(root, "submit", "--array", "9-1", "--", "true", check=False)
    assert bad.returncode == 2 and "write the lower index first" in bad.stderr


# --- services -----------------------------------------------------------------------------------


def test_restart_policy_and_backoff():
    from gpuq.sched.restarts import restart_delay

    assert restart_delay("never", 1, None, False, 0) is None
    assert restart_delay("on-failure", 0, None, False, 0) is None
    assert restart_delay("on-failure", 1, None, False, 0) == 1
    assert restart_delay("on-failure", None, 9, False, 3) == 8
    assert restart_delay("always", 0, None, False, 20) == 300
    assert restart_delay("always", 1, None, True, 0) is None  # cancelled, timed out, preempted


@pytest.mark.slow
def test_a_service_is_restarted_in_place_until_cancelled(queue):
    queue.write_config()
    queue.start_worker("a", "1x80GiB")
    # fails twice (restarts after 1 s, then 2 s), then stays up
    queue.drop(
        "server.yaml",
        "command: 'echo start ${GPUQ_RESTARTS:-0}; test ${GPUQ_RESTARTS:-0} -ge 2 && "
        "exec sleep 60; exit 1'\ngpus: 1\ngpu_mem: 10GiB\npriority: high\nrestart: on-failure\n",
    )
    row = wait_until(
        lambda: next((r for r in queue.status()["running"] if r.get("restarts") == 2), None),
        timeout=30,
        what="the second restart",
    )
    assert row["id"] == "server" and row["attempt"] == 1
    assert "server (restarts 2)" in queue.gpuq("status").stdout
    log = queue.log("server")
    assert "start 0" in log and "exit 1 · restart 1 in 1s" in log and "exit 1 · restart 2 in 2s" in log
    assert queue.status()["hosts"][0]["gpus"][0]["usable_mib"] < 80 * 1024 - 10 * 1024 + 1  # still charged
    queue.gpuq("cancel", "server")
    final = wait_until(lambda: queue.finished("server"), timeout=30)
    assert final["state"] == "cancelled" and final["restarts"] == 2


@pytest.mark.slow
def test_always_restarts_after_success_and_on_failure_does_not(queue):
    queue.write_config()
    queue.start_worker("a", "1x80GiB")
    queue.drop("once.yaml", "command: 'true'\ngpus: 0\nrestart: on-failure\n")
    queue.drop("loop.yaml", "command: 'echo tick'\ngpus: 0\nrestart: always\n")
    assert wait_until(lambda: queue.finished("once"), timeout=30)["state"] == "done"
    wait_until(lambda: queue.log("loop").count("tick") >= 3, timeout=30, what="three runs of loop")
    assert queue.finished("loop") is None
    queue.gpuq("cancel", "loop")
    assert wait_until(lambda: queue.finished("loop"), timeout=30)["state"] == "cancelled"


def test_a_job_cancelled_after_a_release_queues_anew_when_retried(tmp_path):
    team = Team(tmp_path / "root")
    team.add("a", "1x80GiB")  # its worker's first pass comes after the retry
    root = team.root
    first = submit(root, "--name", "one", "--", "true")
    gpuq(root, "hold", first)
    gpuq(root, "release", first)  # it keeps its place while pending
    gpuq(root, "cancel", first)
    cancelled_at = ended(team, first).ended_at or 0
    gpuq(root, "retry", first)
    team.run_until(lambda: (r := team.finished(first)) and r.attempt == 2)
    assert ended(team, first).queued_at >= cancelled_at  # not the place it had before it was cancelled


def test_an_arrays_members_take_its_place_in_the_queue_not_the_moment_they_were_written(tmp_path):
    """The members were written with the group file's mtime, but the queue goes by ctime (which
    no member can set): an array submitted before other jobs ran after them."""
    box = PassWorker(tmp_path / "root", "a", "1x24GiB")
    box.run_pass()
    gpuq(box.root, "drain", "a")  # nothing starts: the order is what is shown
    gpuq(box.root, "submit", "--gpu-mem", "20GiB", "--id", "before", "--", "true")
    gpuq(box.root, "submit", "--gpu-mem", "20GiB", "--id", "arr", "--array", "0-2", "--", "true")
    gpuq(box.root, "submit", "--gpu-mem", "20GiB", "--id", "after", "--", "true")
    box.run_pass(after_s=1)  # expands the array
    assert (box.layout.groups / "arr.json").exists()
    order = [p["id"] for p in status(box.root)["pending"]]
    assert order == ["before", "arr_0", "arr_1", "arr_2", "after"], order


def test_ids_are_listed_in_the_order_people_count_them():
    """A helper's finding: HELD listed sw-10 before sw-2 (ids sorted as text)."""
    from gpuq.model.names import natural_order

    ids = ["sw-10", "sw-2", "sw-1", "a", "sw-1_10", "sw-1_3", "b2c", "b10c"]
    assert sorted(ids, key=natural_order) == ["a", "b2c", "b10c", "sw-1", "sw-1_3", "sw-1_10", "sw-2", "sw-10"]


def test_logs_of_a_job_cancelled_while_it_waited_says_it_never_ran(tmp_path):
    """`logs -f` of a job cancelled while pending ended saying it "has no output yet", of a job
    that never would have any."""
    team = one_box(tmp_path, lambda record: FOREVER)
    root = team.root
    first = submit(root, "--gpus", "1", "--", "sleep 1000")
    team.run_until(lambda: [r for r in team.running() if r.id == first])
    behind = submit(root, "--gpus", "1", "--", "true")
    gpuq(root, "cancel", behind)
    for args in (("logs", behind), ("logs", "-f", behind)):
        said = gpuq(root, *args, check=False)
        assert said.stdout == "" and "never ran: cancelled (cancelled by " in said.stderr, said
        assert "no output yet" not in said.stderr
