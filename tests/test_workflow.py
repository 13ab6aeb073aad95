"""The everyday workflow through the real worker and CLI: dependencies (`after`: after success,
cancelled down the chain when one fails; `after_any`: after the end, whatever it was),
hold / release / retry / edit."""

from __future__ import annotations

import getpass
import json
import subprocess

import pytest

from conftest import PY, REPO, wait_until
from gpuq.model.errors import SpecError
from gpuq.model.spec import validate_spec
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


def submit(queue, *args: str) -> str:
    return queue.gpuq("submit", "--gpus", "0", *args).stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_chain_runs_in_order(queue):
    queue.write_config()
    first = submit(queue, "--name", "prep", "--", "sleep 1")
    second = submit(queue, "--name", "train", "--after", first, "--", "true")
    third = submit(queue, "--name", "eval", "--after", second, "--", "true")
    reasons = {p["id"]: p["reason"] for p in queue.status()["pending"]}
    assert reasons[second] == f"waiting for {first}" and reasons[third] == f"waiting for {second}"
    queue.start_worker("a", "1x80GiB")
    done = [wait_until(lambda j=j: queue.finished(j), timeout=30) for j in (first, second, third)]
    assert [r["state"] for r in done] == ["done"] * 3
    assert done[0]["ended_at"] <= done[1]["started_at"] and done[1]["ended_at"] <= done[2]["started_at"]


@pytest.mark.slow
def test_a_failed_dependency_cancels_the_chain_and_after_any_still_runs(queue):
    queue.write_config()
    # The chain is in place before anything runs (a job whose afterok has already failed is
    # refused at submit: `test_an_afterok_on_a_job_that_failed_is_refused_at_submit`).
    broken = submit(queue, "--name", "broken", "--", "sleep 0.5; exit 3")
    dependent = submit(queue, "--name", "dependent", "--after", broken, "--", "true")
    grandchild = submit(queue, "--name", "grandchild", "--after", dependent, "--", "true")
    cleanup = submit(queue, "--name", "cleanup", "--after-any", broken, "--", "true")
    queue.start_worker("a", "1x80GiB")
    assert wait_until(lambda: queue.finished(broken), timeout=30)["state"] == "failed"
    dep = wait_until(lambda: queue.finished(dependent), timeout=30)
    assert (dep["state"], dep["reason"]) == ("cancelled", f"dependency {broken} ended failed")
    grand = wait_until(lambda: queue.finished(grandchild), timeout=30)
    assert (grand["state"], grand["reason"]) == ("cancelled", f"dependency {dependent} ended cancelled")
    assert wait_until(lambda: queue.finished(cleanup), timeout=30)["state"] == "done"


@pytest.mark.slow
def test_an_afterok_on_a_job_that_failed_is_refused_at_submit(queue):
    """A Slurm user's `-d afterok:ID` on a job that had already failed was accepted, then
    cancelled by the worker at once."""
    queue.start_worker("a", "1x80GiB")
    broken = submit(queue, "--name", "broken", "--", "exit 3")
    wait_until(lambda: queue.finished(broken), timeout=60, what="the broken job to fail")
    refused = queue.gpuq("submit", "--gpus", "0", "-d", f"afterok:{broken}", "--", "true", check=False)
    assert refused.returncode == 2, refused
    assert f"--after (afterok) {broken} ended failed: this job could never start" in refused.stderr
    assert submit(queue, "--after-any", broken, "--", "true")  # afterany: it ended, whatever the result


@pytest.mark.slow
def test_after_an_array_waits_for_all_its_members_and_fails_with_one(queue):
    """An array's id as a dependency stands for its members (Slurm's afterok on an array
    job): it used to wait for ever, "no such job yet", once the array was expanded."""
    ok = submit(queue, "--id", "ok", "--array", "0-2", "--gpus", "0", "--", "sleep 0.3")
    after_ok = submit(queue, "--id", "after-ok", "--after", ok, "--gpus", "0", "--", "true")
    bad = submit(queue, "--id", "bad", "--array", "0-1", "--gpus", "0", "--", "exit $GPUQ_ARRAY_INDEX")
    after_bad = submit(queue, "--id", "after-bad", "--after", bad, "--gpus", "0", "--", "true")
    any_bad = submit(queue, "--id", "any-bad", "--after-any", bad, "--gpus", "0", "--", "true")
    queue.start_worker("a", "1x80GiB")
    done = wait_until(lambda: queue.finished(after_ok), timeout=60, what="after-ok")
    assert done["state"] == "done"
    members_ended = max(queue.finished(f"ok_{i}")["ended_at"] for i in range(3))
    assert done["started_at"] >= members_ended
    cancelled = wait_until(lambda: queue.finished(after_bad), timeout=60, what="after-bad")
    assert (cancelled["state"], cancelled["reason"]) == ("cancelled", "dependency bad ended failed")
    assert wait_until(lambda: queue.finished(any_bad), timeout=60, what="any-bad")["state"] == "done"


