"""The planner's scheduling rules, fed plain data: fair share and ageing, the per-user cap,
reservations, opportunistic jobs (idle GPUs, windows) and preemption."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from unittest import mock

import pytest
from test_plan import GIB, gpu, host

from gpuq.model.config import Config
from gpuq.model.jobs import HostView, PendingJob, RunningJob, SetAside
from gpuq.model.spec import JobSpec
from gpuq.model.usage import UsageLedger
from gpuq.model.windows import moment, parse_window
from gpuq.sched.fairshare import shares
from gpuq.sched.plan import RESERVE_DEPTH, _Pass, plan

CFG = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=4, cpu_slots=1, idle_after_s=60, reservations=True)
G = CFG.grace_s  # a job with a limit has left its GPUs by then, or a grace later (SIGTERM, then SIGKILL)


def job(
    job_id: str,
    user: str = "u",
    gpus: int = 1,
    mem_gib: float | None = 10,
    priority: str = "normal",
    queued_at: float = 0.0,
    preemptible: bool | None = None,
    limit_s: float | None = None,
) -> PendingJob:
    spec = JobSpec(
        command="x",
        gpus=gpus,
        gpu_mem_mib=None if mem_gib is None else int(mem_gib * GIB),
        priority_class=priority,
        preemptible=priority == "low" if preemptible is None else preemptible,
        time_limit_s=limit_s,
    )
    return PendingJob(job_id, user, spec, queued_at)


def run(
    job_id: str,
    host_name: str = "h",
    gpus: tuple[int, ...] = (0,),
    mem_gib: float | None = 10,
    user: str = "u",
    low: bool = False,
    started_at: float = 0.0,
    stopping: bool = False,
    limit_s: float | None = None,
) -> RunningJob:
    return RunningJob(
        job_id,
        user,
        host_name,
        gpus,
        None if mem_gib is None else int(mem_gib * GIB),
        preemptible=low,
        priority_class="low" if low else "normal",
        started_at=started_at,
        stopping=stopping,
        limit_s=limit_s,
    )


def starts(result) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {s.job_id: (s.host, s.gpus) for s in result.starts}


def test_fair_share_puts_the_user_holding_fewer_gpus_first():
    busy = [run("ana-1", mem_gib=10, user="ana"), run("ana-2", mem_gib=10, user="ana")]
    pending = [job("ana-3", user="ana", queued_at=0), job("bo-1", user="bo", queued_at=10)]
    result = plan(pending, [host("h", gpu(0))], busy, CFG, now=20)
    assert result.order == ["bo-1", "ana-3"]
    assert plan(pending, [host("h", gpu(0))], busy, replace(CFG, fair_share=False), now=20).order == ["ana-3", "bo-1"]


def test_fair_share_puts_the_user_who_used_less_first_whatever_they_hold_now():
    """bo holds a GPU now, ana none; but ana ran 100 GPU-hours this week and bo nothing."""
    busy = [run("bo-1", mem_gib=None, user="bo", started_at=0)]
    pending = [job("ana-2", user="ana", queued_at=0), job("bo-2", user="bo", queued_at=10)]
    usage = {"ana": 100 * 3600.0}
    assert plan(pending, [], busy, CFG, now=20, usage=usage).order == ["bo-2", "ana-2"]
    assert plan(pending, [], busy, CFG, now=20).order == ["ana-2", "bo-2"]  # no history: bo holds more


def test_a_weeks_wait_outweighs_a_small_difference_in_usage_but_not_a_large_one():
    day = 86400.0
    pending = [job("ana-1", user="ana", queued_at=0), job("bo-1", user="bo", queued_at=7 * day)]
    close = {"ana": 1.0e6, "bo": 0.9e6}  # fair-share factors 0.48 and 0.52
    assert plan(pending, [], [], CFG, now=7 * day, usage=close).order == ["ana-1", "bo-1"]
    assert plan(pending, [], [], CFG, now=1 * day, usage=close).order == ["bo-1", "ana-1"]
    far = {"ana": 2.0e6, "bo": 0.5e6}
    assert plan(pending, [], [], CFG, now=7 * day, usage=far).order == ["bo-1", "ana-1"]


def test_usage_halves_every_half_life_and_a_member_who_used_nothing_has_the_full_factor():
    week = 7 * 86400.0
    ledger = UsageLedger(week, users={"cy": 0.0})
    ledger.add("ana", 2, start=0, end=3600)  # two GPU-hours, at once
    assert ledger.as_of(3600)["ana"] == pytest.approx(2 * 3600, rel=5e-3)
    assert ledger.as_of(3600 + week)["ana"] == pytest.approx(3600, rel=5e-3)
    ledger.add("bo", 1, start=week, end=week + 3600)  # one GPU-hour, a week later: as much now
    now = week + 3600
    assert ledger.as_of(now)["bo"] == pytest.approx(ledger.as_of(now)["ana"], rel=2e-3)
    factors = shares(ledger.as_of(now), ["ana", "bo", "cy"])
    assert factors["cy"] == 1.0 and factors["ana"] == pytest.approx(2**-1.5, rel=1e-2)


def test_priority_classes_come_before_fair_share():
    busy = [run("ana-1", mem_gib=None, user="ana")]
    pending = [job("bo-low", user="bo", priority="low"), job("ana-high", user="ana", priority="high")]
    assert plan(pending, [], busy, CFG, now=0).order == ["ana-high", "bo-low"]


def test_user_cap_holds_a_users_jobs_and_says_so():
    cfg = replace(CFG, max_gpus_per_user=2)
    busy = [run("ana-1", gpus=(0,), user="ana"), run("ana-2", gpus=(1,), user="ana")]
    pending = [job("ana-3", user="ana"), job("bo-1", user="bo", queued_at=5)]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, cfg, now=10)
    assert list(starts(result)) == ["bo-1"]
    assert result.reasons["ana-3"] == "at user cap 2/2 GPUs"


def test_user_cap_counts_the_jobs_the_same_plan_starts():
    """ana holds nothing yet and the box has more GPUs than her cap: the jobs this plan starts
    count against it (the test above has her jobs running already), in the worker's plan
    (explain=False) as in status's."""
    cfg = replace(CFG, max_gpus_per_user=2)
    pending = [job(f"ana-{i}", user="ana", queued_at=i) for i in range(4)] + [job("bo-1", user="bo", queued_at=9)]
    four_gpus = [host("h", *(gpu(i) for i in range(4)))]
    for explain in (True, False):
        result = plan(pending, four_gpus, [], cfg, now=10, explain=explain)
        assert sorted(starts(result)) == ["ana-0", "ana-1", "bo-1"], f"explain={explain}"
    assert result.reasons == {}
    explained = plan(pending, four_gpus, [], cfg, now=10)
    assert explained.reasons["ana-2"] == explained.reasons["ana-3"] == "at user cap 2/2 GPUs"


