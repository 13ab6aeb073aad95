"""One plan for the team, through real workers on two stand-in boxes: every box plans over
every live box and acts on its own part, so caps, fair share and preemption hold team-wide,
and small jobs spread over idle GPUs before they share one."""

from __future__ import annotations

import json
import signal
import time

import pytest
from team import ALICE, BOB, needs_root

from conftest import ends_during_stream, wait_until

pytestmark = pytest.mark.slow  # every test here starts processes

# Takes its whole grace to go: long enough for every box to see the job it yields for.
SLOW_TO_YIELD = "trap '' TERM; if [ $GPUQ_ATTEMPT = 1 ]; then while true; do sleep 0.1; done; fi"
# Runs until told to yield the first time; once run again, ends at once.
YIELDING = "trap 'exit 0' TERM; if [ $GPUQ_ATTEMPT = 1 ]; then while true; do sleep 0.1; done; fi"


def _overlap(records: list[dict]) -> int:
    """The most of these jobs that ran at once, from their records."""
    edges = sorted([(r["claimed_at"], 1) for r in records] + [(r["ended_at"], -1) for r in records])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_a_user_cap_holds_across_boxes(queue):
    queue.write_config(max_gpus_per_user=2)
    queue.start_worker("a", "2x16GiB")
    queue.start_worker("b", "2x16GiB")
    for i in range(6):
        queue.drop(f"cap{i}.yaml", "command: sleep 1\ngpus: 1\n")
    records = [wait_until(lambda i=i: queue.finished(f"cap{i}"), timeout=60, what=f"cap{i}") for i in range(6)]
    assert all(r["state"] == "done" for r in records)
    assert _overlap(records) == 2  # not four: two per box was what each box alone allowed


def test_small_jobs_on_an_idle_cluster_land_on_as_many_gpus(queue):
    queue.start_worker("a", "4x16GiB")
    queue.start_worker("b", "4x16GiB")
    for i in range(4):
        queue.drop(f"small{i}.yaml", "command: sleep 1\ngpus: 1\ngpu_mem: 4GiB\n")
    records = [wait_until(lambda i=i: queue.finished(f"small{i}"), timeout=60, what=f"small{i}") for i in range(4)]
    assert len({(r["host"], r["gpus"][0]) for r in records}) == 4


def test_boxes_started_together_do_not_stack_jobs_before_they_see_each_other(queue):
    """Cron starts every box in the same minute. The specs wait in jobs/; a's first pass
    sees only its own four GPUs (b's heartbeat is not there yet). Before, it spread three and
    put the fourth beside one of them (a review's idle two-box cluster); now it leaves the
    fourth, and b, up a moment later, takes it onto an empty GPU."""
    for i in range(4):
        queue.drop(f"small{i}.yaml", "command: sleep 4\ngpus: 1\ngpu_mem: 4GiB\n")
    queue.start_worker("a", "4x16GiB")
    queue.start_worker("b", "4x16GiB")
    records = [wait_until(lambda i=i: queue.finished(f"small{i}"), timeout=60, what=f"small{i}") for i in range(4)]
    assert len({(r["host"], r["gpus"][0]) for r in records}) == 4, [(r["host"], r["gpus"]) for r in records]


def test_jobs_that_declare_compute_shares_that_fit_share_one_gpu_of_an_idle_cluster(queue):
    """Two jobs of 40% of a GPU's compute each (`gpu_compute`) slow nobody on one GPU: they
    share it, and the other GPUs stay whole; a job that declares no share still takes its own."""
    queue.start_worker("a", "4x16GiB")
    until_go = f"command: while [ ! -e {queue.root}/go ]; do sleep 0.1; done\ngpus: 1\ngpu_mem: 4GiB\n"
    queue.drop("own.yaml", until_go)
    own = wait_until(lambda: queue.record("own"), timeout=30, what="the undeclared job to start")
    for i in range(2):
        queue.drop(f"part{i}.yaml", until_go + "gpu_compute: 40%\n")
    parts = [wait_until(lambda i=i: queue.record(f"part{i}"), timeout=30, what=f"part{i} to start") for i in range(2)]
    (queue.root / "go").touch()
    assert len({(r["host"], r["gpus"][0]) for r in parts}) == 1, parts
    assert parts[0]["gpus"] != own["gpus"]
    assert all(
        wait_until(lambda n=n: queue.finished(n), timeout=30, what=n)["state"] == "done"
        for n in ("own", "part0", "part1")
    )


