"""One plan for the team, through boxes run in this process until the queue is idle on a
clock the test moves (tests/harness.py, `Team`): caps, spreading, preemption and
reservations team-wide, with each job's run given by the test instead of a process. What
needs processes (signals, a person's process on a GPU, wake-ups between boxes, users) stays
in tests/test_one_plan.py and tests/test_scheduling_e2e.py."""

from __future__ import annotations

import math
import os
import time
from functools import partial
from pathlib import Path
from typing import Callable

import pytest
from harness import FOREVER, Run, Team, gpuq, status

from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.spool.inbox import send

# Runs until told to yield the first time, then takes its whole grace to go (it ignores TERM:
# long enough for every box to see the job it yields for); run again, it ends at once.
SLOW_TO_YIELD = Run(seconds=math.inf, yield_s=2)
# Runs until told to yield the first time, and goes at once; run again, it ends at once.
YIELDING = FOREVER


def _lows(first: Run, others: Callable[[Record], Run] = lambda record: Run(seconds=0)) -> Callable[[Record], Run]:
    """Low jobs (lo-*) run as `first` until they have yielded once, and end at once when run
    again; every other job runs as `others` says."""
    return lambda record: (
        (first if record.attempt == 1 else Run(seconds=0)) if record.id.startswith("lo-") else others(record)
    )


def _finished(team: Team, job_id: str) -> Record:
    record = team.finished(job_id)
    assert record is not None, f"{job_id} has not finished"
    return record


def _overlap(records: list[Record]) -> int:
    """The most of these jobs that ran at once, from their records."""
    edges = sorted([(r.claimed_at or 0.0, 1) for r in records] + [(r.ended_at or 0.0, -1) for r in records])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _team(root: Path, boxes: dict[str, str], runs: Callable[[Record], Run] | None = None, **config: object) -> Team:
    """Boxes whose workers have made their first pass (each has published its heartbeat), as
    the real-process tests start them before they drop specs."""
    team = Team(root, runs, **config)
    for host, gpus in boxes.items():
        team.add(host, gpus)
    team.step()
    return team


def test_a_user_cap_holds_across_boxes(tmp_path):
    team = _team(tmp_path / "root", {"a": "2x16GiB", "b": "2x16GiB"}, max_gpus_per_user=2)
    for i in range(6):
        team.drop(f"cap{i}.yaml", "command: sleep 1\ngpus: 1\n")
    team.run_until_idle()
    records = [_finished(team, f"cap{i}") for i in range(6)]
    assert all(r.state is State.DONE for r in records), [(r.id, r.state) for r in records]
    assert _overlap(records) == 2  # not four: two per box was what each box alone allowed


def test_small_jobs_on_an_idle_cluster_land_on_as_many_gpus(tmp_path):
    team = _team(tmp_path / "root", {"a": "4x16GiB", "b": "4x16GiB"})
    for i in range(4):
        team.drop(f"small{i}.yaml", "command: sleep 1\ngpus: 1\ngpu_mem: 4GiB\n")
    team.run_until_idle()
    records = [_finished(team, f"small{i}") for i in range(4)]
    assert len({(r.host, r.gpus[0]) for r in records}) == 4, [(r.host, r.gpus) for r in records]


def test_boxes_started_together_do_not_stack_jobs_before_they_see_each_other(tmp_path):
    """Cron starts every box in the same minute. The specs wait in jobs/; a's first pass
    sees only its own four GPUs (b's heartbeat is not there yet). Before, it spread three and
    put the fourth beside one of them (a review's idle two-box cluster); now it leaves the
    fourth, and b, up a moment later, takes it onto an empty GPU."""
    team = Team(tmp_path / "root", lambda record: Run(seconds=4))
    for i in range(4):
        team.drop(f"small{i}.yaml", "command: sleep 4\ngpus: 1\ngpu_mem: 4GiB\n")
    team.add("a", "4x16GiB")
    team.step(0.5)
    team.add("b", "4x16GiB")
    team.run_until_idle(step_s=0.5)
    records = [_finished(team, f"small{i}") for i in range(4)]
    assert len({(r.host, r.gpus[0]) for r in records}) == 4, [(r.host, r.gpus) for r in records]