@pytest.mark.slow
def test_a_spec_file_may_name_dependencies_and_submit_refuses_unknown_ids(queue):
    queue.write_config()
    out = queue.gpuq("submit", "--after", "nosuchjob", "--", "true", check=False)
    assert out.returncode == 2 and "--after (afterok) nosuchjob: no such job" in out.stderr
    assert not list(queue.root.glob("jobs/*.yaml"))
    queue.drop("later.yaml", "command: 'true'\ngpus: 0\nafter: [early]\n")
    assert queue.status()["pending"][0]["reason"] == "waiting for early (early: no such job yet)"
    queue.start_worker("a", "1x80GiB")
    queue.drop("early.yaml", "command: 'true'\ngpus: 0\n")
    assert wait_until(lambda: queue.finished("later"), timeout=30)["state"] == "done"


# --- hold / release / retry / edit ---------------------------------------------------------


@pytest.mark.slow
def test_hold_keeps_a_job_back_and_release_restores_its_place(queue):
    queue.write_config()
    first = submit(queue, "--name", "one", "--", "true")
    second = submit(queue, "--name", "two", "--", "true")
    assert queue.gpuq("hold", first).stdout.startswith(f"{first}: held")
    view = queue.status()
    assert [p["id"] for p in view["pending"]] == [second]
    assert [(h["id"], h["reason"]) for h in view["held"]] == [(first, f"held by {getpass.getuser()}")]
    assert "HELD (1" in queue.gpuq("status").stdout
    again = queue.gpuq("hold", first, check=False)
    assert again.returncode == 1 and "already held" in again.stderr
    queue.gpuq("release", first)
    assert [p["id"] for p in queue.status()["pending"]] == [first, second]  # its old place
    queue.gpuq("hold", second)
    queue.start_worker("a", "1x80GiB")
    assert wait_until(lambda: queue.finished(first), timeout=30)["state"] == "done"
    assert queue.finished(second) is None and queue.status()["held"][0]["id"] == second
    queue.gpuq("cancel", second)
    assert queue.finished(second)["reason"].endswith("while held") and queue.status()["held"] == []


@pytest.mark.slow
def test_retry_runs_an_ended_job_again_as_its_next_attempt(queue):
    queue.write_config()
    queue.start_worker("a", "1x80GiB")
    flaky = submit(queue, "--name", "flaky", "--", "exit $((GPUQ_ATTEMPT == 1))")  # fails only the first time
    first = wait_until(lambda: queue.finished(flaky), timeout=30)
    assert first["state"] == "failed"
    refused = queue.gpuq("hold", flaky, check=False)
    assert refused.returncode == 1 and "not pending" in refused.stderr
    assert queue.gpuq("retry", flaky).stdout.strip() == f"{flaky}: back in the queue as attempt 2"
    again = wait_until(lambda: (r := queue.finished(flaky)) and r["attempt"] == 2 and r, timeout=30)
    assert again["state"] == "done" and again["queued_at"] > first["ended_at"]  # a retry queues anew
    assert "attempt 2" in queue.log(flaky)


@pytest.mark.slow
def test_edit_changes_a_pending_spec_in_place_and_refuses_an_invalid_one(queue, tmp_path):
    queue.write_config()
    first = submit(queue, "--name", "one", "--", "true")
    second = submit(queue, "--name", "two", "--", "true")
    sed = tmp_path / "editor.sh"
    sed.write_text("#!/bin/sh\nsed -i 's/^name: one$/name: renamed/' \"$1\"\n")
    sed.chmod(0o755)
    out = queue.gpuq("edit", first, env={**queue.env(), "EDITOR": str(sed)})
    assert "edited, back at its place" in out.stdout
    view = queue.status()
    assert [p["id"] for p in view["pending"]] == [first, second] and view["held"] == []
    assert "name: renamed" in (queue.root / "jobs" / f"{first}.yaml").read_text()
    breaker = tmp_path / "breaker.sh"
    breaker.write_text("#!/bin/sh\necho 'gpus: many' >> \"$1\"\n")
    breaker.chmod(0o755)
    bad = queue.gpuq("edit", first, check=False, env={**queue.env(), "EDITOR": str(breaker)})
    assert bad.returncode == 1 and "field 'gpus'" in bad.stderr and "unchanged" in bad.stderr
    assert "gpus: many" not in (queue.root / "jobs" / f"{first}.yaml").read_text()
    assert [p["id"] for p in queue.status()["pending"]] == [first, second]
    assert bad.stdout == ""  # D16: neither the hold nor the release around the editor is news