def test_one_pending_job_preempts_one_opportunistic_job_team_wide(queue):
    queue.write_config(idle_after_s=0.2)
    queue.start_worker("a", "1x80GiB")
    queue.start_worker("b", "1x80GiB")
    for name in ("lo-1", "lo-2"):
        queue.drop(f"{name}.yaml", f"command: {SLOW_TO_YIELD!r}\ngpus: 1\ngpu_mem: 50GiB\npriority: low\ngrace: 2s\n")
    wait_until(
        lambda: {r["host"] for r in queue.status()["running"]} == {"a", "b"}, timeout=30, what="a low job on each box"
    )
    queue.drop("real.yaml", "command: echo real\ngpus: 1\n")
    assert wait_until(lambda: queue.finished("real"), timeout=30, what="the real job")["state"] == "done"
    again = wait_until(
        lambda: [r for n in ("lo-1", "lo-2") if (r := queue.finished(n))],
        timeout=30,
        what="the preempted low job to run again and finish",
    )
    assert [r["attempt"] for r in again] == [2]
    preempting = [e for e in queue.events() if e.get("note") == "preempting" and e["reason"].startswith("job real")]
    assert len(preempting) == 1, preempting  # each box used to preempt its own for the same job


def test_ordinary_jobs_take_free_gpus_before_they_preempt_low_ones(queue):
    """A first day's review (D1): with three low jobs running and three GPUs free, ordinary
    1-GPU jobs preempted low jobs (which restarted seconds later on the free GPUs). Low jobs
    now take the box ordinary work goes to last: the ordinary jobs find free GPUs."""
    queue.write_config(idle_after_s=0.2)
    queue.start_worker("a", "2x16GiB")
    queue.start_worker("b", "4x16GiB")
    for box in ("a", "b"):  # once a low job has run on each box, every box sees both idle
        queue.drop(f"probe-{box}.yaml", f"command: 'true'\ngpus: 1\npriority: low\nhosts: [{box}]\n")
        wait_until(lambda box=box: queue.finished(f"probe-{box}"), timeout=60, what=f"a low job on {box}")
    until_go = f"while [ ! -e {queue.root}/go ]; do sleep 0.1; done"
    try:
        for i in range(3):
            queue.drop(f"lo{i}.yaml", f"command: {until_go}\ngpus: 1\npriority: low\n")
        lows = wait_until(lambda: (r := queue.status()["running"]) and len(r) == 3 and r, timeout=60, what="lows")
        assert {r["host"] for r in lows} == {"b"}, lows  # the box with the most GPUs free of ordinary work
        for i in range(3):
            queue.drop(f"n{i}.yaml", f"command: {until_go}\ngpus: 1\n")
        running = wait_until(
            lambda: (r := queue.status()["running"]) and len(r) == 6 and r, timeout=60, what="all six running"
        )
        assert len({(r["host"], tuple(r["gpus"])) for r in running}) == 6, running
    finally:
        (queue.root / "go").touch()
    ends = [
        wait_until(lambda n=n: queue.finished(n), timeout=60, what=n) for n in ("n0", "n1", "n2", "lo0", "lo1", "lo2")
    ]
    preempting = [e for e in queue.events() if e.get("note") == "preempting"]
    assert not preempting, (preempting, [(r["host"], r["gpus"]) for r in lows])
    assert [r["attempt"] for r in ends] == [1] * 6


@needs_root
def test_fair_share_between_two_users_holds_across_boxes(team):
    team.write_config(poll_interval=0.2)
    spec = "command: sleep 120\ngpus: 1\nworkdir: /\n"  # they run on while the test looks (a loaded machine is slow)
    for i in range(3):
        team.drop_as(ALICE, f"al{i}.yaml", spec)
    team.drop_as(BOB, "bo0.yaml", spec)
    team.start_worker("a", "1x16GiB")
    team.start_worker("b", "1x16GiB")
    first = wait_until(lambda: [r for r in team.status()["running"]], timeout=30, what="a first job")
    both = wait_until(lambda: len(rs := team.status()["running"]) == 2 and rs, timeout=30, what="both boxes busy")
    assert {r["user"] for r in both} == {ALICE, BOB}, (first, both)  # not alice's two oldest


def test_a_dead_box_whose_clock_runs_ahead_is_left_out_of_the_plan(queue):
    """Liveness is judged by when a heartbeat last changed, on the planner's own clock: a
    dead box stamping its beats ten minutes ahead must not keep work placed on it."""
    queue.write_config(lost_after_s=300)
    queue.start_worker("a", "2x80GiB")
    queue.start_worker("b", "1x24GiB", env={"GPUQ_TEST_CLOCK_SHIFT_S": "600"})  # the tighter fit: preferred
    queue.stop_worker("b", signal.SIGKILL)
    for i in range(3):
        queue.drop(f"after{i}.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 20GiB\n")
    for i in range(3):
        record = wait_until(lambda i=i: queue.finished(f"after{i}"), timeout=60, what=f"after{i} to run on a")
        assert record["host"] == "a"