def test_the_head_gets_gpus_reserved_from_when_limits_free_them_and_only_jobs_that_end_by_then_backfill():
    """h:0's job may run until 3600, h:1's until 7200: the pair job is due at 7200 on both. A
    job whose limit ends by then may run meanwhile (EASY backfill); one that runs past it, or
    has no limit (it might run for ever), may not."""
    busy = [
        run("s1", gpus=(0,), mem_gib=40, started_at=0, limit_s=3600),
        run("s2", gpus=(1,), mem_gib=40, started_at=0, limit_s=7200),
    ]
    pending = [
        job("pair", gpus=2, mem_gib=None, queued_at=0),
        job("short", queued_at=1, limit_s=1800),
        job("long", queued_at=2, limit_s=7200),
        job("unlimited", queued_at=3),
    ]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=100)
    assert result.reserved == {"pair": ("h", (0, 1), 7200 + G)} and result.held == {}
    assert list(starts(result)) == ["short"]
    assert result.reasons["pair"].startswith("GPU h:0, h:1 reserved for it from ")
    assert "its time limit and grace (2h00m) run past that" in result.reasons["long"]
    assert "with a time_limit that ends by then it could run now" in result.reasons["unlimited"]


def test_a_backfill_counts_its_own_grace_after_its_limit():
    """A member's use: a 1-minute job with a 3-minute grace that ignored SIGTERM backfilled
    onto the head's reserved GPU and held it for its grace past the head's start. A job
    stopped at its limit may hold its GPUs for its grace: it backfills only if its limit and
    its grace both end before the head is due."""
    hosts = [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1))]
    busy = [
        run("occ-1", "a", (0,), mem_gib=None, user="ana", limit_s=600),
        run("occ-2", "a", (1,), mem_gib=None, user="ana", limit_s=600),
        run("gate", "b", (0,), mem_gib=None, user="ana", limit_s=120),
    ]
    head = job("wide", user="ben", gpus=2, mem_gib=None, limit_s=60, queued_at=1)
    backfill = job("fill", user="cy", mem_gib=None, limit_s=60, queued_at=2)
    backfill = replace(backfill, spec=replace(backfill.spec, hosts=("b",)))
    quick = plan([head, backfill], hosts, busy, CFG, now=10)  # 10 + 60 + the config's 10 s: by 120
    assert quick.reserved["wide"][0] == "b" and "fill" in starts(quick)
    lingering = replace(backfill, spec=replace(backfill.spec, grace_s=180))
    result = plan([head, lingering], hosts, busy, CFG, now=10)  # may hold b:1 until 250
    assert result.reserved["wide"] == ("b", (0, 1), 120 + G) and "fill" not in starts(result)
    assert "its time limit and grace (4m00s) run past that" in result.reasons["fill"]


def test_a_job_behind_the_reserved_head_counts_it_among_the_jobs_ahead():
    """A member's use: a job with priority -3 said "behind 2" with three jobs ahead: the head
    with its reservation (and a job held while low ones yield) were not counted."""
    busy = [run("s1", gpus=(0,), mem_gib=40, limit_s=3600), run("s2", gpus=(1,), mem_gib=40, limit_s=7200)]
    neg = job("neg", queued_at=0, limit_s=60000)
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=1), replace(neg, spec=replace(neg.spec, priority=-3))]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=100)
    assert "pair" in result.reserved and not result.reasons["pair"].endswith("higher-priority job")
    assert result.reasons["neg"].endswith("; behind 1 higher-priority job"), result.reasons["neg"]


def test_a_low_job_with_a_longer_grace_than_the_configs_keeps_off_the_heads_reserved_gpus():
    """A review: a low job may start on a GPU reserved for the head, and is told to yield when
    the head comes; with a grace of an hour it kept the head waiting that long. One whose
    grace is the config's (or less) may still use the reserved GPU meanwhile."""
    busy = [run("occ", gpus=(0,), mem_gib=None, user="ana", started_at=0, limit_s=100)]
    head = job("wide", user="ben", gpus=2, mem_gib=None, limit_s=60, queued_at=1)
    soak = job("soak", user="cy", mem_gib=None, priority="low", queued_at=2)
    lingering = replace(soak, id="linger", spec=replace(soak.spec, grace_s=600))
    result = plan([head, lingering, soak], [host("h", gpu(0), gpu(1))], busy, CFG, now=10)
    assert result.reserved["wide"] == ("h", (0, 1), 100 + G)
    assert list(starts(result)) == ["soak"]
    assert result.reasons["linger"].startswith("opportunistic: GPU h:1 is reserved for job wide, and this job's grace")


def test_a_low_job_on_the_heads_reserved_gpu_is_told_to_yield_its_grace_before_the_head_is_due():
    """A member: a low job with `grace: 1m` already ran on h:1 when the pair job became the
    head, reserved h:0 and h:1 from when occ must have ended. It was told to yield only once
    the head could start, and the head waited out its grace on GPUs otherwise free. It is told
    its grace (and a poll) before occ's limit (most jobs leave at SIGTERM): not sooner (it may
    use the GPU until then), and the plan says when it must be made again for that, though
    nothing else changes."""
    busy = [run("occ", gpus=(0,), mem_gib=None, user="ana", started_at=0, limit_s=100)]
    soak = replace(run("soak", gpus=(1,), mem_gib=None, user="cy", low=True, started_at=0), grace_s=60.0)
    head = job("pair", user="ben", gpus=2, mem_gib=None, limit_s=60, queued_at=1)
    hosts = [host("h", gpu(0), gpu(1))]
    due = 100 + G
    told_by = due - G - 60 - CFG.poll_interval  # most jobs leave at their limits: occ by 100
    early = plan([head], hosts, busy + [soak], CFG, now=10)
    assert early.reserved["pair"] == ("h", (0, 1), due) and early.preempts == {}
    assert early.recheck_at == told_by
    assert plan([head], hosts, busy + [soak], CFG, now=told_by - 1).preempts == {}
    told = plan([head], hosts, busy + [soak], CFG, now=told_by)
    assert list(told.preempts) == ["soak"] and "pair is due on its GPU" in told.preempts["soak"]
    assert told.recheck_at == math.inf
    # A low job would be told to leave the reserved GPU at once: it does not start there.
    fresh = job("fresh", user="cy", mem_gib=None, priority="low", queued_at=2)
    late = plan([head, fresh], hosts, busy, CFG, now=due - 2 * G - CFG.poll_interval)
    assert starts(late) == {}, late.reasons
    assert list(starts(plan([head, fresh], hosts, busy, CFG, now=10))) == ["fresh"]


def test_no_reservation_where_a_job_without_a_limit_holds_the_gpus():
    """Nothing tells when h:1 frees: as under Slurm, the head gets no reservation, and the
    others start where they fit."""
    busy = [run("s1", gpus=(0,), mem_gib=40, limit_s=3600), run("s2", gpus=(1,), mem_gib=40)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("long", queued_at=1, limit_s=7200)]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=100)
    assert result.reserved == {} and list(starts(result)) == ["long"]


