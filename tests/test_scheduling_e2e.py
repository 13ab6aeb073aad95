"""Scheduling through the real worker on fake GPUs: opportunistic jobs that yield to real
work (through a supervisor's TERM and KILL), to a person, and to the end of their window. A
big job that a stream of small ones cannot starve is driven in this process on a clock the
test moves (tests/test_team_passes.py)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from conftest import PY, REPO, wait_until

pytestmark = pytest.mark.slow  # every test here starts processes

LOOP_IGNORING_TERM = (
    "echo attempt=$GPUQ_ATTEMPT preempted=$GPUQ_PREEMPTED; trap 'echo got TERM' TERM; "
    "if [ $GPUQ_ATTEMPT = 1 ]; then while true; do sleep 0.1; done; fi; echo finished"
)
LOOP_YIELDING = (
    "echo attempt=$GPUQ_ATTEMPT preempted=$GPUQ_PREEMPTED; trap 'echo yielding; exit 0' TERM; "
    "if [ $GPUQ_ATTEMPT = 1 ]; then while true; do sleep 0.1; done; fi; echo finished"
)


def _spec(command: str, mem: str, priority: str = "normal", extra: str = "") -> str:
    return f"command: {command!r}\ngpus: 1\ngpu_mem: {mem}\npriority: {priority}\n{extra}"


def _running(queue, job_id: str) -> bool:
    return (queue.root / "state" / "running" / f"{job_id}.json").exists()


def test_real_work_preempts_an_opportunistic_job_that_ignores_sigterm(queue):
    queue.write_config(idle_after_s=0.5, grace_s=20, lost_after_s=120)  # the job's own grace is 1 s
    queue.start_worker("a", "1x80GiB")
    queue.drop("soak.yaml", _spec(LOOP_IGNORING_TERM, "60GiB", "low", "grace: 1s\n"))
    wait_until(lambda: "attempt=1" in queue.log("soak"), what="the opportunistic job to start")
    assert "soak (low)" in queue.gpuq("status").stdout  # RUNNING marks the job that will yield
    running = json.loads(queue.gpuq("show", "soak", "--json").stdout)  # how long it has run, as status says
    assert running["elapsed_s"] >= 0 and "elapsed:" in queue.gpuq("show", "soak").stdout
    queue.drop("real.yaml", _spec("echo real", "40GiB"))
    queue.drop("sneak.yaml", _spec("echo sneak", "30GiB", "low"))  # must not take the freed memory first
    real = wait_until(lambda: queue.finished("real"), timeout=15, what="the real job to run (after 1 s, not 20)")
    soak = wait_until(lambda: queue.finished("soak"), timeout=30, what="the preempted job to finish later")
    sneak = wait_until(lambda: queue.finished("sneak"), timeout=30, what="the other low job")
    log = queue.log("soak")
    assert "got TERM" in log and "killed by signal 9 (preempted: job real needs its GPU memory)" in log
    assert "attempt=2 preempted=1" in log and soak["state"] == "done" and soak["attempt"] == 2
    assert real["state"] == "done" and real["started_at"] <= soak["started_at"]
    assert real["started_at"] <= sneak["started_at"]
    requeued = [e for e in queue.events() if e["job"] == "soak" and e.get("to") == "pending"]
    assert requeued and requeued[0]["reason"] == (  # the cause once (it was said twice)
        "preempted: job real needs its GPU memory; killed by signal 9; requeued as attempt 2"
    )
    assert soak["queued_at"] == requeued[0]["queued_at"]  # a preempted job keeps its place
    shown = json.loads(queue.gpuq("show", "soak", "--json").stdout)
    assert [p["reason"] for p in shown["preemptions"]] == [requeued[0]["reason"]]
    assert shown["preemptions"][0]["told"] <= shown["preemptions"][0]["t"]  # told, then back in the queue
    assert "preemptions:      1" in queue.gpuq("show", "soak").stdout
    assert "preemptions" not in json.loads(queue.gpuq("show", "real", "--json").stdout)


def test_a_person_using_the_gpu_preempts_opportunistic_work_until_they_leave(queue):
    queue.write_config(idle_after_s=1)
    queue.start_worker("a", "1x80GiB")
    queue.drop("soak.yaml", _spec(LOOP_YIELDING, "10GiB", "low"))
    wait_until(lambda: "attempt=1" in queue.log("soak"), what="the opportunistic job to start")
    fake_gpus = next((queue.local_base / "a-fake").glob("fake-gpus-*.json"))
    person = subprocess.Popen(
        [PY, str(REPO / "gpuq.py"), "fake-use", "--mem", "2GiB", "--seconds", "120"],
        env={**queue.env(), "GPUQ_FAKE_GPUS": str(fake_gpus), "CUDA_VISIBLE_DEVICES": "0"},
    )
    wait_until(lambda: "yielding" in queue.log("soak"), what="the job to be told to yield")
    wait_until(lambda: not _running(queue, "soak"), what="the job to go back to the queue")
    pending = wait_until(
        lambda: [j for j in queue.status()["pending"] if j["id"] == "soak"], what="soak to show as pending"
    )
    assert "in use by others: a:0" in pending[0]["reason"]
    queue.wait_passes("a")
    assert person.poll() is None and not _running(queue, "soak")  # not restarted while they work
    # While it waits, `show` says what its next attempt will see (a member's use: attempt 1,
    # GPUQ_PREEMPTED=0, under "requeued as attempt 2").
    shown = json.loads(queue.gpuq("show", "soak", "--json").stdout)
    assert shown["attempt"] == 2 and shown["preemptions"]
    assert (shown["sees"]["env"]["GPUQ_ATTEMPT"], shown["sees"]["env"]["GPUQ_PREEMPTED"]) == ("2", "1")
    person.terminate()  # the person leaves
    person.wait(timeout=30)
    left_at = time.time()
    soak = wait_until(lambda: queue.finished("soak"), timeout=30, what="the job to run again")
    assert soak["attempt"] == 2 and "attempt=2 preempted=1" in queue.log("soak")
    assert soak["started_at"] >= left_at
    requeued = [e for e in queue.events() if e["job"] == "soak" and e.get("to") == "pending"]
    assert requeued[0]["reason"].startswith("preempted: a non-gpuq process uses GPU a:0")


def test_the_end_of_the_idle_window_preempts_and_holds_opportunistic_work(queue):
    now = time.localtime()
    start, end = (now.tm_hour * 60 + now.tm_min - 30) % 1440, (now.tm_hour * 60 + now.tm_min + 30) % 1440
    window = f"{start // 60:02d}:{start % 60:02d}-{end // 60:02d}:{end % 60:02d}"
    queue.write_config(idle_after_s=0.5, idle_windows=[window])
    queue.start_worker("a", "1x80GiB")
    queue.drop("night.yaml", _spec(LOOP_YIELDING, "10GiB", "low"))
    wait_until(lambda: "attempt=1" in queue.log("night"), what="the job to start inside its window")
    queue.stop_worker("a")  # the job runs on; the next worker lives two hours later
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_CLOCK_SHIFT_S": "7200"})
    wait_until(lambda: "yielding" in queue.log("night"), what="the window's end to preempt the job")
    wait_until(
        lambda: not _running(queue, "night") and (queue.root / "jobs" / "night.yaml").exists(),
        what="the job to go back to the queue",
    )
    queue.wait_passes("a", 3)  # several passes: it stays pending outside its window
    assert not _running(queue, "night") and queue.finished("night") is None
    requeued = [e for e in queue.events() if e["job"] == "night" and e.get("to") == "pending"]
    assert requeued[0]["reason"].startswith(f"preempted: idle window {window} closed")


def test_cancel_now_kills_a_job_that_ignores_sigterm_without_its_grace(queue):
    """A member cancelled a job with a day's grace that ignored SIGTERM: it went on "stopping",
    and only root's `kill -9` ended it. `gpuq cancel --now` kills it, even in the grace; and a
    job not stopping yet gets SIGKILL alone (a review: a TERM first started a checkpoint that
    the KILL cut short, and the record said sig15)."""
    queue.start_worker("a", "1x80GiB")
    mark = f"deaf-up {queue.root}"  # the root in it: a second copy of the suite runs its own
    queue.drop("deaf.yaml", f"command: trap '' TERM; echo {mark}; sleep 600\ngpus: 0\ngrace: 1d\n")
    # What its TERM trap prints is not in its command line (the log's header shows that).
    queue.drop("ckpt.yaml", "command: trap 'echo term-$((6*7))' TERM; echo ckpt-up; sleep 600\ngpus: 0\ngrace: 1d\n")
    wait_until(lambda: mark in queue.log("deaf") and "ckpt-up" in queue.log("ckpt"), timeout=30, what="both to start")
    queue.gpuq("cancel", "deaf")
    order = queue.root / "state" / "control" / "a" / "deaf.json"  # status shows it stopping from here on
    wait_until(
        lambda: not order.exists() and any(r["id"] == "deaf" and r["stopping"] for r in queue.status()["running"]),
        what="its worker to have obeyed it: its stop under way, a day's grace ahead",
    )
    done = queue.gpuq("cancel", "--now", "deaf", "ckpt")
    assert done.stdout.count("its worker kills it at once") == 2, done
    record = wait_until(lambda: queue.finished("deaf"), timeout=60, what="the KILL in the grace")
    assert record["state"] == "cancelled" and record["signal"] == 9, record
    assert not record["reason"].endswith("(at once, without its grace)"), record  # the first cancel's words
    ckpt = wait_until(lambda: queue.finished("ckpt"), timeout=60, what="the KILL at once")
    assert ckpt["state"] == "cancelled" and ckpt["signal"] == 9, ckpt
    assert ckpt["reason"].endswith("(at once, without its grace)"), ckpt
    assert "term-42" not in queue.log("ckpt")