@pytest.mark.slow
def test_edit_checks_as_strictly_as_submit(queue, tmp_path):
    """D16: `edit` kept `gpu_mem: 30GiB` on 24 GiB GPUs, which `submit` refuses."""
    queue.start_worker("a", "1x24GiB")
    job = queue.gpuq("submit", "--hold", "--gpu-mem", "10GiB", "--", "true").stdout.split()[-1]
    grow = tmp_path / "grow.sh"
    grow.write_text("#!/bin/sh\nsed -i 's/^gpu_mem: .*/gpu_mem: 30GiB/' \"$1\"\n")
    grow.chmod(0o755)
    refused = queue.gpuq("edit", job, check=False, env={**queue.env(), "EDITOR": str(grow)})
    assert refused.returncode == 1 and "no GPU in the team can ever hold this job" in refused.stderr, refused
    assert refused.stdout == "" and "unchanged" in refused.stderr
    assert "gpu_mem: 10GiB" in (queue.root / "state" / "held" / f"{job}.yaml").read_text()


# --- drain / resume ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_drained_host_finishes_its_jobs_and_takes_nothing_new(queue, tmp_path):
    queue.write_config()
    queue.start_worker("a", "1x80GiB")
    go = tmp_path / "go"  # long runs until the test has seen the host draining with it
    long = submit(queue, "--name", "long", "--", f"while [ ! -e {go} ]; do sleep 0.1; done")
    wait_until(lambda: queue.record(long) and queue.record(long)["state"] == "running", timeout=30)
    out = queue.gpuq("drain", "a", "--reason", "driver update")
    assert out.stdout.startswith("a: draining")
    later = submit(queue, "--name", "later", "--", "true")
    assert "DRAINING (1 running) by" in queue.gpuq("status").stdout
    go.touch()
    assert wait_until(lambda: queue.finished(long), timeout=30)["state"] == "done"
    queue.wait_passes("a")  # drained: whole passes go by and later stays pending
    host = wait_until(lambda: queue.status()["hosts"][0], timeout=5)
    assert host["drain"]["reason"] == "driver update" and "DRAINED by" in queue.gpuq("status").stdout
    assert queue.finished(later) is None and queue.status()["pending"][0]["id"] == later
    refused = queue.gpuq("drain", "nosuchhost", check=False)
    assert refused.returncode == 1 and "hosts: a" in refused.stderr
    assert queue.gpuq("resume", "a").stdout.startswith("a: resumed")
    assert wait_until(lambda: queue.finished(later), timeout=30)["state"] == "done"
    assert queue.gpuq("resume", "a", check=False).returncode == 1


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


@pytest.mark.slow
def test_a_dropped_sweep_becomes_its_jobs_and_one_id_shows_and_cancels_them(queue):
    queue.write_config()
    queue.drop(
        "hp.yaml",
        "command: echo lr={lr} seed={seed} $GPUQ_SWEEP_LR\ngpus: 0\nsweep: {lr: [1e-3, 3e-4], seed: [1, 2, 3]}\n",
    )
    assert queue.status()["pending"][0]["reason"] == "a sweep: the next worker pass turns it into its jobs"
    queue.start_worker("a", "1x80GiB")
    ids = [f"hp_lr{lr}-seed{s}" for lr in ("1e-3", "3e-4") for s in (1, 2, 3)]
    for job_id in ids:
        assert wait_until(lambda j=job_id: queue.finished(j), timeout=30)["state"] == "done"
    assert "lr=3e-4 seed=2 3e-4" in queue.log("hp_lr3e-4-seed2")
    shown = queue.gpuq("show", "hp").stdout
    assert shown.startswith("sweep hp: 6 jobs (6 done)") and "hp_lr1e-3-seed3" in shown
    assert not (queue.root / "jobs" / "hp.yaml").exists()
    # a bad sweep is rejected with the field and the fix
    queue.drop("bad.yaml", "command: echo {lr}\ngpus: 0\nsweep: {seed: [1]}\n")
    err = wait_until(lambda: next(queue.root.glob("state/rejected/bad.error"), None), timeout=30).read_text()
    assert "field 'sweep': seed is not used in command. Fix: write {seed} in command" in err