@pytest.mark.parametrize("grace_s", [None, 300.0], ids=["config-grace", "own-grace"])
def test_a_job_past_its_limit_frees_its_gpu_when_its_stop_ends_and_the_head_keeps_its_reservation(grace_s):
    """h:0's job passed its limit at 3600: its worker is stopping it (SIGTERM then, SIGKILL a
    grace later), so h:0 frees by 3600 + its grace (the spec's, else the config's). The pair
    job is reserved h:0 and h:1 from then, and a job that would hold h:1 past it must not
    start there meanwhile. The supervisor counts from its own start, a moment after the claim,
    then records the end: for one more grace h:0 is expected at the next pass (the head lost
    its reservation in that moment: a member's review, 5 of 5 runs). A grace later still,
    the job is stuck or its box late: nothing tells, and the GPU left free is anyone's."""
    over = replace(run("over", gpus=(0,), mem_gib=40, started_at=0, limit_s=3600), grace_s=grace_s)
    grace = grace_s if grace_s is not None else CFG.grace_s
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("long", queued_at=1, limit_s=7200)]
    h = [host("h", gpu(0), gpu(1))]
    for now, due in ((3601, 3600 + grace), (3600 + grace + 1, 3600 + grace + 1 + CFG.poll_interval)):
        result = plan(pending, h, [over], CFG, now=now)
        assert result.reserved == {"pair": ("h", (0, 1), due)} and starts(result) == {}, now
    late = plan(pending, h, [over], CFG, now=3600 + 2 * grace + 1)
    assert late.reserved == {} and list(starts(late)) == ["long"]


def test_a_job_told_to_yield_frees_its_gpu_within_its_own_grace():
    """A job being stopped (preempted, here where preemption is off for the plan) is gone
    within its grace: the spec's (300 s) where it has one, else the config's."""
    told = replace(run("told", gpus=(0,), mem_gib=40, stopping=True), grace_s=300.0)
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0)]
    result = plan(pending, [host("h", gpu(0), gpu(1))], [told], CFG, now=100)
    assert result.reserved == {"pair": ("h", (0, 1), 400)}
    result = plan(pending, [host("h", gpu(0), gpu(1))], [replace(told, grace_s=None)], CFG, now=100)
    assert result.reserved == {"pair": ("h", (0, 1), 100 + CFG.grace_s)}


def test_a_job_told_to_stop_frees_its_gpu_a_grace_after_it_was_told_and_then_tells_nothing():
    """A cancelled job without a limit, told to stop at 100 (its box publishes when): the pair
    job is reserved both GPUs from 100 + its grace, the same moment at every pass (it was
    counted from each pass's now, so a stop that never ended held the reservation, and kept
    the long job off the free GPU, for good). Past that, it is expected at each next pass; a
    grace later still it is stuck, and tells nothing."""
    told = replace(run("told", gpus=(0,), mem_gib=None, stopping=True), told_at=100.0)
    grace = CFG.grace_s
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("long", queued_at=1, limit_s=7200)]
    h = [host("h", gpu(0), gpu(1))]
    for now, due in ((101, 100 + grace), (100 + grace + 1, 100 + grace + 1 + CFG.poll_interval)):
        result = plan(pending, h, [told], CFG, now=now)
        assert result.reserved == {"pair": ("h", (0, 1), due)} and starts(result) == {}, now
    stuck = plan(pending, h, [told], CFG, now=100 + 2 * grace + 1)
    assert stuck.reserved == {} and list(starts(stuck)) == ["long"]


def test_a_boxs_stops_apply_to_its_own_records_only_and_say_when_and_why():
    """Box a told j to stop (a cancel), then died; j, retried, runs on b. a's last heartbeat
    must not make j on b look stopping to the other boxes (it did: stops were matched by id
    alone). A heartbeat of an older worker, with ids only, still marks its own jobs."""
    from gpuq.model.record import Record
    from gpuq.model.stops import StopCause, StopOrder
    from gpuq.spool.teamstate import running_elsewhere

    def record(job_id: str, host: str) -> Record:
        return Record.from_json({"id": job_id, "state": "running", "spec": {}, "host": host, "attempt": 2, "uid": 0})

    beat_a = {"host": "a", "stopping": ["j", "k"], "stops": {"j": {"since": 100.0, "cause": "cancelled"}}}
    seen = {r.id + "@" + r.host: r for r in running_elsewhere([beat_a], [record("j", "b"), record("k", "a")], "c")}
    assert not seen["j@b"].stopping
    assert seen["k@a"].stopping and seen["k@a"].told_at is None  # ids only: when is not known
    (j,) = running_elsewhere([beat_a], [record("j", "a")], "c")
    assert j.stopping and j.told_at == 100.0
    assert StopOrder.from_json(beat_a["stops"]["j"]) == StopOrder(100.0, StopCause.CANCEL)


# Box a runs two jobs without a limit, b one that ends by 600; a 2-GPU job may run on a only.
TWO_BOXES = [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1), gpu(2), gpu(3))]
A_UNKNOWN_B_LIMITED = [
    run("a0", "a", gpus=(0,), mem_gib=None),
    run("a1", "a", gpus=(1,), mem_gib=None),
    run("b0", "b", gpus=(0,), mem_gib=None, limit_s=600),
]


def _pinned_to_a(job_id: str) -> PendingJob:
    pinned = job(job_id, gpus=2, mem_gib=None, queued_at=0, limit_s=60)
    return replace(pinned, spec=replace(pinned.spec, hosts=("a",)))


@pytest.mark.parametrize("explain", [True, False], ids=["status", "worker"])
def test_a_head_nothing_tells_the_start_of_leaves_the_reservation_to_the_next_job(explain):
    """pinned may run on a only, whose jobs have no limit: nothing tells when it could start.
    The reservation goes to wide, behind it, on b (its job's limit ends at 600): a short job
    backfills, a long one waits. (Once the head had no reservation, nobody had one, and a stream
    of single-GPU jobs on b kept wide waiting for as long as it lasted.)"""
    pending = [
        _pinned_to_a("pinned"),
        job("wide", gpus=4, mem_gib=None, queued_at=1, limit_s=60),
        job("short", mem_gib=None, queued_at=2, limit_s=300),
        job("long", mem_gib=None, queued_at=3, limit_s=3600),
    ]
    result = plan(pending, TWO_BOXES, A_UNKNOWN_B_LIMITED, CFG, now=100, explain=explain)
    assert result.reserved == {"wide": ("b", (0, 1, 2, 3), 600 + G)}
    assert list(starts(result)) == ["short"]
    if explain:
        assert result.reasons["long"].startswith("GPU reserved for job wide from ")
        assert result.reasons["long"].endswith("its time limit and grace (1h00m) run past that")


def _walked(pending, hosts, busy, config=CFG):
    """The plan of a worker's pass, and the jobs it walked."""
    walked = []
    real = _Pass.ordinary

    def counting(self, job):
        walked.append(job.id)
        return real(self, job)

    with mock.patch.object(_Pass, "ordinary", counting):
        return plan(pending, hosts, busy, config, now=100, explain=False), walked


def test_a_pass_tries_reserve_depth_jobs_for_the_reservation_and_stops():
    """h:0 never frees by a limit, h:1 does: each pair job (each of its own memory, so none
    answers for another) is tried, fails, and after RESERVE_DEPTH the pass stops walking."""
    busy = [run("s0", gpus=(0,), mem_gib=None), run("s1", gpus=(1,), mem_gib=None, limit_s=600)]
    pending = [job(f"j{i}", gpus=2, mem_gib=1 + i / 64, queued_at=i / 10) for i in range(RESERVE_DEPTH + 50)]
    result, walked = _walked(pending, [host("h", gpu(0), gpu(1))], busy)
    assert result.reserved == {} and result.starts == [] and len(walked) == RESERVE_DEPTH