def test_jobs_that_declare_compute_shares_that_fit_share_one_gpu_of_an_idle_cluster(tmp_path):
    """Two jobs of 40% of a GPU's compute each (`gpu_compute`) slow nobody on one GPU: they
    share it, and the other GPUs stay whole; a job that declares no share still takes its own."""
    team = _team(tmp_path / "root", {"a": "4x16GiB"}, lambda record: FOREVER)
    until_go = "command: sleep 100\ngpus: 1\ngpu_mem: 4GiB\n"
    team.drop("own.yaml", until_go)
    team.run_until(lambda: [r for r in team.running() if r.id == "own"])
    (own,) = team.running()
    for i in range(2):
        team.drop(f"part{i}.yaml", until_go + "gpu_compute: 40%\n")
    team.run_until(lambda: len(team.running()) == 3)
    parts = [r for r in team.running() if r.id.startswith("part")]
    assert len({(r.host, r.gpus[0]) for r in parts}) == 1, [(r.host, r.gpus) for r in parts]
    assert parts[0].gpus != own.gpus
    for name in ("own", "part0", "part1"):  # go
        team.end(name)
    team.run_until_idle()
    assert all(_finished(team, n).state is State.DONE for n in ("own", "part0", "part1"))


@pytest.mark.parametrize("overlap", [False, True])
def test_one_pending_job_preempts_one_opportunistic_job_team_wide(tmp_path, overlap):
    """Every box plans for the same pending job: only the box its plan places it on makes a
    job yield, whether the boxes' passes follow each other or overlap (both read jobs/, then
    plan in turn under the queue lock)."""
    team = _team(tmp_path / "root", {"a": "1x80GiB", "b": "1x80GiB"}, _lows(SLOW_TO_YIELD), idle_after_s=0.2)
    team.overlap = overlap
    for name in ("lo-1", "lo-2"):
        team.drop(f"{name}.yaml", "command: loop\ngpus: 1\ngpu_mem: 50GiB\npriority: low\ngrace: 2s\n")
    team.run_until(lambda: {r.host for r in team.running()} == {"a", "b"}, step_s=0.5)
    team.drop("real.yaml", "command: echo real\ngpus: 1\n")
    team.run_until(lambda: team.finished("real"), step_s=0.5)
    assert _finished(team, "real").state is State.DONE
    team.run_until(lambda: [r for n in ("lo-1", "lo-2") if (r := team.finished(n))], step_s=0.5)
    for _ in range(10):  # and no second job yields for it later
        team.step(0.5)
    again = [r for n in ("lo-1", "lo-2") if (r := team.finished(n))]
    assert [r.attempt for r in again] == [2]
    preempting = [e for e in team.events() if e.get("note") == "preempting" and e["reason"].startswith("job real")]
    assert len(preempting) == 1, preempting  # each box used to preempt its own for the same job


def test_ordinary_jobs_take_free_gpus_before_they_preempt_low_ones(tmp_path):
    """A first day's review (D1): with three low jobs running and three GPUs free, ordinary
    1-GPU jobs preempted low jobs (which restarted seconds later on the free GPUs). Low jobs
    now take the box ordinary work goes to last: the ordinary jobs find free GPUs."""

    def until_go(record: Record) -> Run:  # the probes end at once; the rest run until the test says go
        return Run(seconds=0) if record.id.startswith("probe") else FOREVER

    team = _team(tmp_path / "root", {"a": "2x16GiB", "b": "4x16GiB"}, until_go, idle_after_s=0.2)
    for box in ("a", "b"):  # once a low job has run on each box, every box sees both idle
        team.drop(f"probe-{box}.yaml", f"command: 'true'\ngpus: 1\npriority: low\nhosts: [{box}]\n")
        team.run_until(partial(team.finished, f"probe-{box}"), step_s=0.5)
    for i in range(3):
        team.drop(f"lo{i}.yaml", "command: loop\ngpus: 1\npriority: low\n")
    team.run_until(lambda: len(team.running()) == 3, step_s=0.5)
    lows = team.running()
    # The box with the most GPUs free of ordinary work.
    assert {r.host for r in lows} == {"b"}, [(r.host, r.gpus) for r in lows]
    for i in range(3):
        team.drop(f"n{i}.yaml", "command: loop\ngpus: 1\n")
    team.run_until(lambda: len(team.running()) == 6, step_s=0.5)
    running = team.running()
    assert len({(r.host, tuple(r.gpus)) for r in running}) == 6, [(r.id, r.host, r.gpus) for r in running]
    for name in ("n0", "n1", "n2", "lo0", "lo1", "lo2"):  # go
        team.end(name)
    team.run_until_idle(step_s=0.5)
    ends = [_finished(team, n) for n in ("n0", "n1", "n2", "lo0", "lo1", "lo2")]
    preempting = [e for e in team.events() if e.get("note") == "preempting"]
    assert not preempting, (preempting, [(r.host, r.gpus) for r in lows])
    assert [r.attempt for r in ends] == [1] * 6


