"""Expected starts (sched/estimate.py): the queue replayed forward through the plan, running
jobs ending by their time limits; shown by `gpuq status` as START BY and in `status --json`."""

from __future__ import annotations

import math
import re
import time
from dataclasses import replace

import pytest
import yaml
from test_plan import gpu, host
from test_plan_scheduling import CFG, G, job, run

from conftest import wait_until
from gpuq.model.jobs import SetAside
from gpuq.model.usage import kind_of, typical
from gpuq.sched.estimate import (
    AFTER_DEPENDENCIES,
    ARRAY_LIMIT,
    LATER,
    NO_ROOM,
    NOT_ESTIMATED,
    UNKNOWN,
    WHEN_IDLE,
    Estimate,
    learned_runs,
    replay_starts,
    typical_runs,
)


def test_each_job_is_expected_when_the_limits_ahead_of_it_run_out():
    busy = [run("r", gpus=(0,), mem_gib=None, started_at=0, limit_s=1000)]
    pending = [
        job("j1", mem_gib=None, queued_at=1, limit_s=300),
        job("j2", mem_gib=None, queued_at=2, limit_s=300),
        job("j3", mem_gib=None, queued_at=3),  # no limit: nothing behind it can be estimated
        job("j4", mem_gib=None, queued_at=4, limit_s=100),
    ]
    # Each job with a limit has left by its limit and a grace after (SIGTERM, then SIGKILL).
    expected = {"j1": 1000 + G, "j2": 1300 + 2 * G, "j3": 1600 + 3 * G}
    assert replay_starts(pending, [host("h", gpu(0))], busy, CFG, now=10).starts == expected


def test_a_job_without_an_estimate_says_why():
    """START BY used to show "-" for all of these alike (a review: ambiguous)."""
    busy = [run("r", gpus=(0,), mem_gib=None, started_at=0, limit_s=1000)]
    pending = [
        job("open", mem_gib=None, queued_at=1),  # no limit: nothing behind it can be estimated
        job("behind", mem_gib=None, queued_at=2, limit_s=100),
        job("dep", mem_gib=None, queued_at=3, limit_s=100),
        job("lo", mem_gib=None, queued_at=4, priority="low"),
        job("arr_3", mem_gib=None, queued_at=5, limit_s=100),
    ]
    blocked = {"dep": "waits for open", "arr_3": "array limit: 1 of arr running, at most 1 at once (%1)"}
    got = replay_starts(pending, [host("h", gpu(0))], busy, CFG, now=10, blocked=blocked)
    assert got.starts == {"open": 1000 + G}
    # A throttled array member said "after deps" (a Slurm user's session): it has none.
    assert got.why_none == {"behind": UNKNOWN, "dep": AFTER_DEPENDENCIES, "lo": WHEN_IDLE, "arr_3": ARRAY_LIMIT}
    months = [run("r", gpus=(0,), mem_gib=None, started_at=0, limit_s=200 * 86400)]
    far = replay_starts([job("far", mem_gib=None, limit_s=60)], [host("h", gpu(0))], months, CFG, now=10)
    assert (far.starts, far.why_none) == ({}, {"far": LATER})
    # First in line on an idle cluster, and too big for any GPU: nothing to wait behind (a review:
    # it said "unknown: a job it waits behind has no time limit").
    big = replay_starts([job("big", mem_gib=120, limit_s=60)], [host("h", gpu(0))], [], CFG, now=10)
    assert (big.starts, big.why_none) == ({}, {"big": NO_ROOM})
    # ... and so behind a job without a limit (a member's hand-dropped 30 GiB spec on 24 GiB GPUs
    # read "unknown"), while one that fits there is unknown.
    endless = [run("r", gpus=(0,), mem_gib=None, started_at=0, limit_s=None)]
    both = [job("big", mem_gib=120, queued_at=1, limit_s=60), job("fits", mem_gib=None, queued_at=2, limit_s=60)]
    behind = replay_starts(both, [host("h", gpu(0))], endless, CFG, now=10)
    assert behind.why_none == {"big": NO_ROOM, "fits": UNKNOWN}, behind.why_none
    crowd = [run(f"r{i}", gpus=(0,), mem_gib=1, started_at=0, limit_s=10 + i) for i in range(300)]
    many = [job(f"w{i}", mem_gib=79, queued_at=i, limit_s=1) for i in range(2)]
    steps = replay_starts(many, [host("h", gpu(0))], crowd, CFG, now=0)  # over MAX_STEPS moments to replay
    assert steps.why_none == {"w0": NOT_ESTIMATED, "w1": NOT_ESTIMATED}, steps