@pytest.mark.slow
def test_an_array_sets_its_index_and_cancels_as_one(queue):
    queue.write_config()
    out = queue.gpuq("submit", "--gpus", "0", "--name", "arr", "--array", "0-3", "--", "echo index=$GPUQ_ARRAY_INDEX")
    group = out.stdout.strip().splitlines()[-1]
    assert group == "arr-1" and out.stdout == "arr-1\n" and "4 jobs, arr-1_0 ... arr-1_3" in out.stderr
    queue.start_worker("a", "1x80GiB")
    for i in range(4):
        wait_until(lambda i=i: queue.finished(f"arr-1_{i}"), timeout=30)
        assert f"index={i}" in queue.log(f"arr-1_{i}")
    held = queue.gpuq(
        "submit", "--gpus", "0", "--name", "wait", "--array", "1-3", "--after", "nosuch", "--", "true", check=False
    )
    assert held.returncode == 2 and "no such job" in held.stderr
    second = queue.gpuq("submit", "--gpus", "0", "--name", "slow", "--array", "0-2", "--", "sleep 30")
    group = second.stdout.strip().splitlines()[-1]
    wait_until(lambda: queue.record(f"{group}_0"), timeout=30)
    cancelled = queue.gpuq("cancel", group)
    assert cancelled.stdout.count("cancel") == 3
    for i in range(3):
        assert wait_until(lambda i=i: queue.finished(f"{group}_{i}"), timeout=30)["state"] == "cancelled"
    assert json.loads(queue.gpuq("show", group, "--json").stdout)["members"][0]["state"] == "cancelled"
    bad = queue.gpuq("submit", "--array", "9-1", "--", "true", check=False)
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


@pytest.mark.slow
def test_a_job_cancelled_after_a_release_queues_anew_when_retried(queue):
    queue.write_config()
    first = submit(queue, "--name", "one", "--", "true")
    queue.gpuq("hold", first)
    queue.gpuq("release", first)  # it keeps its place while pending
    queue.gpuq("cancel", first)
    cancelled_at = queue.finished(first)["ended_at"]
    queue.gpuq("retry", first)
    queue.start_worker("a", "1x80GiB")
    again = wait_until(lambda: (r := queue.finished(first)) and r["attempt"] == 2 and r, timeout=30)
    assert again["queued_at"] >= cancelled_at  # not the place it had before it was cancelled


@pytest.mark.slow
def test_an_arrays_members_take_its_place_in_the_queue_not_the_moment_they_were_written(queue):
    """The members were written with the group file's mtime, but the queue goes by ctime (which
    no member can set): an array submitted before other jobs ran after them."""
    once = [PY, str(REPO / "worker.py"), "--root", str(queue.root), "--host", "a", "--fake-gpus", "1x24GiB", "--once"]
    subprocess.run(once, env=queue.env(), check=True, capture_output=True, timeout=120)
    queue.gpuq("drain", "a")  # nothing starts: the order is what is shown
    queue.gpuq("submit", "--gpu-mem", "20GiB", "--id", "before", "--", "true")
    queue.gpuq("submit", "--gpu-mem", "20GiB", "--id", "arr", "--array", "0-2", "--", "true")
    queue.gpuq("submit", "--gpu-mem", "20GiB", "--id", "after", "--", "true")
    subprocess.run(once, env=queue.env(), check=True, capture_output=True, timeout=120)  # expands the array
    order = [p["id"] for p in queue.status()["pending"]]
    assert order == ["before", "arr_0", "arr_1", "arr_2", "after"], order


def test_ids_are_listed_in_the_order_people_count_them():
    """A helper's finding: HELD listed sw-10 before sw-2 (ids sorted as text)."""
    from gpuq.model.names import natural_order

    ids = ["sw-10", "sw-2", "sw-1", "a", "sw-1_10", "sw-1_3", "b2c", "b10c"]
    assert sorted(ids, key=natural_order) == ["a", "b2c", "b10c", "sw-1", "sw-1_3", "sw-1_10", "sw-2", "sw-10"]