def test_a_dead_box_whose_clock_runs_ahead_is_left_out_of_the_plan(tmp_path):
    """Liveness is judged by when a heartbeat last changed, on the planner's own clock: a
    dead box stamping its beats ten minutes ahead must not keep work placed on it."""
    team = Team(tmp_path / "root", lost_after_s=300)
    team.add("a", "2x80GiB")
    team.add("b", "1x24GiB", clock_shift_s=600)  # the tighter fit: preferred
    team.step()
    team.kill("b")
    for i in range(3):
        team.drop(f"after{i}.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 20GiB\n")
    # A minute: far less than the ten its heartbeat's own time would keep it live.
    team.run_until(lambda: all(team.finished(f"after{i}") for i in range(3)), max_passes=60)
    assert {_finished(team, f"after{i}").host for i in range(3)} == {"a"}


def _ends_during_stream(
    team: Team, small_spec: Callable[[int], str], every_s: float, name: str, spec: str, within_s: float
) -> bool:
    """Whether job `name`, dropped once a stream of small jobs flows (small-000, small-001, ...:
    `small_spec(n)` is the n-th one's spec, one every `every_s` of the team's clock), finishes
    within `within_s` while the stream goes on. The stream has stopped when this returns."""
    step_s = 0.1  # passes well apart from each other within an arrival's interval
    dropped = 0
    start = team.clock.mono()

    def flow_until(done: Callable[[], object], seconds: float) -> bool:
        nonlocal dropped
        for _ in range(round(seconds / step_s)):
            while start + dropped * every_s <= team.clock.mono():
                team.drop(f"small-{dropped:03d}.yaml", small_spec(dropped))
                dropped += 1
            team.step(step_s)
            if done():
                return True
        return False

    assert flow_until(lambda: team.finished("small-001"), 30), "the stream does not flow"
    team.drop(f"{name}.yaml", spec)
    return flow_until(lambda: team.finished(name), within_s)


def _small_s(n: int) -> float:
    """How long the n-th small job runs: 3-3.8 s. Their lengths differ so that two started
    together seldom end together: a box wholly free at one pass would let the wide job in
    without any reservation."""
    return 3 + (n % 3) * 0.4


def _small(n: int) -> str:
    return f"command: sleep {_small_s(n):.1f}\ngpus: 1\ngpu_mem: 50GiB\ntime_limit: 20s\n"


def _small_run(record: Record) -> Run:
    """Small jobs run as long as their spec says (`_small`); any other job ends at once."""
    return Run(seconds=_small_s(int(record.id[len("small-") :]))) if record.id.startswith("small-") else Run(0)


@pytest.mark.parametrize("reservations", [True, False])
def test_a_wide_job_is_not_starved_across_boxes_by_small_jobs_and_low_ones(tmp_path, reservations):
    """Two boxes of two GPUs; low jobs soak up idle GPUs, small jobs keep arriving faster
    than four GPUs end them (each with a time limit), and a job wants a whole box. With
    reservations (on one box, team-wide, from when the small jobs' limits run out) it runs
    while the stream goes on, the low jobs in its way yield, and each low job finishes once
    the stream stops; without, it starves (the control that shows the test can fail)."""
    team = _team(
        tmp_path / "root",
        {"a": "2x80GiB", "b": "2x80GiB"},
        _lows(YIELDING, _small_run),
        reserve_after_s=4,
        reservations=reservations,
        idle_after_s=0.2,
    )
    for name in ("lo-1", "lo-2"):
        team.drop(f"{name}.yaml", "command: loop\ngpus: 1\ngpu_mem: 20GiB\npriority: low\ngrace: 2s\n")
    team.run_until(lambda: len(team.running()) == 2, step_s=0.2)
    wide = "command: echo wide\ngpus: 2\n"
    assert _ends_during_stream(team, _small, 0.5, "wide", wide, within_s=25) is reservations
    if reservations:
        assert _finished(team, "wide").state is State.DONE
    # The stream has stopped: the low jobs run again and end.
    team.run_until(lambda: team.finished("lo-1") and team.finished("lo-2"), max_passes=600, step_s=0.2)
    assert [_finished(team, n).state for n in ("lo-1", "lo-2")] == [State.DONE] * 2