def test_a_job_that_fits_now_is_expected_now_and_a_backfill_before_the_head():
    busy = [run("r", gpus=(0,), mem_gib=None, started_at=0, limit_s=1000)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=1), job("short", mem_gib=None, queued_at=2, limit_s=500)]
    expected = replay_starts(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=10).starts
    assert expected == {"short": 10, "pair": 1000 + G}  # short has left (510 + G) before pair is due


def test_the_likely_start_is_where_the_jobs_ahead_end_as_their_kinds_usually_do():
    """A range, not only a bound: the running job's limit is 1000 s, its kind usually takes
    about 100 s, so the waiting job likely starts at 100 and by 1000 at the latest."""
    busy = [run("train-7", gpus=(0,), mem_gib=None, started_at=0, limit_s=1000)]
    pending = [job("eval-1", mem_gib=None, queued_at=1, limit_s=300), job("eval-2", mem_gib=None, queued_at=2)]
    durations = {kind_of("u", "train-7"): [90.0, 110.0, 100.0], kind_of("u", "eval-1"): [50.0]}
    usual = typical_runs(pending, busy, durations, now=10)
    assert usual == {"train-7": 100.0}  # one run of eval is no history
    gpus = [host("h", gpu(0))]
    latest = replay_starts(pending, gpus, busy, CFG, now=10).starts
    likely = replay_starts(pending, gpus, busy, CFG, now=10, run_for=usual).starts
    assert latest == {"eval-1": 1000 + G, "eval-2": 1300 + 2 * G} and likely == {"eval-1": 100, "eval-2": 400 + G}
    # Past every run of its kind, a running job ends by its limit for all anyone knows.
    assert typical_runs(pending, busy, durations, now=500) == {}


def test_a_running_job_is_expected_to_run_as_long_as_the_runs_of_its_kind_that_outlasted_it():
    """Runs of one kind differ by orders of magnitude: one that has run 500 s is not a ~100 s
    job. It runs as long as the kind's runs that outlasted 500 s (the median of 3000 and 5000),
    not until its limit; the waiting job's likely start moves with it. Every running job is
    judged so, from its first second (at 50 s: the median of the five, all longer)."""
    busy = [run("train-7", gpus=(0,), mem_gib=None, started_at=0, limit_s=86400)]
    pending = [job("eval-1", mem_gib=None, queued_at=1, limit_s=300)]
    durations = {kind_of("u", "train-7"): [90.0, 110.0, 100.0, 3000.0, 5000.0]}
    assert typical_runs(pending, busy, durations, now=50) == {"train-7": 110.0}
    assert typical_runs(pending, busy, durations, now=95) == {"train-7": 1555.0}  # 100, 110, 3000, 5000
    usual = typical_runs(pending, busy, durations, now=500)
    assert usual == {"train-7": 4000.0}
    likely = replay_starts(pending, [host("h", gpu(0))], busy, CFG, now=500, run_for=usual).starts
    assert likely == {"eval-1": 4000}
    # One run that lasted longer is no history (as one run of a kind is none); longer than any: by its limit.
    assert typical_runs(pending, busy, durations, now=4000) == typical_runs(pending, busy, durations, now=6000) == {}


def test_the_runs_a_running_job_is_judged_by_lasted_longer_than_it_has():
    """A run exactly as long as this one has run so far is not one that outlasted it; a box
    whose clock is behind (the job started "in the future") counts every run."""
    kind = {kind_of("u", "t-1"): [100.0, 200.0, 300.0]}
    assert typical(kind, "u", "t-1", ran_s=100.0) == 250.0
    assert typical(kind, "u", "t-1", ran_s=-150.0) == typical(kind, "u", "t-1") == 200.0
    assert typical(kind, "u", "t-1", ran_s=200.0) is None  # only one run left


def test_a_job_without_a_limit_that_outran_every_run_of_its_kind_leaves_the_jobs_behind_it_unknown():
    """Its kind's longest run stands in for its limit, until it has run longer: then nobody
    knows when it ends, and the job behind it says `unknown`, not `no room`."""
    running = [run("train-4", gpus=(0,), mem_gib=None, started_at=0)]
    durations = {kind_of("u", "train-4"): [90.0, 110.0]}
    waiting = [job("eval-1", mem_gib=None, queued_at=1, limit_s=300)]
    for now, expected in ((50.0, Estimate({"eval-1": 110.0 + G})), (500.0, Estimate({}, {"eval-1": UNKNOWN}))):
        estimates, limited = learned_runs(waiting, running, CFG, durations, now)
        assert replay_starts(waiting, [host("h", gpu(0))], limited, CFG, now, estimates=estimates) == expected