def test_a_full_cluster_whose_jobs_have_no_limit_stops_a_pass_at_its_head():
    """No GPU frees by a known limit: no job can be reserved for, and a worker's pass over a
    full cluster walks no further than the first job that cannot start."""
    busy = [run("s0", gpus=(0,), mem_gib=None), run("s1", gpus=(1,), mem_gib=None)]
    pending = [job(f"j{i}", gpus=2, mem_gib=None, queued_at=i, limit_s=60) for i in range(1000)]
    result, walked = _walked(pending, [host("h", gpu(0), gpu(1))], busy)
    assert result.reserved == {} and result.starts == [] and walked == ["j0"]


@pytest.mark.parametrize("explain", [True, False], ids=["status", "worker"])
def test_a_whole_array_ahead_that_cannot_be_reserved_for_still_leaves_the_reservation_to_wide(explain):
    """A review of the rule above: RESERVE_DEPTH copies of the pinned job ahead of wide each
    counted, and the pass gave up before wide. Copies of a shape tried once are not tried
    again, nor counted."""
    copies = [_pinned_to_a(f"arr_{i}") for i in range(RESERVE_DEPTH + 10)]
    pending = [*copies, job("wide", gpus=4, mem_gib=None, queued_at=1, limit_s=60)]
    result = plan(pending, TWO_BOXES, A_UNKNOWN_B_LIMITED, CFG, now=100, explain=explain)
    assert result.reserved == {"wide": ("b", (0, 1, 2, 3), 600 + G)}


@pytest.mark.parametrize("explain", [True, False], ids=["status", "worker"])
def test_a_job_too_young_for_the_reservation_does_not_hide_an_older_one_of_its_shape(explain):
    """A review: young (first by fair share) has not waited reserve_after_s; its failure to
    start answered for old, of its shape, which was then never tried for the reservation."""
    busy = [run("b0", "b", gpus=(0,), mem_gib=None, limit_s=600)]
    pending = [
        job("young", user="y", gpus=4, mem_gib=None, queued_at=95, limit_s=60),
        job("old", user="o", gpus=4, mem_gib=None, queued_at=0, limit_s=60),
        job("filler", user="f", mem_gib=None, queued_at=1, limit_s=3600),
    ]
    config = replace(CFG, reserve_after_s=60)
    result = plan(
        pending, [host("b", *map(gpu, range(4)))], busy, config, now=100, explain=explain, usage={"o": 1e6, "f": 1e7}
    )
    assert result.reserved == {"old": ("b", (0, 1, 2, 3), 600 + G)} and starts(result) == {}


def test_the_reservation_goes_where_the_limits_free_room_soonest():
    busy = [
        run("a0", "a", gpus=(0,), mem_gib=40, limit_s=5000),
        run("b0", "b", gpus=(0,), mem_gib=40, limit_s=2000),
        run("b1", "b", gpus=(1,), mem_gib=40, limit_s=1000),
    ]
    pending = [job("pair", gpus=2, mem_gib=None)]
    result = plan(pending, [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1))], busy, CFG, now=100)
    assert result.reserved == {"pair": ("b", (0, 1), 2000 + G)}


def test_a_job_started_ahead_of_the_head_in_the_same_pass_counts_by_its_limit():
    """first starts on h:1 in this pass; the head, behind it, is due when first's limit ends."""
    busy = [run("s0", gpus=(0,), mem_gib=None, limit_s=600)]
    pending = [
        job("first", mem_gib=None, queued_at=0, limit_s=3000),
        job("pair", gpus=2, mem_gib=None, queued_at=1),
        job("small", queued_at=2, limit_s=1000),
    ]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=10)
    assert list(starts(result)) == ["first"] and result.reserved["pair"][2] == 3010 + G
    assert "small" not in starts(result)  # no room: both GPUs are taken whole


def test_a_reservation_waits_for_reserve_after_s():
    busy = [run("s1", gpus=(0,), mem_gib=40, limit_s=3600), run("s2", gpus=(1,), mem_gib=40, limit_s=3600)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("long", queued_at=1, limit_s=7200)]
    cfg = replace(CFG, reserve_after_s=600)
    young = plan(pending, [host("h", gpu(0), gpu(1))], busy, cfg, now=100)
    assert young.reserved == {} and list(starts(young)) == ["long"]
    aged = plan(pending, [host("h", gpu(0), gpu(1))], busy, cfg, now=700)
    assert "pair" in aged.reserved and aged.starts == []


def test_a_reserved_gpu_keeps_a_place_among_max_jobs_per_gpu_for_its_job():
    """h:1 has no place left (4 jobs, the most); h:0 has one. Given to a job that runs past
    the reservation, h:0 would be full by the time h:1 has a place again."""
    busy = [run(f"x{g}{k}", gpus=(g,), mem_gib=10, limit_s=3600) for g, n in ((0, 3), (1, 4)) for k in range(n)]
    pending = [job("wide", gpus=2, mem_gib=40, queued_at=0), job("small", mem_gib=10, queued_at=1, limit_s=7200)]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=50)
    assert result.reserved == {"wide": ("h", (0, 1), 3600 + G)}
    assert starts(result) == {} and result.reasons["small"].startswith("GPU reserved for job wide from ")


def test_no_reservation_for_a_whole_gpu_job_where_other_memory_stays():
    """a:0 holds memory no gpuq job accounts for: waiting for jobs never frees it."""
    busy = [run("b0", "b", gpus=(0,), mem_gib=40, limit_s=3600), run("a1", "a", gpus=(1,), mem_gib=40, limit_s=60)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0)]
    hosts = [host("a", gpu(0, used_gib=5), gpu(1)), host("b", gpu(0), gpu(1))]
    assert plan(pending, hosts, busy, CFG, now=50).reserved == {"pair": ("b", (0, 1), 3600 + G)}


def test_a_reserved_gpu_still_takes_opportunistic_work_but_never_beside_ordinary_work():
    busy = [run("s1", gpus=(0,), mem_gib=40, limit_s=3600)]
    pending = [
        job("pair", gpus=2, mem_gib=None),
        job("filler", mem_gib=10, priority="low", queued_at=5),
        job("small", mem_gib=10, queued_at=6, limit_s=7200),
    ]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=CFG.idle_after_s + 50)
    assert {j: (h, sorted(g)) for j, (h, g, _) in result.reserved.items()} == {"pair": ("h", [0, 1])}
    assert starts(result) == {"filler": ("h", (1,))}  # the empty reserved GPU, not beside s1
    assert result.reasons["small"].startswith("GPU reserved for job pair from ")


def test_opportunistic_jobs_start_only_on_gpus_idle_long_enough():
    pending = [job("lo", priority="low")]
    idle_since = {0: 1000.0, 1: None, 2: 1050.0}  # idle 100 s, in use by a person, idle 50 s
    hosts = [HostView("h", (gpu(0), gpu(1), gpu(2)), 1, idle_since)]
    assert starts(plan(pending, hosts, [], CFG, now=1100)) == {"lo": ("h", (0,))}
    hosts = [HostView("h", (gpu(1), gpu(2)), 1, idle_since)]
    result = plan(pending, hosts, [], CFG, now=1100)
    assert result.starts == [] and "waits for an idle GPU (in use by others: h:1)" in result.reasons["lo"]
    normal = plan([job("n")], hosts, [], CFG, now=1100)
    assert list(starts(normal)) == ["n"]  # ordinary work does not wait for idleness
    # Just after a worker started (idle for 10 s) with every GPU full of ordinary jobs: that is
    # the reason, not "idle for under 60s" (newcomer review).
    full = [run("n0", gpus=(0,), mem_gib=10), run("n2", gpus=(2,), mem_gib=10)]
    result = plan(pending, [HostView("h", (gpu(0), gpu(2)), 1, {0: 1090.0, 2: 1090.0})], full, CFG, now=1100)
    assert result.reasons["lo"] == "opportunistic: waits for an idle GPU (every GPU runs ordinary jobs)"
    result = plan(pending, [HostView("h", (gpu(0), gpu(2)), 1, {0: 1090.0, 2: 1090.0})], full[:1], CFG, now=1100)
    assert result.reasons["lo"] == f"opportunistic: waits for an idle GPU (idle for under {CFG.idle_after_s:g}s)"