def test_a_wide_job_is_not_starved_behind_a_head_nothing_tells_the_start_of(tmp_path):
    """Box a runs two jobs without a time limit, and the head of the queue may run on a only:
    nothing tells when it could start. The reservation goes to the wide job behind it, on b,
    where a stream of small jobs (each with a limit) flows: it runs while the stream goes on.
    (A member's review found it starved: once the head had no reservation, nobody had one.)"""

    def runs(record: Record) -> Run:
        return Run(seconds=10_000) if record.id.startswith("forever") else _small_run(record)

    team = _team(tmp_path / "root", {"a": "2x80GiB", "b": "2x80GiB"}, runs, reserve_after_s=4)
    for name in ("forever-1", "forever-2"):
        team.drop(f"{name}.yaml", "command: loop\ngpus: 1\nhosts: [a]\n")
    team.run_until(lambda: len(team.running()) == 2, step_s=0.2)
    team.drop("pinned.yaml", "command: echo pinned\ngpus: 2\nhosts: [a]\ntime_limit: 1m\n")
    wide = "command: echo wide\ngpus: 2\n"
    assert _ends_during_stream(team, _small, 0.5, "wide", wide, within_s=25)
    assert _finished(team, "wide").state is State.DONE and not team.finished("pinned")


def test_a_job_being_stopped_at_its_limit_keeps_the_heads_reservation_until_its_grace_runs_out(tmp_path):
    """Box a's job passed its 10 s time limit and takes 30 s of its 60 s grace to stop (its
    supervisor's TERM at the limit, which this model does not send: the job just runs 40 s).
    The pair job behind it is reserved both GPUs from when that stop ends at the latest, and
    the long job that arrives during the stop may not take the free GPU (while the stop
    lasted, nothing told when the GPU would free: the pair lost its reservation, and waited
    behind the long job)."""

    def runs(record: Record) -> Run:
        return Run(seconds=40) if record.id == "over" else Run(seconds=100)

    team = _team(tmp_path / "root", {"a": "2x80GiB"}, runs)
    team.drop("over.yaml", "command: loop\ngpus: 1\ntime_limit: 10s\ngrace: 60s\n")
    team.run_until(lambda: team.running(), step_s=1)
    started = team.clock.wall()
    team.drop("pair.yaml", "command: echo pair\ngpus: 2\ntime_limit: 1h\n")
    team.run_until(lambda: team.clock.wall() > started + 15)  # past the limit, in the stop
    team.drop("long.yaml", "command: echo long\ngpus: 1\ntime_limit: 2h\n")
    team.run_until(lambda: {r.id for r in team.running()} & {"pair", "long"}, max_passes=60)
    assert [r.id for r in team.running()] == ["pair"], [(r.id, r.gpus) for r in team.running()]


def test_a_cancelled_job_still_stopping_keeps_the_heads_reservation(tmp_path):
    """Box a's job has no time limit and is cancelled; it takes 30 s of its 60 s grace to stop.
    The pair job behind it is reserved both GPUs from when that stop ends at the latest, and
    the long job that arrives during the stop may not take the free GPU (the worker did not
    count a cancelled job as stopping: nothing told when its GPU would free, and the pair
    waited behind the long job). `status` says the job is stopping, not yielding."""

    def runs(record: Record) -> Run:
        return Run(seconds=math.inf, yield_s=30) if record.id == "busy" else Run(seconds=100)

    team = _team(tmp_path / "root", {"a": "2x80GiB"}, runs)
    team.drop("busy.yaml", "command: loop\ngpus: 1\ngrace: 60s\n")
    team.run_until(lambda: team.running(), step_s=1)
    team.drop("pair.yaml", "command: echo pair\ngpus: 2\ntime_limit: 1h\n")
    team.step()
    send(team.boxes["a"].layout, "cancel", ("busy",), sent_from="a")
    team.run_until(lambda: team.boxes["a"].stops, max_passes=5)
    view = status(team.root)
    running = {r["id"]: r for r in view["running"]}
    assert running["busy"]["stopping"] and not running["busy"]["yielding"], running["busy"]
    assert "busy (stopping)" in gpuq(team.root, "status").stdout
    # The pair's expected start: when busy's grace from now runs out at the latest (it was:
    # none, as busy has no time limit).
    pair = next(p for p in view["pending"] if p["id"] == "pair")
    assert pair["expected_start"] is not None and pair["expected_start"] <= team.clock.wall() + 60 + 1, pair
    team.drop("long.yaml", "command: echo long\ngpus: 1\ntime_limit: 2h\n")
    team.run_until(lambda: {r.id for r in team.running()} & {"pair", "long"}, max_passes=60)
    assert [r.id for r in team.running()] == ["pair"], [(r.id, r.gpus) for r in team.running()]
    assert _finished(team, "busy").state is State.CANCELLED