def test_a_job_behind_one_past_its_limit_starts_when_that_ones_grace_runs_out():
    """A job past its time limit is being stopped: SIGTERM at the limit, SIGKILL after its
    grace (its spec's, else config's). The job behind it said `no room` for as long as the
    stop took (five minutes, for a job that checkpoints with `grace: 5m`); a box late to stop
    it leaves it to the next pass."""
    gpus = [host("h", gpu(0))]
    waiting = [job("w", mem_gib=None, queued_at=1, limit_s=300)]
    over = run("over", gpus=(0,), mem_gib=None, started_at=0, limit_s=100)
    assert replay_starts(waiting, gpus, [over], CFG, now=105).starts == {"w": 100 + CFG.grace_s}
    checkpointing = replace(over, grace_s=300.0)
    for now in (105, 250):  # the same moment, however late it is asked
        assert replay_starts(waiting, gpus, [checkpointing], CFG, now=now).starts == {"w": 400}
    late = replay_starts(waiting, gpus, [over], CFG, now=150).starts
    assert late == {"w": 150 + CFG.poll_interval}


def test_a_job_behind_a_yielding_low_job_is_expected_when_that_ones_grace_runs_out():
    """A low job told to yield frees its GPU within its grace; the job it yields for read
    START BY now while it drained (the replay left low jobs out), and a low job not told to
    yield is still left out: the plan preempts it when it must (and where it may)."""
    gpus = [host("h", gpu(0))]
    waiting = [job("w", mem_gib=None, queued_at=1, limit_s=300)]
    draining = run("lo", gpus=(0,), mem_gib=None, low=True, started_at=0, stopping=True)
    assert replay_starts(waiting, gpus, [draining], CFG, now=50).starts == {"w": 50 + CFG.grace_s}
    own_grace = replace(draining, grace_s=5.0)
    assert replay_starts(waiting, gpus, [own_grace], CFG, now=50).starts == {"w": 55}
    not_told = replace(draining, stopping=False)
    assert replay_starts(waiting, gpus, [not_told], CFG, now=50).starts == {"w": 50}
    # Where preemption is off, nothing makes a low job yield: the job behind it waits for its end.
    no_preemption = replace(CFG, preemption=False)
    limited = replace(not_told, limit_s=600.0)
    assert replay_starts(waiting, gpus, [limited], no_preemption, now=50).starts == {"w": 600 + G}
    assert replay_starts(waiting, gpus, [not_told], no_preemption, now=50).why_none == {"w": UNKNOWN}


@pytest.mark.slow
def test_status_expects_the_job_behind_a_stopping_one_within_its_grace(queue):
    """Through a worker: a job that ignores SIGTERM passes its 1 s limit with a 30 s grace; the
    job waiting for its GPU is expected when the grace ends, the same moment however often
    status is asked, not told `no room`."""
    queue.start_worker("a", "1x80GiB")
    queue.drop("ckpt.yaml", "command: trap '' TERM; sleep 60\ngpus: 1\ntime_limit: 1s\ngrace: 30s\n")
    started = wait_until(lambda: (queue.record("ckpt") or {}).get("claimed_at"), what="ckpt to run")
    queue.drop("next.yaml", "command: 'true'\ngpus: 1\ntime_limit: 10m\n")
    wait_until(lambda: time.time() > started + 2, what="ckpt past its limit")
    row = wait_until(
        lambda: next((p for p in queue.status()["pending"] if p["id"] == "next"), None), what="next pending"
    )
    assert row.get("no_estimate") is None, row
    assert abs(row["expected_start"] - (started + 1 + 30)) < 2, row  # its limit, then its own grace
    again = next(p for p in queue.status()["pending"] if p["id"] == "next")
    assert again["expected_start"] == row["expected_start"], (row, again)


