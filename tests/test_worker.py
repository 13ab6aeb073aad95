"""Worker behaviour through the real worker.py: reattaching, reacting to exits at once,
memory held by others, and specs that are still being written or are wrong. What one pass
decides (a reused id refused, a claim or an attempt left by a worker that died before its
job started, a rejected spec shown) is driven in this process (tests/harness.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from harness import PassWorker, gpuq

from conftest import fake_job, wait_until, worker_argv
from gpuq.model.states import State
from gpuq.spool.store import read_record


def _state(queue, job_id):
    return (queue.record(job_id) or {}).get("state")


@pytest.mark.slow
def test_jobs_outlive_the_worker_and_a_new_worker_reattaches(queue, tmp_path):
    queue.write_config(poll_interval=0.2)
    queue.start_worker("a", "1x80GiB")
    go = tmp_path / "go"  # long runs until the test says so: the new worker surely sees it running
    queue.drop("long.yaml", f"command: while [ ! -e {go} ]; do sleep 0.1; done; exit 3\ngpus: 1\n")
    wait_until(lambda: _state(queue, "long") == "running", what="long to start")
    queue.stop_worker("a", signal.SIGKILL)
    # No worker: the job runs on, status still shows it.
    assert [r["id"] for r in queue.status()["running"]] == ["long"]
    queue.drop("next.yaml", "command: echo next\ngpus: 1\n")  # needs the whole GPU too
    queue.start_worker("a", "1x80GiB")
    queue.wait_passes("a")  # whole passes of the new worker, with long running
    assert _state(queue, "long") == "running" and _state(queue, "next") is None, (
        "the new worker must see the GPU as taken"
    )
    go.touch()
    wait_until(lambda: queue.finished("long"), what="long to end")
    assert queue.finished("long")["state"] == "failed" and queue.finished("long")["exit_code"] == 3
    wait_until(lambda: (queue.finished("next") or {}).get("state") == "done", what="next to run")
    # The new worker saw the GPU as taken by the job it reattached to: next started only after.
    assert queue.finished("next")["claimed_at"] >= queue.finished("long")["ended_at"]
    assert "==> exit 3" in queue.log("long")


def _marker(queue, job_id: str, key: str) -> dict:
    """The job's `started` marker (its lock file), once it names `key`."""
    lock = queue.local_base / "a" / "jobs" / f"{job_id}.lock"

    def marker() -> dict | None:
        try:
            found = json.loads(lock.read_text())
        except (OSError, ValueError):
            return None
        return found if key in found else None

    return wait_until(marker, what=f"the marker of {job_id} to name {key}")


@pytest.mark.slow
def test_a_job_whose_supervisor_died_keeps_its_exit_status(queue, tmp_path):
    """The chaos review: 37 of 40 jobs that exited 0 while their supervisor was dead were
    recorded lost. The keeper that started the job keeps its status for the worker."""
    queue.start_worker("a", "1x80GiB")
    go = tmp_path / "go"
    queue.drop("orphan.yaml", f"command: while [ ! -e {go} ]; do sleep 0.05; done; exit 4\ngpus: 1\n")
    os.kill(_marker(queue, "orphan", "keeper_pid")["supervisor_pid"], signal.SIGKILL)
    go.touch()
    record = wait_until(lambda: queue.finished("orphan"), what="orphan to be settled")
    assert (record["state"], record["exit_code"]) == ("failed", 4), record
    assert "keeper kept its exit status" in record["reason"]


