"""One plan for the team, through real workers on two stand-in boxes: what only processes
prove (users' fair share, a box waking another, a bad heartbeat, a worker's clean stop). Caps,
spreading, preemption and reservations team-wide are driven in this process on a clock the
test moves (tests/test_team_passes.py)."""

from __future__ import annotations

import json
import time

import pytest
from team import ALICE, BOB, needs_root

from conftest import wait_until

pytestmark = pytest.mark.slow  # every test here starts processes


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


def test_a_box_that_places_work_on_another_wakes_it(queue):
    """b sleeps for its 60 s poll; a's pass, woken by its own job's end, places the new job
    on b (the tighter fit) and pokes it: b starts it at once, not at its next poll."""
    queue.write_config(poll_interval=60)
    # first runs until the test lets it end: a fixed `sleep 3` had ended before a loaded
    # machine had started b, and the test then waited for it to run.
    gate = queue.root.parent / "first-may-end"
    run_until_gate = f"while [ ! -e {gate} ]; do sleep 0.1; done"
    queue.drop("first.yaml", f"command: {run_until_gate!r}\ngpus: 1\ngpu_mem: 50GiB\n")  # fits a only
    try:
        queue.start_worker("a", "1x80GiB")
        queue.start_worker("b", "1x24GiB")
        wait_until(lambda: (queue.root / "state" / "running" / "first.json").exists(), timeout=60, what="first on a")
        queue.drop("second.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 20GiB\n")  # fits b best
    finally:
        gate.touch()  # first ends, whatever failed above
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