def test_a_person_coming_back_preempts_opportunistic_jobs_on_that_gpu_only():
    busy = [run("lo0", gpus=(0,), low=True), run("lo1", gpus=(1,), low=True), run("n1", gpus=(1,))]
    hosts = [HostView("h", (gpu(0), gpu(1)), 1, {0: None, 1: 0.0})]
    result = plan([], hosts, busy, CFG, now=1000)
    assert result.preempts == {"lo0": "a non-gpuq process uses GPU h:0"}


def test_windows_gate_opportunistic_starts_and_their_end_preempts():
    now = time.mktime((2026, 11, 30, 12, 0, 0, 0, 0, -1))  # a Monday, noon, local time
    cfg = replace(CFG, idle_windows=(parse_window("22:00-08:00"), parse_window("Sat-Sun")))
    result = plan([job("lo", priority="low")], [host("h", gpu(0))], [run("old", low=True)], cfg, now)
    assert result.starts == [] and result.reasons["lo"] == "outside window 22:00-08:00, Sat-Sun"
    assert result.preempts == {"old": "idle window 22:00-08:00, Sat-Sun closed"}
    night = time.mktime((2026, 11, 30, 23, 0, 0, 0, 0, -1))
    assert list(starts(plan([job("lo", priority="low")], [host("h", gpu(0))], [], cfg, night))) == ["lo"]


def test_ordinary_work_lands_as_if_no_opportunistic_job_ran_and_exactly_those_there_yield():
    busy = [
        run("lo-old", gpus=(0,), mem_gib=30, low=True, started_at=0),
        run("lo-new", gpus=(0,), mem_gib=30, low=True, started_at=50),
        run("lo-big", gpus=(1,), mem_gib=70, low=True, started_at=10),
    ]
    pending = [
        job("n", mem_gib=40, queued_at=60),
        job("later", mem_gib=5, queued_at=70),
        job("lo-wait", mem_gib=15, priority="low", queued_at=1),
    ]
    hosts = [host("h", gpu(0), gpu(1))]
    result = plan(pending, hosts, busy, CFG, now=100)
    # Without the low jobs both GPUs are empty: n takes one, and the low job there yields (of
    # two GPUs alike, the one where fewer must); its GPU is held so that nothing slips in
    # meanwhile. later packs beside n: it would spread onto the other, but spreading is worth
    # no preemption (a member: two low jobs lost their work to a job that could share a GPU).
    assert result.preempts == {"lo-big": "job n needs its GPU memory"}
    assert result.held == {"n": ("h", (1,)), "later": ("h", (1,))}
    assert starts(result) == {"lo-wait": ("h", (0,))}  # beside lo-old and lo-new, in what they leave
    assert result.reasons["later"] == "GPU h:1 held for it: waiting for lo-big to yield"
    # The next pass, while it drains: still held, nothing preempted twice, nothing slips in.
    draining = [replace(b, stopping=b.id == "lo-big") for b in busy]
    again = plan(pending[:2], hosts, draining, CFG, now=101)
    assert again.preempts == {} and again.held == result.held and again.starts == []
    # ... and `status` names whom they wait for (a member's use: it said "draining", no job).
    assert again.reasons["later"] == "GPU h:1 held for it: waiting for lo-big to yield"
    gone = starts(plan(pending, hosts, [], CFG, now=110))
    assert set(gone) == {"n", "later"} and gone["n"] != gone["later"]  # lo-wait: never beside them


def test_two_boxes_alike_low_jobs_take_the_other_box_and_ordinary_work_preempts_none():
    """A member, on two empty boxes of two GPUs: two low jobs packed onto a:0, then two
    ordinary jobs went onto box a (ordinary work takes the first of boxes alike, and so did low
    work), and the second preempted both low jobs while box b sat idle."""
    idle = {0: 0.0, 1: 0.0}
    hosts = [HostView("a", (gpu(0, 24), gpu(1, 24)), 1, idle), HostView("b", (gpu(0, 24), gpu(1, 24)), 1, idle)]
    lows = [job(f"sm{i}", mem_gib=8, priority="low", queued_at=i) for i in range(2)]
    placed = plan(lows, hosts, [], CFG, now=1000)
    assert {h for h, _ in starts(placed).values()} == {"b"}
    running = [run(s.job_id, s.host, s.gpus, mem_gib=8, low=True) for s in placed.starts]
    for i in range(2):
        result = plan([job(f"om{i}", mem_gib=8, queued_at=10 + i)], hosts, running, CFG, now=1000)
        assert result.preempts == {} and result.held == {}, result
        (s,) = result.starts
        running.append(run(s.job_id, s.host, s.gpus, mem_gib=8))
    assert {r.host for r in running if not r.preemptible} == {"a"}


def test_opportunistic_work_lands_where_ordinary_work_goes_last_so_free_gpus_come_first():
    """A first day's review (D1): three low jobs landed on box-a:0, :1 and box-b:0; three
    ordinary 1-GPU jobs then went onto box-a (ordinary work fills the fuller box first, to keep
    the wide box whole) and preempted two low jobs while box-b:1-3 sat free. Low jobs now take
    the emptiest box, where ordinary work goes last: the ordinary jobs find free GPUs, and
    nothing is preempted."""
    idle = {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    hosts = [HostView("a", (gpu(0), gpu(1)), 1, idle), HostView("b", (gpu(0), gpu(1), gpu(2), gpu(3)), 1, idle)]
    lows = [job(f"lo{i}", mem_gib=None, priority="low", queued_at=i) for i in range(3)]
    placed = plan(lows, hosts, [], CFG, now=1000)
    assert sorted(starts(placed).values()) == [("b", (0,)), ("b", (1,)), ("b", (2,))]
    busy = [run(s.job_id, s.host, s.gpus, mem_gib=None, low=True) for s in placed.starts]
    ordinary = [job(f"n{i}", mem_gib=None, queued_at=10 + i) for i in range(3)]
    result = plan(ordinary, hosts, busy, CFG, now=1000)
    assert result.preempts == {} and result.held == {}
    assert sorted(starts(result).values()) == [("a", (0,)), ("a", (1,)), ("b", (3,))]
    # A fourth finds no free GPU: one low job, and only one, yields.
    four = plan(ordinary + [job("n3", mem_gib=None, queued_at=13)], hosts, busy, CFG, now=1000)
    assert len(four.preempts) == 1 and len(four.starts) == 3 and list(four.held) == ["n3"]


def test_a_wide_job_waiting_keeps_its_box_whole_at_the_cost_of_a_preemption():
    """Where taking a free GPU would leave too few empty GPUs for a whole-box job that waits,
    the small job is placed as if opportunistic work were not there (and that work yields):
    the wide job's box stays whole."""
    busy = [run("lo-1", "a", (0,), mem_gib=None, low=True), run("lo-2", "a", (1,), mem_gib=None, low=True)]
    hosts = [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1), gpu(2), gpu(3))]
    pending = [job("small", mem_gib=None, queued_at=0), job("wide", gpus=4, mem_gib=None, queued_at=1)]
    result = plan(pending, hosts, busy, CFG, now=100)
    assert starts(result) == {"wide": ("b", (0, 1, 2, 3))}
    assert result.held == {"small": ("a", (0,))} and list(result.preempts) == ["lo-1"]