@pytest.mark.slow
def test_status_shows_when_a_waiting_job_will_start_at_the_latest(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop("long.yaml", "command: sleep 60\ngpus: 1\ntime_limit: 1h\n")
    started = wait_until(lambda: (queue.record("long") or {}).get("claimed_at"), what="long to run")
    queue.drop("next.yaml", "command: 'true'\ngpus: 1\ntime_limit: 10m\n")
    queue.drop("open.yaml", "command: 'true'\ngpus: 1\n")  # no limit: the job behind it ...
    queue.drop("after.yaml", "command: 'true'\ngpus: 1\ntime_limit: 10m\n")  # ... has no estimate
    rows = wait_until(
        lambda: {p["id"]: p for p in queue.status()["pending"]} if len(queue.status()["pending"]) == 3 else None
    )
    grace = yaml.safe_load((queue.root / "config.yaml").read_text())["grace_s"]  # each job ahead: by limit + grace
    assert abs(rows["next"]["expected_start"] - (started + 3600 + grace)) < 5, rows["next"]
    assert abs(rows["open"]["expected_start"] - (started + 3600 + 600 + 2 * grace)) < 5, rows["open"]
    assert rows["after"]["expected_start"] is None and rows["after"]["no_estimate"] == "unknown"
    text = queue.gpuq("status").stdout
    line = next(line for line in text.splitlines() if " next " in f" {line} ")
    due = math.ceil(rows["next"]["expected_start"] / 60) * 60  # a latest start: rounded up to the minute
    assert time.strftime("%H:%M", time.localtime(due)) in line, text
    assert "START BY" in text
    after = next(line for line in text.splitlines() if " after " in f" {line} ")
    assert " unknown " in after, text  # why it has none, where "-" said nothing
    shown_after = queue.gpuq("show", "after").stdout
    assert re.search(r"expected_start: +unknown: a job it waits behind has no time limit", shown_after), shown_after
    shown = queue.gpuq("show", "next").stdout
    due_s = math.ceil(rows["next"]["expected_start"])  # `show` gives the second (rounded up too)
    assert re.search(r"expected_start: +by " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(due_s)), shown), shown


@pytest.mark.slow
def test_status_and_show_give_a_likely_start_from_the_runs_of_the_kind_ahead(queue):
    """Two earlier runs of `train` took 10 minutes each (events as a worker writes them, on a box
    gone since); the third runs with a 1-hour limit, so the job behind it starts by the hour's
    end at the latest and likely 10 minutes after the third began."""
    import getpass
    import json as jsonlib
    import subprocess

    from conftest import worker_argv

    me, now = getpass.getuser(), time.time()
    subprocess.run([*worker_argv(queue.root, "a", "1x80GiB"), "--once"], env=queue.env(), check=True, timeout=120)
    with open(queue.root / "state" / "events" / "old.jsonl", "a") as log:
        for n, start in ((1, now - 3000), (2, now - 2000)):
            ended = {"job": f"train-{n}", "from": "running", "to": "done", "user": me, "gpus": [0], "attempt": 1}
            when = {"t": start + 600, "started_at": start, "ended_at": start + 600}
            log.write(jsonlib.dumps({"by": "old", **ended, **when}) + "\n")
    queue.start_worker("a", "1x80GiB")
    queue.gpuq("submit", "--id", "train-3", "-t", "1:00:00", "--", "sleep", "600")  # the third of its kind
    started = wait_until(lambda: (queue.record("train-3") or {}).get("claimed_at"), what="train-3 to run")
    queue.gpuq("submit", "-J", "eval", "-t", "10", "--", "true")
    row = wait_until(
        lambda: next((p for p in queue.status()["pending"] if p["id"] == "eval-1" and p["likely_start"]), None),
        what="eval-1's likely start (the worker reads the old box's events into the durations it publishes)",
    )
    assert abs(row["expected_start"] - (started + 3600)) < 5 and abs(row["likely_start"] - (started + 600)) < 5, row
    shown = queue.gpuq("show", "eval-1").stdout
    likely = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["likely_start"]))
    assert re.search(rf"likely_start: +{likely}, if the jobs ahead run as long as their kinds usually do", shown), shown
    assert re.search(r"expected_start: +by ", shown), shown


def test_a_booking_ending_is_a_moment_the_estimate_moves_to():
    """A review: a job waiting only for someone's booking to end had no estimate."""
    b = SetAside("h", (0,), start=0, end=1800, owner="bob")
    estimate = replay_starts(
        [job("mine", user="ana", mem_gib=None, limit_s=300)], [host("h", gpu(0))], [], CFG, 10, set_aside=[b]
    )
    assert estimate.starts == {"mine": 1800}


def test_a_running_jobs_memory_leaves_with_it_in_the_replay():
    """A Slurm user's finding: START BY said "no room" beside a reason that reserved GPUs for the
    job. The replay ended the running job but left the memory NVML saw it use on its GPU, where
    the plan counts it as someone else's."""
    from dataclasses import replace

    busy = [replace(run("r", gpus=(0,), mem_gib=20, started_at=0, limit_s=1000), observed_mib={0: 20 * 1024})]
    whole = [job("whole", mem_gib=None, queued_at=1, limit_s=300)]
    seen = host("h", gpu(0, total_gib=24, used_gib=20))  # what NVML sees: r's 20 GiB
    got = replay_starts(whole, [seen], busy, CFG, now=10)
    assert got.starts == {"whole": 1000 + G} and "whole" not in got.why_none