def test_a_box_that_places_work_on_another_wakes_it(queue):
    """b sleeps for its 60 s poll; a's pass, woken by its own job's end, places the new job
    on b (the tighter fit) and pokes it: b starts it at once, not at its next poll."""
    queue.write_config(poll_interval=60)
    queue.drop("first.yaml", "command: sleep 3\ngpus: 1\ngpu_mem: 50GiB\n")  # fits a only
    queue.start_worker("a", "1x80GiB")
    queue.start_worker("b", "1x24GiB")
    wait_until(lambda: (queue.root / "state" / "running" / "first.json").exists(), what="first to run on a")
    queue.drop("second.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 20GiB\n")  # fits b best
    first = wait_until(lambda: queue.finished("first"), timeout=30, what="first to end")
    second = wait_until(lambda: queue.finished("second"), timeout=50, what="second, started by b")
    assert second["host"] == "b" and second["claimed_at"] - first["ended_at"] < 30


def test_a_garbage_heartbeat_is_skipped_by_every_worker_and_by_status(queue):
    workers = queue.root / "state" / "workers"
    workers.mkdir(parents=True)
    (workers / "ghost.json").write_text('{"host": "ghost", "observed": [1]}')
    (workers / "ghost2.json").write_text(
        json.dumps(
            {
                "host": "ghost2",
                "t": time.time() + 3600,
                "stopping": 5,
                "gpus": [{"index": 0, "uuid": "u", "name": "n", "mem_total_mib": "16384", "mem_used_mib": 0}],
            }
        )
    )
    queue.start_worker("a", "1x16GiB")
    queue.drop("g1.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 2GiB\n")
    assert wait_until(lambda: queue.finished("g1"), timeout=30, what="g1 despite the garbage")["state"] == "done"
    assert [h["host"] for h in queue.status()["hosts"]] == ["a"]
    log = (queue.root / "logs" / "workers" / "a.log").read_text()
    assert "state/workers/ghost2.json left out of the plan: 'gpus' is not a list of GPU snapshots" in log


def test_a_box_whose_worker_stopped_takes_no_new_work_at_once(queue):
    queue.start_worker("a", "1x24GiB")  # the tighter fit for the job below
    queue.start_worker("b", "1x80GiB")
    queue.stop_worker("a")  # a clean stop says so in its heartbeat
    assert [h["alive"] for h in queue.status()["hosts"] if h["host"] == "a"] == [False]
    dropped = time.time()
    queue.drop("next.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 20GiB\n")
    record = wait_until(lambda: queue.finished("next"), timeout=30, what="next to run on b")
    # A stopped box that still looked live would hold the job for its 10 s live window.
    assert record["host"] == "b" and record["claimed_at"] - dropped < 9


def _small(n: int) -> str:
    """Small one-GPU jobs, one every 0.5 s, faster than four GPUs run them (3-3.8 s each).
    Their lengths differ so that two started together seldom end together: a box wholly free
    at one pass would let the wide job in without any reservation."""
    return f"command: sleep {3 + (n % 3) * 0.4:.1f}\ngpus: 1\ngpu_mem: 50GiB\ntime_limit: 20s\n"


@pytest.mark.parametrize("reservations", [True, False])
def test_a_wide_job_is_not_starved_across_boxes_by_small_jobs_and_low_ones(queue, reservations):
    """Two boxes of two GPUs; low jobs soak up idle GPUs, small jobs keep arriving faster
    than four GPUs end them (each with a time limit), and a job wants a whole box. With
    reservations (on one box, team-wide, from when the small jobs' limits run out) it runs
    while the stream goes on, the low jobs in its way yield, and each low
    job finishes once the stream stops; without, it starves (the control that shows the
    test can fail)."""
    queue.write_config(reserve_after_s=4, reservations=reservations, idle_after_s=0.2)
    queue.start_worker("a", "2x80GiB")
    queue.start_worker("b", "2x80GiB")
    for name in ("lo-1", "lo-2"):
        queue.drop(f"{name}.yaml", f"command: {YIELDING!r}\ngpus: 1\ngpu_mem: 20GiB\npriority: low\ngrace: 2s\n")
    wait_until(lambda: len(queue.status()["running"]) == 2, timeout=30, what="the low jobs to run")
    wide_done_during_stream = ends_during_stream(
        queue, _small, 0.5, "wide", "command: echo wide\ngpus: 2\n", within_s=25
    )
    assert wide_done_during_stream is reservations
    if reservations:
        assert queue.finished("wide")["state"] == "done"
    for name in ("lo-1", "lo-2"):  # the stream has stopped: the low jobs run again and end
        record = wait_until(lambda name=name: queue.finished(name), timeout=120, what=f"{name} to finish")
        assert record["state"] == "done"