def test_when_the_cluster_is_full_ordinary_work_packs_and_the_fewest_opportunistic_jobs_yield():
    busy = [
        run("a", gpus=(0,), mem_gib=20),
        run("b", gpus=(1,), mem_gib=20),
        run("lo-a", gpus=(0,), mem_gib=50, low=True),
        run("lo-b1", gpus=(1,), mem_gib=30, low=True),
        run("lo-b2", gpus=(1,), mem_gib=20, low=True),
    ]
    result = plan([job("n", mem_gib=40)], [host("h", gpu(0), gpu(1))], busy, CFG, now=100)
    assert result.preempts == {"lo-a": "job n needs its GPU memory"} and result.held == {"n": ("h", (0,))}


def test_opportunistic_jobs_never_preempt_each_other_and_preemption_can_be_off():
    busy = [run("lo", gpus=(0,), mem_gib=70, low=True)]
    pending = [job("lo2", mem_gib=40, priority="low"), job("n", mem_gib=40, queued_at=1)]
    hosts = [host("h", gpu(0))]
    assert plan(pending[:1], hosts, busy, CFG, now=100).preempts == {}
    assert plan(pending[1:], hosts, busy, replace(CFG, preemption=False), now=100).preempts == {}
    assert plan(pending[1:], hosts, busy, CFG, now=100).preempts == {"lo": "job n needs its GPU memory"}


# --- GPUs set aside (bookings: the bookings extra hands the plan SetAside values) ---------


def test_a_booked_gpu_takes_only_its_owners_jobs_and_opportunistic_ones():
    b = SetAside("h", (0,), start=100, end=200, owner="ana")
    hosts = [host("h", gpu(0))]
    result = plan([job("bo-1", user="bo")], hosts, [], CFG, now=150, set_aside=[b])
    assert starts(result) == {}
    assert result.reasons["bo-1"].startswith("GPU h:0 booked for ana until ")
    assert starts(plan([job("ana-1", user="ana")], hosts, [], CFG, now=150, set_aside=[b])) == {"ana-1": ("h", (0,))}
    assert starts(plan([job("bo-1", user="bo")], hosts, [], CFG, now=250, set_aside=[b])) == {"bo-1": ("h", (0,))}
    idle = [HostView("h", (gpu(0),), 1, {0: 0.0})]  # idle long enough for opportunistic work
    assert starts(plan([job("bo-low", user="bo", priority="low")], idle, [], CFG, now=150, set_aside=[b])) == {
        "bo-low": ("h", (0,))
    }


def test_a_job_that_would_run_into_someone_elses_booking_does_not_start_on_those_gpus():
    """Newcomer review D5: others' jobs ran through a booking. bo's job may run for 2 h and
    ana's booking of h:0 begins in 1 h: it takes h:1 instead, or waits, and says why; a job
    that ends before the booking, or ana's own, may use h:0."""
    b = SetAside("h", (0,), start=3600, end=7200, owner="ana")
    one = [host("h", gpu(0))]
    long = job("bo-long", user="bo", limit_s=7200)
    result = plan([long], one, [], CFG, now=0, set_aside=[b])
    assert starts(result) == {} and result.reasons["bo-long"].startswith("GPU h:0 booked for ana from ")
    assert result.reasons["bo-long"].endswith("this job may run past that (its time limit and grace)")
    unlimited = plan([job("bo-any", user="bo")], one, [], CFG, now=0, set_aside=[b])
    assert unlimited.reasons["bo-any"].endswith("this job has no time limit")
    assert starts(plan([job("bo-short", user="bo", limit_s=1800)], one, [], CFG, now=0, set_aside=[b])) == {
        "bo-short": ("h", (0,))
    }
    assert starts(plan([job("ana-1", user="ana", limit_s=7200)], one, [], CFG, now=0, set_aside=[b])) == {
        "ana-1": ("h", (0,))
    }
    two = [host("h", gpu(0), gpu(1))]
    assert starts(plan([long], two, [], CFG, now=0, set_aside=[b])) == {"bo-long": ("h", (1,))}


def test_a_job_kept_off_by_a_booking_does_not_keep_off_a_shorter_one_behind_it():
    """A member's use: ben's 2-hour job could not start on b (booked for ana in an hour), and
    his 1-minute job behind it waited too, with the first one's reason, as did a job without a
    limit (said to run past the booking by "its time limit"): jobs alike but for their limits
    were taken to fit or fail alike whenever no reservation was made in the pass."""
    booking = SetAside("b", (0, 1), start=3600, end=7200, owner="ana")
    hosts = [host("a", gpu(0)), host("b", gpu(0), gpu(1))]
    busy = [run("keeper", "a", (0,), mem_gib=None, user="cy", limit_s=600)]
    pending = [
        job("long", user="ben", mem_gib=None, limit_s=7200, queued_at=1),
        job("unlimited", user="ben", mem_gib=None, queued_at=2),
        job("short", user="ben", mem_gib=None, limit_s=60, queued_at=3),
    ]
    pending = [replace(p, spec=replace(p.spec, hosts=("b",))) for p in pending]
    result = plan(pending, hosts, busy, CFG, now=0, set_aside=[booking])
    assert list(starts(result)) == ["short"]
    assert result.reasons["long"].endswith("this job may run past that (its time limit and grace)")
    assert result.reasons["unlimited"].startswith("GPU b:0 booked for ana from ")
    assert result.reasons["unlimited"].endswith("this job has no time limit")


def test_a_job_kept_off_by_a_booking_is_told_what_of_it_runs_into_the_booking():
    """A review: a job whose grace alone runs into the booking was told its time limit did,
    and a job with only a learned run was told of a time limit it does not have."""
    booking = SetAside("h", (0,), start=3600 + G / 2, end=7200, owner="ana")
    limited = plan([job("lim", user="ben", limit_s=3600)], [host("h", gpu(0))], [], CFG, now=0, set_aside=[booking])
    assert starts(limited) == {} and limited.reasons["lim"].endswith("may run past that (its time limit and grace)")
    learned = plan(
        [job("guess", user="ben")], [host("h", gpu(0))], [], CFG, 0, set_aside=[booking], estimates={"guess": 4000.0}
    )
    assert learned.reasons["guess"].endswith("may run past that (its kind's longest recent run, and a grace)")