@pytest.mark.slow
def test_supervisor_and_keeper_death_means_exit_unknown_never_success(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop("orphan.yaml", "command: sleep 1\ngpus: 1\n")
    marker = _marker(queue, "orphan", "keeper_pid")
    # Both at once, as a machine's death would: the supervisor stopped first, so that it cannot
    # see its keeper die and record the run as failed in between (a loaded run did).
    os.kill(marker["supervisor_pid"], signal.SIGSTOP)
    try:
        os.kill(marker["keeper_pid"], signal.SIGKILL)  # the job goes with it (its parent-death signal)
    finally:
        os.kill(marker["supervisor_pid"], signal.SIGKILL)  # (a stopped process dies of it too)
    record = wait_until(lambda: queue.finished("orphan"), what="orphan to be settled")
    assert record["state"] == "lost" and record["exit_code"] is None
    assert "exit unknown" in record["reason"]


@pytest.mark.slow
def test_a_killed_spawner_is_replaced_and_loses_nothing(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop("first.yaml", "command: echo first\ngpus: 1\n")
    wait_until(lambda: queue.finished("first"), what="first to run")
    spawner = queue.spawner("a")
    spawner.kill()  # a zombie until the worker notices: only then is it reaped
    queue.drop("second.yaml", "command: echo second\ngpus: 1\n")
    record = wait_until(lambda: queue.finished("second"), what="second to run through a new spawner")
    assert record["state"] == "done" and queue.log("second").splitlines().count("second") == 1
    assert queue.spawner("a").pid != spawner.pid


@pytest.mark.slow
def test_the_spawner_ends_with_its_worker_and_jobs_live_on(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop("long.yaml", "command: echo long-started; sleep 1.5\ngpus: 1\n")
    # The job itself has started (its own line is in its log), not only its record: a worker
    # killed between writing the record and its launch leaves an attempt that never started,
    # requeued as attempt 2 (a loaded run killed it in that window).
    wait_until(lambda: "long-started" in queue.log("long").splitlines(), what="long to start")
    spawner = queue.spawner("a")
    queue.stop_worker("a", signal.SIGKILL)
    spawner.wait(60)  # it read EOF from the dead worker's pipe and left
    queue.start_worker("a", "1x80GiB")  # reattaches; the supervisor records the exit
    record = wait_until(lambda: queue.finished("long"), what="long to end")
    assert record["state"] == "done" and record["attempt"] == 1
    assert queue.log("long").splitlines().count("long-started") == 1


@pytest.mark.slow
def test_a_job_that_cannot_start_fails_with_the_reason_in_its_log(queue, tmp_path):
    """A command in words (`command: [prog, args]`, as `gpuq submit -- prog args` writes it)
    that is nowhere on the job's PATH fails as a shell's would: exit 127, with the PATH and
    workdir it had. It said "cannot start: No such file or directory", or named a directory
    of the PATH it could not search ("Permission denied: nosuchcmd"), with no exit status;
    one found but not runnable exits 126."""
    queue.start_worker("a", "1x80GiB")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "notrunnable").write_text("#!/bin/sh\necho no\n")  # mode 0644
    path = f"/no/such/dir:{tmp_path / 'bin'}:/usr/bin:/bin"
    queue.drop("noprog.yaml", f"command: [no-such-program-gpuq, --flag]\ngpus: 0\nenv: {{PATH: '{path}'}}\n")
    queue.drop("noexec.yaml", f"command: [notrunnable]\ngpus: 0\nenv: {{PATH: '{path}'}}\n")
    queue.drop("nodir.yaml", "command: 'true'\ngpus: 0\nworkdir: /no/such/dir\n")
    for job_id, code, said in (
        ("noprog", 127, "no such command was found"),
        ("noexec", 126, "the command was found but cannot be run"),
    ):
        record = wait_until(lambda job_id=job_id: queue.finished(job_id), what=f"{job_id} to be settled")
        assert record["state"] == "failed" and record["exit_code"] == code, record
        assert record["reason"].startswith(f"exit {code}: {said}") and f"PATH was {path}" in record["reason"]
        command = "no-such-program-gpuq" if job_id == "noprog" else "notrunnable"
        shell_words = "command not found" if code == 127 else "Permission denied"
        assert f"gpuq: {command}: {shell_words}" in queue.log(job_id)
    message = "cannot start: No such file or directory (workdir): /no/such/dir"
    record = wait_until(lambda: queue.finished("nodir"), what="nodir to be settled")
    assert record["state"] == "failed" and record["reason"] == message
    assert f"==> gpuq: {message}" in queue.log("nodir")


@pytest.mark.slow
def test_a_job_gets_a_clean_signal_state_and_its_workdir(queue, tmp_path):
    # Started the way a shell starts a background job: SIGQUIT (and SIGINT) ignored.
    queue.workers["a"] = subprocess.Popen(
        worker_argv(queue.root, "a", "1x80GiB", "--foreground"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=queue.env(),
        preexec_fn=lambda: [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGQUIT, signal.SIGINT)],
    )
    queue.drop("sigs.yaml", f"command: grep -E '^Sig(Ign|Blk)' /proc/self/status; pwd\ngpus: 0\nworkdir: {tmp_path}\n")
    wait_until(lambda: queue.finished("sigs"), what="sigs to run")
    log = queue.log("sigs")
    masks = dict(line.split(":\t") for line in log.splitlines() if line.startswith("Sig"))
    standard = (1 << 31) - 1  # signals 1-31; 32 and up are the C library's own
    assert int(masks["SigIgn"], 16) & standard == 0 and int(masks["SigBlk"], 16) & standard == 0
    assert f"\n{tmp_path}\n" in log


def _supervisor_of(queue, job_id: str) -> int:
    """The pid in the job's `started` marker (its lock file), once the job runs."""
    lock = queue.local_base / "a" / "jobs" / f"{job_id}.lock"
    wait_until(lambda: lock.exists() and lock.read_text(), what=f"{job_id}'s started marker")
    return json.loads(lock.read_text())["supervisor_pid"]


@pytest.mark.slow
def test_a_free_supervisor_takes_the_next_job_and_obeys_only_its_own_stop(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop("first.yaml", "command: sleep 1\ngpus: 1\n")
    first = _supervisor_of(queue, "first")
    wait_until(lambda: queue.finished("first"), what="first to run")
    queue.drop("second.yaml", "command: sleep 1\ngpus: 1\n")
    supervisor = _supervisor_of(queue, "second")
    # A stray SIGTERM (say, a cancel of the job it ran before, arriving late) stops nothing.
    os.kill(supervisor, signal.SIGTERM)
    record = wait_until(lambda: queue.finished("second"), what="second to run")
    assert record["state"] == "done"
    assert first == supervisor  # one supervisor, one job at a time
    queue.drop("third.yaml", "command: sleep 30\ngpus: 1\n")
    assert _supervisor_of(queue, "third") == supervisor
    queue.gpuq("cancel", "third")
    record = wait_until(lambda: queue.finished("third"), what="third to be cancelled")
    assert record["state"] == "cancelled" and record["signal"] == signal.SIGTERM


@pytest.mark.slow
def test_a_job_exit_wakes_the_worker_at_once(queue):
    queue.write_config(poll_interval=30)  # a poll would take 30 s; the exit must not wait for it
    queue.drop("first.yaml", "command: sleep 0.5\ngpus: 1\n")
    queue.drop("second.yaml", "command: echo second\ngpus: 1\n")
    os.utime(queue.root / "jobs" / "second.yaml", (time.time() + 1, time.time() + 1))  # queued later
    queue.start_worker("a", "1x80GiB")
    wait_until(lambda: queue.finished("first"), timeout=10, what="first to end")
    wait_until(lambda: queue.finished("second"), timeout=10, what="second to start well before a poll")
    assert queue.finished("second")["claimed_at"] >= queue.finished("first")["ended_at"]


def _asleep(pid: int, samples: int = 10) -> bool:
    """The worker waits in its sleep's select (not in a pass) at each of `samples` looks
    20 ms apart: a pass a poke started would show in between."""
    for _ in range(samples):
        with open(f"/proc/{pid}/wchan") as f:
            waits_in = f.read()
        if "poll" not in waits_in and "select" not in waits_in:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.slow
def test_a_spec_dropped_into_jobs_by_hand_wakes_a_sleeping_worker(queue):
    """A script or an editor that writes into jobs/ pokes nobody: the sleeping worker notices
    the directory change, not its next poll."""
    queue.write_config(poll_interval=60)
    queue.start_worker("a", "1x80GiB")
    queue.drop("first.yaml", "command: echo first\ngpus: 1\n")  # the start's pass may take this one in
    wait_until(
        lambda: queue.finished("first") and not os.listdir(queue.root / "state" / "claims"),
        timeout=90,
        what="first to end",
    )
    # The pass its end woke is over, so the worker sleeps for its 60 s poll. (Should a look
    # miss a pass, the drop below is met by that pass: the test could pass on a worker that
    # ignores jobs/, never fail on one that watches it.)
    wait_until(lambda: _asleep(queue.worker_pid("a")), what="the worker asleep")
    dropped = time.time()
    queue.drop("second.yaml", "command: echo second\ngpus: 1\n")
    second = wait_until(lambda: queue.finished("second"), timeout=30, what="second to start well before a poll")
    assert second["claimed_at"] - dropped < 30


@pytest.mark.slow
def test_memory_used_outside_gpuq_is_respected(queue, tmp_path):
    fake = tmp_path / "gpus.json"
    person = subprocess.Popen(["sleep", "600"])
    try:
        fake.write_text(
            json.dumps(
                {
                    "gpus": [{"name": "Fake GPU", "uuid": "GPU-x", "memory_total_mib": 81920}],
                    "processes": [{"pid": person.pid, "gpu": 0, "used_mib": 70 * 1024, "util": 90}],
                }
            )
        )
        queue.start_worker("a", str(fake))
        queue.drop("fits-later.yaml", "command: echo ran\ngpus: 1\ngpu_mem: 20GiB\n")
        reason = wait_until(lambda: [p["reason"] for p in queue.status()["pending"]], what="reason")
        assert reason == ["needs 20GiB on one GPU; most free now is 10GiB on a:0"]
        person.kill()
        wait_until(lambda: queue.finished("fits-later"), what="job to run once the GPU is free")
    finally:
        person.kill()


@pytest.mark.slow
def test_job_memory_is_observed_through_its_process_tree(queue):
    queue.start_worker("a", "1x80GiB")
    # 10 s of use: under two suites' load the first sample and a status poll missed a 3 s window.
    queue.drop("user.yaml", f"command: {fake_job(10)!r}\ngpus: 1\ngpu_mem: 12GiB\n")
    view = wait_until(
        lambda: [r for r in queue.status()["running"] if r["observed_gpu_mem_mib"]], what="observed memory"
    )
    assert view[0]["observed_gpu_mem_mib"] == 12 * 1024
    assert view[0]["declared_gpu_mem_mib"] == 12 * 1024
    record = wait_until(lambda: queue.finished("user"), what="job end")
    assert record["peak_gpu_mem_mib"] == 12 * 1024


def test_a_reused_id_is_refused_not_overwritten(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    box.drop("same.yaml", "command: echo one\ngpus: 0\n")
    box.run_pass(after_s=2)
    box.finish("same")
    box.run_pass(after_s=1)
    log = box.root / "logs" / "same.log"
    log.write_text("one\n")  # what its supervisor wrote
    box.drop("same.yaml", "command: echo two\ngpus: 0\n")
    box.run_pass(after_s=2)
    rejected = box.layout.rejected
    (error,) = [p.read_text() for p in rejected.glob("same*.error")]  # under a name of its own
    assert "already used" in error and "same-2.yaml" in error
    assert not (rejected / "same.error").exists()
    # Only the first ran, and its record (which keeps the id, as its log does) is untouched.
    assert box.launched() == ["same"]
    finished = read_record(box.layout.record(box.layout.finished, "same"))
    assert finished is not None and finished.spec["command"] == "echo one" and log.read_text() == "one\n"


def _boot_id() -> str:
    from gpuq.host.hostinfo import boot_id

    return boot_id()


def test_a_claim_never_recorded_goes_back_to_the_queue_and_runs_once(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    claim = box.layout.claims / f"orphan@a@{_boot_id()[:8]}@999999@abcd@a1.yaml"
    claim.write_text("command: echo ran-once\ngpus: 0\n")
    for _ in range(4):
        box.run_pass(after_s=1)
    assert box.launched() == ["orphan"]  # once
    assert box.finish("orphan").state is State.DONE
    box.run_pass(after_s=1)
    assert not claim.exists() and box.launched() == ["orphan"]


def test_a_recorded_attempt_that_never_started_is_requeued_at_its_old_place(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")  # its first pass comes once the attempt is there
    state = box.layout.state
    name = f"early@a@{_boot_id()[:8]}@999999@abcd@a1.yaml"
    (state / "claims" / name).write_text("command: echo started-now\ngpus: 0\n")
    (state / "running" / "early.json").write_text(
        json.dumps(
            {
                "id": "early",
                "state": "running",
                "spec": {"command": "echo started-now", "gpus": 0},
                "spec_text": "command: echo started-now\ngpus: 0\n",
                "host": "a",
                "boot_id": _boot_id(),
                "claim": name,
                "queued_at": 1000.0,
                "attempt": 1,
            }
        )
    )
    for _ in range(4):
        box.run_pass(after_s=1)
    assert box.launched() == ["early"]  # once
    record = box.finish("early")
    assert record.state is State.DONE and record.queued_at == 1000.0
    events = [json.loads(line) for line in (box.layout.events / "a.jsonl").read_text().splitlines()]
    assert any(e.get("to") == "pending" and e["job"] == "early" for e in events)


def test_show_explains_a_rejected_spec(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    box.drop("oops.yaml", "command: x\ngpus: lots\n")
    box.run_pass()
    box.run_pass(after_s=2)  # past spec_settle_s
    assert (box.layout.rejected / "oops.error").exists()
    shown = gpuq(box.root, "show", "oops").stdout
    assert "state:            rejected" in shown and "field 'gpus'" in shown and "gpus: 1" in shown


@pytest.mark.slow
def test_show_masks_secret_looking_env_values_and_records_are_not_world_readable(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop(
        "sec.yaml",
        "command: 'true'\ngpus: 0\nenv:\n  WANDB_API_KEY: abc123\n  HF_TOKEN: 'hf_x'\n  PLAIN: visible\nretries: 0\n",
    )
    queue.drop("flow.yaml", "command: 'true'\ngpus: 0\nenv: {DB_PASSWORD: hunter2, MODE: fast}\n")
    for job_id in ("sec", "flow"):
        wait_until(lambda job_id=job_id: queue.finished(job_id), what=f"{job_id} to run")
    for args in (("show", "sec"), ("show", "--json", "sec"), ("show", "--json", "flow")):
        out = queue.gpuq(*args).stdout
        assert "abc123" not in out and "hf_x" not in out and "hunter2" not in out, out
    shown = json.loads(queue.gpuq("show", "--json", "sec").stdout)
    assert shown["spec"]["env"] == {"WANDB_API_KEY": "****", "HF_TOKEN": "****", "PLAIN": "visible"}
    assert json.loads(queue.gpuq("show", "--json", "flow").stdout)["spec"]["env"]["MODE"] == "fast"
    for path in (queue.root / "state" / "finished" / "sec.json", queue.root / "logs" / "sec.log"):
        assert path.stat().st_mode & 0o007 == 0, path


@pytest.mark.slow
def test_exit_when_idle_runs_the_queue_dry_and_exits_0(queue):
    for i in range(3):
        queue.drop(f"j{i}.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 1GiB\n")
    done = subprocess.run(
        worker_argv(queue.root, "a", "1x80GiB", "--foreground", "--exit-when-idle"),
        capture_output=True,
        text=True,
        env=queue.env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert all(queue.finished(f"j{i}")["state"] == "done" for i in range(3))


@pytest.mark.slow
def test_once_starts_what_it_claims_and_the_jobs_end_after_it_left(queue):
    """`worker.py --once`: one pass, then exit; the jobs it started run on under their
    supervisors. Its root part ends with it, so a --once worker that left before each
    supervisor had its keeper handed its jobs back unstarted: each one claimed, shown running,
    never run, and claimed the same way by the next --once."""
    queue.write_config(spec_settle_s=0.01)  # claimed in its one pass
    for i in range(2):
        queue.drop(f"o{i}.yaml", "command: 'echo ran'\ngpus: 1\ngpu_mem: 1GiB\n")
    done = subprocess.run(
        worker_argv(queue.root, "a", "2x80GiB", "--once"), capture_output=True, text=True, env=queue.env(), timeout=60
    )
    assert done.returncode == 0, done.stderr
    for i in range(2):
        record = wait_until(lambda i=i: queue.finished(f"o{i}"), timeout=60, what=f"o{i} to end after the worker left")
        assert record["state"] == "done" and record["attempt"] == 1, record
        assert "ran" in queue.log(f"o{i}")


@pytest.mark.slow
def test_once_does_not_wait_for_a_job_no_supervisor_took(queue):
    """A launch the spawner could not hand to a supervisor (its lock path is a directory):
    nothing will start its keeper, so a --once worker leaves after its pass instead of waiting
    out its 30 s bound, and the next worker settles the job."""
    queue.write_config(spec_settle_s=0.01)
    (queue.local_base / "a" / "jobs" / "f1.lock").mkdir(parents=True)
    for private in (queue.local_base / "a", queue.local_base / "a" / "jobs"):
        os.chmod(private, 0o700)  # the worker's own, as it makes them
    queue.drop("f1.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 1GiB\n")
    try:  # a pass takes a second or two; 20 s is far from both, even on a loaded machine
        done = subprocess.run(
            worker_argv(queue.root, "a", "1x80GiB", "--once"),
            capture_output=True,
            text=True,
            env=queue.env(),
            timeout=20,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the --once worker waited for a keeper that no supervisor was coming to start")
    assert done.returncode == 0 and "could not start the supervisor of f1" in done.stderr, done.stderr


@pytest.mark.slow
def test_exit_when_idle_leaves_only_when_nothing_it_could_start_remains(queue):
    """A dropped sweep is expanded in one pass and its members read in the next; a job whose
    dependency ends is released; a job no box here could run does not keep it waiting."""
    queue.drop("sw.yaml", "command: 'echo {x}'\ngpus: 1\ngpu_mem: 1GiB\nsweep: {x: [1, 2, 3, 4, 5, 6]}\n")
    queue.drop("first.yaml", "command: 'true'\ngpus: 0\n")
    queue.drop("then.yaml", "command: 'true'\ngpus: 0\nafter: [first]\n")
    queue.drop("huge.yaml", "command: 'true'\ngpus: 8\n")
    done = subprocess.run(
        worker_argv(queue.root, "a", "1x80GiB", "--foreground", "--exit-when-idle"),
        capture_output=True,
        text=True,
        env=queue.env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ran = sorted(p.stem for p in (queue.root / "state" / "finished").glob("*.json"))
    assert ran == sorted([f"sw_x{i}" for i in range(1, 7)] + ["first", "then"]), ran
    assert (queue.root / "jobs" / "huge.yaml").exists()


@pytest.mark.slow
def test_exit_when_idle_waits_for_an_opportunistic_job_whose_gpu_is_becoming_idle(queue):
    """A low-priority job starts once a GPU has been idle for idle_after_s: the worker stays
    for it, and leaves when it has run."""
    queue.write_config(idle_after_s=1.5)
    queue.drop("lo.yaml", "command: 'true'\ngpus: 1\npriority: low\n")
    done = subprocess.run(
        worker_argv(queue.root, "a", "1x80GiB", "--foreground", "--exit-when-idle"),
        capture_output=True,
        text=True,
        env=queue.env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (queue.finished("lo") or {}).get("state") == "done", sorted(p.name for p in queue.root.rglob("*"))


def test_a_watched_change_ends_the_sleep_no_sooner_than_its_path_allows(tmp_path):
    """Other boxes' claims change jobs/ as a dropped spec does: such a change ends a worker's
    sleep only once `not_before` has come (the worker passes its last pass + JOBS_WATCH_GAP_S),
    and a change of another watched path at once."""
    from gpuq.host.wake import WAKE_QUEUE_CHANGED, WakeFifo, mtime_ns

    jobs, inbox = tmp_path / "jobs", tmp_path / "requests"
    jobs.mkdir(), inbox.mkdir()
    fifo = WakeFifo(tmp_path)
    seen = [mtime_ns(inbox), mtime_ns(jobs)]
    os.utime(jobs, ns=(seen[1] + 10**9, seen[1] + 10**9))  # jobs/ changed since it was read
    start = time.monotonic()
    assert fifo.sleep(30, watch=(inbox, jobs), seen=seen, not_before=(0.0, start + 1.0)) == WAKE_QUEUE_CHANGED
    waited = time.monotonic() - start
    assert 1.0 <= waited < 30
    seen[1] = mtime_ns(jobs)
    os.utime(inbox, ns=(seen[0] + 10**9, seen[0] + 10**9))
    start = time.monotonic()
    assert fifo.sleep(30, watch=(inbox, jobs), seen=seen, not_before=(0.0, start + 20.0)) == WAKE_QUEUE_CHANGED
    assert time.monotonic() - start < 20