@pytest.mark.parametrize("reservations", [True, False])
def test_a_big_job_is_not_starved_by_a_stream_of_small_ones(tmp_path, reservations):
    """Two GPUs; small jobs (one GPU each, with a time limit) keep arriving faster than they
    end; the big job needs both GPUs. With reservations it gets both from when the small
    jobs' limits run out, and no small job whose own limit runs past that takes them: it
    starts while the stream goes on; without, it starves (the control that shows this test
    can fail)."""
    team = _team(
        tmp_path / "root", {"a": "2x80GiB"}, lambda record: Run(seconds=2), reserve_after_s=4, reservations=reservations
    )
    small = "command: sleep 2\ngpus: 1\ngpu_mem: 50GiB\ntime_limit: 10s\n"
    big = "command: echo big\ngpus: 2\n"
    assert _ends_during_stream(team, lambda n: small, 0.7, "big", big, within_s=20) is reservations
    if reservations:
        assert _finished(team, "big").state is State.DONE


def test_an_arrays_limit_holds_on_another_box_while_its_members_are_being_written(tmp_path, monkeypatch):
    """A worker writes an array's members into jobs/, then its record (which says they are its
    members). Another box whose pass fell in between started three members of a %2 array at
    once (a member's two-box day). Now members whose array has no record yet, while a worker
    is writing it, wait. Here box a dies between the two (its record write fails); b starts
    none until a's restart finishes the array, and never more than two at once after."""
    from gpuq.spool import sweeps

    team = _team(tmp_path / "root", {"a": "2x16GiB", "b": "4x16GiB"}, lambda record: Run(seconds=3))
    team.drop("arr.yaml", "command: sleep 3\ngpus: 1\narray: 0-4%2\n")
    real_write = sweeps.write_json
    cut = {"record": True}

    def write_json(path, data, *args, **kwargs):
        if cut["record"] and path == sweeps.group_file(team.boxes["a"].layout, "arr"):
            raise OSError(28, "No space left on device")  # a's pass ends between members and record
        return real_write(path, data, *args, **kwargs)

    monkeypatch.setattr(sweeps, "write_json", write_json)
    with pytest.raises(OSError):
        team.step()
    assert (team.root / "jobs" / "arr_4.yaml").exists() and not sweeps.group_file(
        team.boxes["a"].layout, "arr"
    ).exists()
    team.step()
    assert team.running() == [], [r.id for r in team.running()]  # b waits for the record
    why = status(team.root)["pending"]
    assert all("arr is being written" in p["reason"] for p in why if p["id"].startswith("arr_")), why
    cut["record"] = False
    team.boxes["a"].restart()  # its next start finishes what it began (sweeps.finish_interrupted)
    team.run_until_idle()
    records = [_finished(team, f"arr_{i}") for i in range(5)]
    assert all(r.state is State.DONE for r in records) and _overlap(records) == 2


def test_a_job_cancelled_on_a_dead_box_is_not_run_again_when_another_box_takes_its_jobs_over(tmp_path):
    """A member cancelled a job whose box's worker was down: the cancel was written for that
    box's worker, which never came back. When another box took the dead box's jobs over, the
    job was requeued and run again as attempt 2. It ends cancelled."""
    team = Team(tmp_path / "root", lambda record: FOREVER, lost_after_s=60)
    team.add("a", "1x24GiB")
    team.add("b", "1x24GiB")
    team.step()
    team.drop("long.yaml", "command: sleep 1000\ngpus: 1\nhosts: [b]\n")
    team.run_until(lambda: [r for r in team.running() if r.id == "long"])
    team.kill("b")
    beat, long_ago = team.root / "state" / "workers" / "b.json", time.time() - 600  # as the CLI's clock sees it
    os.utime(beat, (long_ago, long_ago))
    done = gpuq(team.root, "cancel", "long")
    # It ran on, unstopped, while the cancel said only "cancelling": now it says whose worker is down,
    assert "long: cancelling (running on b, whose worker is not running)" in done.stdout, done.stdout
    # and status shows the job stopping, on a silent host (it said plain running).
    shown = [(r["stopping"], r["host_silent"]) for r in status(team.root)["running"] if r["id"] == "long"]
    assert shown == [(True, True)] and "long (stopping) (host silent)" in gpuq(team.root, "status").stdout
    team.run_until(lambda: team.finished("long"), max_passes=120)
    record = _finished(team, "long")
    assert record.state is State.CANCELLED and record.attempt == 1, (record.state, record.attempt, record.reason)
    assert "cancelled by" in (record.reason or "")