def test_a_job_kept_off_by_a_booking_names_the_booked_gpu_it_would_take():
    """A member's review: both GPUs booked for ana from 1 h on, h:0 busy with a job of its own:
    bo's 2-hour job would take h:1, and its reason named h:0 (the first booked GPU, full)."""
    b = SetAside("h", (0, 1), start=3600, end=7200, owner="ana")
    busy = [run("r0", gpus=(0,), mem_gib=None, user="cy", limit_s=1800)]
    result = plan(
        [job("bo-long", user="bo", mem_gib=None, limit_s=7200)],
        [host("h", gpu(0), gpu(1))],
        busy,
        CFG,
        now=0,
        set_aside=[b],
    )
    assert starts(result) == {} and result.reasons["bo-long"].startswith("GPU h:1 booked for ana from ")
    now = [SetAside("h", (0, 1), start=0, end=7200, owner="ana")]
    result = plan(
        [job("bo-now", user="bo", mem_gib=None)], [host("h", gpu(0), gpu(1))], busy, CFG, now=10, set_aside=now
    )
    assert result.reasons["bo-now"].startswith("GPU h:1 booked for ana until ")


def test_a_job_held_to_some_hosts_says_so_where_none_of_theirs_is_free():
    """A member's review: `needs a whole GPU; 0 GPUs are wholly free` while b's were idle."""
    busy = [run("a0", "a", gpus=(0,), mem_gib=None)]
    pinned = job("pinned", mem_gib=None)
    result = plan(
        [replace(pinned, spec=replace(pinned.spec, hosts=("a",)))],
        [host("a", gpu(0)), host("b", gpu(0))],
        busy,
        CFG,
        now=0,
    )
    assert result.reasons["pinned"] == "needs a whole GPU; 0 GPUs are wholly free among hosts a"


def test_a_booking_owners_jobs_go_to_the_gpus_they_booked_first():
    """Newcomer review: ben's jobs went onto the one unbooked GPU while his booked ones sat
    empty, so ana's jobs waited."""
    b = SetAside("h", (0, 1), start=100, end=200, owner="ben")
    hosts = [host("h", gpu(0), gpu(1), gpu(2), gpu(3))]
    pending = [job(f"ben-{i}", user="ben", queued_at=i) for i in range(3)] + [job("ana-1", user="ana", queued_at=9)]
    placed = starts(plan(pending, hosts, [], CFG, now=150, set_aside=[b]))
    assert all(placed[f"ben-{i}"][1] in ((0,), (1,)) for i in range(3)), placed  # his booked GPUs first
    assert placed["ana-1"][1] in ((2,), (3,)), placed  # the unbooked ones stay for the others
    whole = [job(f"ben-w{i}", user="ben", mem_gib=None, queued_at=i) for i in range(3)]  # a GPU each
    placed = starts(plan(whole, hosts, [], CFG, now=150, set_aside=[b]))
    assert sorted(placed[f"ben-w{i}"][1] for i in range(2)) == [(0,), (1,)] and placed["ben-w2"][1] in ((2,), (3,))


def test_opportunistic_jobs_there_before_a_booking_yield_when_it_begins():
    b = SetAside("h", (0,), start=100, end=200, owner="ana")
    running = [
        run("early", user="bo", low=True, started_at=50),
        run("late", user="bo", low=True, started_at=120),
        run("anas", user="ana", low=True, started_at=50),
    ]
    result = plan([], [host("h", gpu(0))], running, CFG, now=150, set_aside=[b])
    assert set(result.preempts) == {"early"} and result.preempts["early"].startswith("GPU h:0 booked for ana from ")
    assert plan([], [host("h", gpu(0))], running, CFG, now=90, set_aside=[b]).preempts == {}


def test_a_job_whose_victim_is_yielding_keeps_that_hold_and_preempts_no_second_one():
    hosts = [host("a", gpu(0, 16), gpu(1, 16)), host("b", gpu(0, 16))]
    lows = [run("o", "a", (0,), mem_gib=8, low=True), run("o2", "b", (0,), mem_gib=8, low=True)]
    taken = [run("m", "a", (1,), mem_gib=12)]  # no GPU free of low jobs has room for j
    first = plan([job("j", mem_gib=8)], hosts, lows + taken, CFG, now=100)
    assert len(first.preempts) == 1
    victim = next(iter(first.preempts))
    # Next pass: the victim yields, and meanwhile m ended and an ordinary job took a:1.
    now_running = [replace(r, stopping=r.id == victim) for r in lows] + [run("m2", "a", (1,), mem_gib=12)]
    again = plan([job("j", mem_gib=8)], hosts, now_running, CFG, now=101)
    assert again.preempts == {} and again.starts == []
    assert again.held["j"] == first.held["j"]


def test_the_heads_reservation_is_never_on_a_gpu_someone_else_has_booked():
    """A review: carol's head was reserved bob's booked GPU (and said a time that was not her
    START BY). Only GPUs with no one else's booking to come are reserved for her."""
    b = SetAside("h", (1,), start=500, end=5000, owner="bob")
    busy = [
        run("r0", gpus=(0,), mem_gib=None, limit_s=3000, user="ana"),
        run("r1", gpus=(1,), mem_gib=None, limit_s=100, user="ana"),
    ]
    result = plan(
        [job("carolj", user="carol", mem_gib=None, limit_s=20)],
        [host("h", gpu(0), gpu(1))],
        busy,
        CFG,
        now=50,
        set_aside=[b],
    )
    assert result.reserved == {"carolj": ("h", (0,), 3000 + G)}
    # and her reason says why not on the GPU that frees first
    why = result.reasons["carolj"]
    assert why.endswith(f"; not on GPU h:1: booked for others from {moment(500, 50)}"), why
    # A member's use: h:1 idle, and carol's job would run into bob's booking there. Her reason
    # named only the GPU reserved for her, as if h:1 were not there.
    idle = plan(
        [job("carolj", user="carol", mem_gib=None, limit_s=1000)],
        [host("h", gpu(0), gpu(1))],
        busy[:1],
        CFG,
        now=50,
        set_aside=[b],
    )
    assert idle.starts == [] and idle.reserved == {"carolj": ("h", (0,), 3000 + G)}
    why = idle.reasons["carolj"]
    assert why.endswith(f"; not on GPU h:1: booked for others from {moment(500, 50)}"), why


def test_a_reservation_days_ahead_says_its_day():
    busy = [run("long", gpus=(0,), mem_gib=None, limit_s=2 * 86400)]
    result = plan([job("next", mem_gib=None, queued_at=1)], [host("h", gpu(0))], busy, CFG, now=10)
    day = time.strftime("%b %d", time.localtime(math.ceil(2 * 86400 / 60) * 60))
    assert f"reserved for it from {day} " in result.reasons["next"], result.reasons["next"]


def test_cores_and_host_memory_are_held_as_sbatch_holds_them():
    """A Slurm user's session: three -c 2 jobs on a 2-core box all ran at once, pinned to the
    same cores, and three --mem 15G jobs on a 24 GiB box too. -c and --mem hold them now."""

    def asking(job_id: str, cpus: int | None = None, mem_gib: int | None = None, queued_at: float = 0.0) -> PendingJob:
        j = job(job_id, mem_gib=1, queued_at=queued_at)
        return replace(j, spec=replace(j.spec, cpus=cpus, mem_mib=mem_gib and mem_gib * 1024))

    gpus = tuple(gpu(i) for i in range(4))
    box = [HostView("h", gpus, 1, cores=2, mem_mib=24 * 1024)]
    two = plan([asking("c1", cpus=2), asking("c2", cpus=2, queued_at=1)], box, [], CFG, 10)
    assert list(starts(two)) == ["c1"]
    assert two.reasons["c2"] == "needs 2 cores (-c) on one box; at most 0 not held there (h)"
    held = [replace(run("r", gpus=(0,), mem_gib=1), cpus=1, mem_mib=15 * 1024)]
    mem = plan([asking("m1", mem_gib=15), asking("c3", cpus=1, queued_at=1)], box, held, CFG, 10)
    assert list(starts(mem)) == ["c3"]  # the other core is free; 9 GiB of memory is not 15
    assert mem.reasons["m1"].startswith("needs 15GiB of host memory (--mem) on one box; at most 9GiB")
    # A box that does not say what it has (an older worker, the simulator's boxes) holds nothing back.
    unsaid = [HostView("h", gpus, 1)]
    assert len(starts(plan([asking("a", cpus=2), asking("b", cpus=2)], unsaid, held, CFG, 10))) == 2
    # Opportunistic jobs' cores yield to ordinary work, as their GPUs do.
    low = [replace(run("lo", gpus=(3,), mem_gib=1, low=True), cpus=2)]
    assert list(starts(plan([asking("c4", cpus=2)], box, low, CFG, 10))) == ["c4"]


def test_a_low_job_kept_to_its_hosts_says_so_in_its_reason():
    """A member: pa (hosts: [a]) said "every idle GPU has ordinary work on it" beside an idle b:0."""
    idle = {0: 0.0}
    hosts = [HostView("a", (gpu(0),), 1, idle), HostView("b", (gpu(0),), 1, idle)]
    pa = job("pa", mem_gib=None, priority="low")
    pa = replace(pa, spec=replace(pa.spec, hosts=("a",)))
    result = plan([pa], hosts, [run("n", "a", (0,), mem_gib=10)], CFG, now=1000)
    assert result.reasons["pa"] == "opportunistic: every idle GPU among hosts a has ordinary work on it or held for it"


def test_a_reservation_behind_a_learned_run_does_not_call_it_a_time_limit():
    """A member: "reserved for it from 22:34, when the jobs there must have ended (their time
    limits, ...)" while tr-3 there had no limit, only its kind's runs to go by."""
    busy = [replace(run("tr-3", gpus=(0,), mem_gib=None, limit_s=100), limit_learned=True)]
    busy.append(run("lim", gpus=(1,), mem_gib=None, limit_s=50))
    result = plan([job("pair", gpus=2, mem_gib=None)], [host("h", gpu(0), gpu(1))], busy, CFG, now=10)
    assert "pair" in result.reserved
    assert (
        "when the jobs there should have ended (their time limits, or for tr-3 without one its kind's"
        in (result.reasons["pair"])
    )
    plain = plan([job("pair", gpus=2, mem_gib=None)], [host("h", gpu(0), gpu(1))], busy[1:], CFG, now=10)
    assert "must have ended (their time limits, and a stop's grace)" in plain.reasons["pair"], plain.reasons


def test_a_job_waits_for_a_gpu_that_frees_before_the_low_job_it_would_preempt_could_yield():
    """A member: x on h:0 was at its limit (being stopped), lo on h:1 had `grace: 60s`. y came
    and lo was told to yield; five seconds later x was gone and y started on h:0, and lo lost
    its work for nothing while h:1 stood idle for its grace. y now waits for h:0; where no GPU
    frees before the low job could have yielded, it still preempts."""
    hosts = [host("h", gpu(0), gpu(1))]
    x = run("x", gpus=(0,), mem_gib=None, user="ana", started_at=0, limit_s=30)
    lo = replace(run("lo", gpus=(1,), mem_gib=None, user="cy", low=True), grace_s=60.0)
    y = job("y", user="ben", mem_gib=None, queued_at=31)
    waiting = plan([y], hosts, [x, lo], CFG, now=32)
    assert waiting.preempts == {} and waiting.starts == [], waiting
    assert waiting.reserved["y"] == ("h", (0,), 30 + G)
    assert starts(plan([y], hosts, [lo], CFG, now=30 + G + 1)) == {"y": ("h", (0,))}
    # x with an hour left: lo yields (60 s) sooner than h:0 frees.
    long_x = replace(x, limit_s=3600)
    told = plan([y], hosts, [long_x, lo], CFG, now=32)
    assert list(told.preempts) == ["lo"] and told.held == {"y": ("h", (1,))}


def test_early_yield_only_where_the_head_is_due_by_limits_and_on_the_box_with_fewer_to_yield():
    """A review of the early yield: (1) pair could start as soon on box b, where no low job
    runs, but was reserved box a (the first of hosts alike), and lo there was told to yield for
    nothing; (2) a head due by a running job's learned time (no limit: it may run on, and the
    reservation go) had lo told to yield all the same."""
    lo = replace(run("lo", "a", (1,), mem_gib=None, user="cy", low=True), grace_s=60.0)
    a_job = run("occA", "a", (0,), mem_gib=None, user="ana", limit_s=100)
    b_jobs = [run(f"occB{i}", "b", (i,), mem_gib=None, user="ana", limit_s=100) for i in (0, 1)]
    hosts = [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1))]
    pair = job("pair", user="ben", gpus=2, mem_gib=None, queued_at=1)
    result = plan([pair], hosts, [a_job, lo, *b_jobs], CFG, now=60)
    assert result.reserved["pair"][:2] == ("b", (0, 1)) and result.preempts == {}
    assert result.recheck_at == math.inf
    guessed = replace(run("occ", gpus=(0,), mem_gib=None, user="ana", limit_s=100), limit_learned=True)
    soak = replace(run("soak", gpus=(1,), mem_gib=None, user="cy", low=True), grace_s=60.0)
    result = plan([pair], [host("h", gpu(0), gpu(1))], [guessed, soak], CFG, now=99)
    assert "pair" in result.reserved and result.preempts == {}


def test_a_booking_owners_job_takes_the_booked_gpu_from_a_low_job_before_a_shared_one():
    """A review: ana's job left the GPU booked for her to cy's low job and took h:1, which bo
    wanted next. The owner's booked GPUs come first, low jobs there yield."""
    booking = SetAside("h", (0,), start=100, end=5000, owner="ana")
    lo = run("lo", gpus=(0,), mem_gib=10, user="cy", low=True, started_at=120)
    result = plan(
        [job("mine", user="ana", queued_at=140)], [host("h", gpu(0), gpu(1))], [lo], CFG, now=150, set_aside=[booking]
    )
    assert result.held == {"mine": ("h", (0,))} and list(result.preempts) == ["lo"]


def test_a_low_job_kept_off_a_reserved_gpu_it_would_be_told_to_leave_at_once_says_why():
    busy = [run("occ", gpus=(0,), mem_gib=None, user="ana", started_at=0, limit_s=100)]
    head = job("pair", user="ben", gpus=2, mem_gib=None, limit_s=60, queued_at=1)
    soak = job("soak", user="cy", mem_gib=None, priority="low", queued_at=2)
    result = plan([head, soak], [host("h", gpu(0), gpu(1))], busy, CFG, now=100 + G - 2 * G)
    assert starts(result) == {}
    why = result.reasons["soak"]
    assert why.startswith("opportunistic: GPU h:1 is reserved for job pair from "), why
    assert f"too soon to start there and yield in time (its grace {G:g}s)" in why, why
