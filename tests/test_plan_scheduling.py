"""The planner's scheduling rules, fed plain data: fair share and ageing, the per-user cap,
reservations, opportunistic jobs (idle GPUs, windows) and preemption."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from test_plan import GIB, gpu, host

from gpuq.model.config import Config
from gpuq.model.jobs import HostView, PendingJob, RunningJob
from gpuq.model.spec import JobSpec
from gpuq.model.windows import parse_window
from gpuq.sched.plan import plan

CFG = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=4, cpu_slots=1, idle_after_s=60, reservations=True)


def job(
    job_id: str,
    user: str = "u",
    gpus: int = 1,
    mem_gib: float | None = 10,
    priority: str = "normal",
    queued_at: float = 0.0,
    preemptible: bool | None = None,
) -> PendingJob:
    spec = JobSpec(
        command="x",
        gpus=gpus,
        gpu_mem_mib=None if mem_gib is None else int(mem_gib * GIB),
        priority_class=priority,
        preemptible=priority == "low" if preemptible is None else preemptible,
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
    )


def starts(result) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {s.job_id: (s.host, s.gpus) for s in result.starts}


def test_fair_share_puts_the_user_holding_fewer_gpus_first():
    busy = [run("ana-1", mem_gib=10, user="ana"), run("ana-2", mem_gib=10, user="ana")]
    pending = [job("ana-3", user="ana", queued_at=0), job("bo-1", user="bo", queued_at=10)]
    result = plan(pending, [host("h", gpu(0))], busy, CFG, now=20)
    assert result.order == ["bo-1", "ana-3"]
    assert plan(pending, [host("h", gpu(0))], busy, replace(CFG, fair_share=False), now=20).order == ["ana-3", "bo-1"]


def test_waiting_ages_a_job_past_lighter_users_jobs_that_came_an_age_step_later():
    busy = [run("ana-1", mem_gib=None, user="ana")]  # ana holds one whole GPU: one age step behind
    step = CFG.age_step_s
    pending = [
        job("ana-2", user="ana", queued_at=0),
        job("bo-1", user="bo", queued_at=0.5 * step),
        job("cy-1", user="cy", queued_at=1.5 * step),
    ]
    assert plan(pending, [], busy, CFG, now=2 * step).order == ["bo-1", "ana-2", "cy-1"]


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


def test_the_aged_head_gets_gpus_reserved_and_smaller_jobs_may_not_take_them():
    # Two GPUs, each half taken by small jobs that started after the pair job was queued.
    busy = [run("s1", gpus=(0,), mem_gib=40, started_at=100), run("s2", gpus=(1,), mem_gib=40, started_at=100)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("small", mem_gib=10, queued_at=50)]
    hosts = [host("h", gpu(0), gpu(1))]
    young = plan(pending, hosts, busy, CFG, now=200)  # waited 200 s < reserve_after_s
    assert list(starts(young)) == ["small"] and young.held == {}
    aged = plan(pending, hosts, busy, CFG, now=CFG.reserve_after_s + 50)
    assert aged.starts == [] and aged.held == {"pair": ("h", (0, 1))}
    assert aged.reasons["small"] == "GPU reserved for job pair"
    assert "reserved for it" in aged.reasons["pair"]


def test_a_reservation_stays_on_its_box_while_young_jobs_start_on_the_other():
    """Box b holds a GPU free for the pair job and waits for one older job; on box a one GPU
    just came free and a job younger than b's started on the other. Moving the reservation to
    a would hand b's free GPU to the next small job, and the next move would do it again:
    with a stream of small jobs the pair job never starts."""
    t = CFG.reserve_after_s
    busy = [
        run("older", "b", gpus=(0,), mem_gib=40, started_at=t + 10),
        run("younger", "a", gpus=(1,), mem_gib=40, started_at=t + 40),
    ]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("small", mem_gib=10, queued_at=t)]
    hosts = [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1))]
    result = plan(pending, hosts, busy, CFG, now=t + 50)
    assert result.held == {"pair": ("b", (1, 0))}
    assert starts(result)["small"][0] == "a"  # not on b:1, held for the pair


def test_a_reservation_on_a_box_wider_than_its_job_keeps_its_gpus_as_jobs_start_beside_them():
    """h:0 and h:1 were held when h:2 and h:3 took new jobs; then h:0's job ends. Moving to the
    newest jobs' GPUs, as the rule used to, hands the held ones to the next small jobs."""
    t = CFG.reserve_after_s
    busy = [run(f"j{g}", gpus=(g,), mem_gib=40, started_at=t + start) for g, start in enumerate((10, 12, 40, 45))]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0), job("small", mem_gib=40, queued_at=t)]
    hosts = [host("h", gpu(0), gpu(1), gpu(2), gpu(3))]
    assert plan(pending, hosts, busy, CFG, now=t + 50).held == {"pair": ("h", (0, 1))}
    later = plan(pending, hosts, busy[1:], CFG, now=t + 51)  # j0 ended: h:0 is free
    assert later.held == {"pair": ("h", (0, 1))} and starts(later)["small"] in (("h", (2,)), ("h", (3,)))


@pytest.mark.parametrize("a_started, b_started", [(40, 10), (10, 20)])
def test_a_reservation_goes_where_fewer_gpus_are_still_to_free(a_started, b_started):
    """b has one GPU to free, a two, whichever box's jobs are older (the newest wins on the
    first row, the oldest on the second: the count decides both)."""
    t = CFG.reserve_after_s
    busy = [
        run("a0", "a", gpus=(0,), mem_gib=40, started_at=t + a_started),
        run("a1", "a", gpus=(1,), mem_gib=40, started_at=t + 40),
        run("b0", "b", gpus=(0,), mem_gib=40, started_at=t + b_started),
    ]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0)]
    result = plan(pending, [host("a", gpu(0), gpu(1)), host("b", gpu(0), gpu(1))], busy, CFG, now=t + 50)
    assert result.held == {"pair": ("b", (1, 0))}


def test_a_reserved_gpu_keeps_a_place_among_max_jobs_per_gpu_for_its_job():
    """h:1 has no place left (4 jobs, the most); h:0 has one. Given to a small job, h:0 would
    be full by the time h:1 has a place again, pass after pass."""
    t = CFG.reserve_after_s
    busy = [run(f"x{g}{k}", gpus=(g,), mem_gib=10, started_at=t + 10) for g, n in ((0, 3), (1, 4)) for k in range(n)]
    pending = [job("wide", gpus=2, mem_gib=40, queued_at=0), job("small", mem_gib=10, queued_at=t)]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=t + 50)
    assert result.held == {"wide": ("h", (0, 1))}
    assert starts(result) == {} and result.reasons["small"] == "GPU reserved for job wide"


def test_no_reservation_for_a_whole_gpu_job_where_other_memory_stays():
    """a:0 holds memory no gpuq job accounts for: waiting for jobs never frees it."""
    t = CFG.reserve_after_s
    busy = [run("b0", "b", gpus=(0,), mem_gib=40, started_at=t + 10)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=0)]
    hosts = [host("a", gpu(0, used_gib=5), gpu(1)), host("b", gpu(0), gpu(1))]
    assert plan(pending, hosts, busy, CFG, now=t + 50).held == {"pair": ("b", (1, 0))}


def test_no_reservation_behind_a_job_that_was_running_before_the_head_came():
    busy = [run("long", gpus=(0,), mem_gib=40, started_at=0), run("s2", gpus=(1,), mem_gib=40, started_at=100)]
    pending = [job("pair", gpus=2, mem_gib=None, queued_at=10), job("small", mem_gib=10, queued_at=50)]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=CFG.reserve_after_s + 50)
    assert result.held == {} and list(starts(result)) == ["small"]


def test_a_reserved_gpu_still_takes_opportunistic_work_but_never_beside_ordinary_work():
    busy = [run("s1", gpus=(0,), mem_gib=40, started_at=100)]
    pending = [
        job("pair", gpus=2, mem_gib=None),
        job("filler", mem_gib=10, priority="low", queued_at=5),
        job("small", mem_gib=10, queued_at=6),
    ]
    result = plan(pending, [host("h", gpu(0), gpu(1))], busy, CFG, now=CFG.reserve_after_s + 50)
    assert {j: (h, sorted(g)) for j, (h, g) in result.held.items()} == {"pair": ("h", [0, 1])}
    assert starts(result) == {"filler": ("h", (1,))}  # the empty reserved GPU, not beside s1
    assert result.reasons["small"] == "GPU reserved for job pair"


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
    # Without the low jobs both GPUs are empty: n and later each get one (spread), and the low
    # jobs on them yield; their GPUs are held so that nothing slips in meanwhile.
    assert result.preempts == {
        "lo-big": "job n needs its GPU memory",
        "lo-old": "job later needs its GPU memory",
        "lo-new": "job later needs its GPU memory",
    }
    assert result.held == {"n": ("h", (1,)), "later": ("h", (0,))} and result.starts == []
    assert result.reasons["lo-wait"] == "opportunistic: every idle GPU has ordinary work on it or held for it"
    # The next pass, while they drain: still held, nothing preempted twice, nothing slips in.
    draining = [replace(b, stopping=True) for b in busy]
    again = plan(pending, hosts, draining, CFG, now=101)
    assert again.preempts == {} and again.held == result.held and again.starts == []
    gone = starts(plan(pending, hosts, [], CFG, now=110))
    assert set(gone) == {"n", "later"} and gone["n"] != gone["later"]  # lo-wait: never beside them


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


# --- bookings ----------------------------------------------------------------------------------


def test_a_booked_gpu_takes_only_its_owners_jobs_and_opportunistic_ones():
    from gpuq.model.booking import Booking

    b = Booking("bk-1", "h", (0,), start=100, end=200, owner="ana")
    hosts = [host("h", gpu(0))]
    result = plan([job("bo-1", user="bo")], hosts, [], CFG, now=150, bookings=[b])
    assert starts(result) == {}
    assert result.reasons["bo-1"].startswith("GPU h:0 booked for ana until ")
    assert starts(plan([job("ana-1", user="ana")], hosts, [], CFG, now=150, bookings=[b])) == {"ana-1": ("h", (0,))}
    assert starts(plan([job("bo-1", user="bo")], hosts, [], CFG, now=250, bookings=[b])) == {"bo-1": ("h", (0,))}
    idle = [HostView("h", (gpu(0),), 1, {0: 0.0})]  # idle long enough for opportunistic work
    assert starts(plan([job("bo-low", user="bo", priority="low")], idle, [], CFG, now=150, bookings=[b])) == {
        "bo-low": ("h", (0,))
    }


def test_a_booking_owners_jobs_go_to_the_gpus_they_booked_first():
    """Newcomer review: ben's jobs went onto the one unbooked GPU while his booked ones sat
    empty, so ana's jobs waited."""
    from gpuq.model.booking import Booking

    b = Booking("bk-1", "h", (0, 1), start=100, end=200, owner="ben")
    hosts = [host("h", gpu(0), gpu(1), gpu(2), gpu(3))]
    pending = [job(f"ben-{i}", user="ben", queued_at=i) for i in range(3)] + [job("ana-1", user="ana", queued_at=9)]
    placed = starts(plan(pending, hosts, [], CFG, now=150, bookings=[b]))
    assert all(placed[f"ben-{i}"][1] in ((0,), (1,)) for i in range(3)), placed  # his booked GPUs first
    assert placed["ana-1"][1] in ((2,), (3,)), placed  # the unbooked ones stay for the others
    whole = [job(f"ben-w{i}", user="ben", mem_gib=None, queued_at=i) for i in range(3)]  # a GPU each
    placed = starts(plan(whole, hosts, [], CFG, now=150, bookings=[b]))
    assert sorted(placed[f"ben-w{i}"][1] for i in range(2)) == [(0,), (1,)] and placed["ben-w2"][1] in ((2,), (3,))


def test_opportunistic_jobs_there_before_a_booking_yield_when_it_begins():
    from gpuq.model.booking import Booking

    b = Booking("bk-1", "h", (0,), start=100, end=200, owner="ana")
    running = [
        run("early", user="bo", low=True, started_at=50),
        run("late", user="bo", low=True, started_at=120),
        run("anas", user="ana", low=True, started_at=50),
    ]
    result = plan([], [host("h", gpu(0))], running, CFG, now=150, bookings=[b])
    assert set(result.preempts) == {"early"} and result.preempts["early"].startswith("GPU h:0 booked for ana from ")
    assert plan([], [host("h", gpu(0))], running, CFG, now=90, bookings=[b]).preempts == {}


def test_a_job_whose_victim_is_yielding_keeps_that_hold_and_preempts_no_second_one():
    hosts = [host("a", gpu(0, 16), gpu(1, 16)), host("b", gpu(0, 16))]
    lows = [run("o", "a", (0,), mem_gib=8, low=True), run("o2", "b", (0,), mem_gib=8, low=True)]
    first = plan([job("j", mem_gib=8)], hosts, lows, CFG, now=100)
    assert len(first.preempts) == 1
    victim = next(iter(first.preempts))
    # Next pass: the victim yields, and meanwhile an ordinary job took a:1.
    now_running = [replace(r, stopping=r.id == victim) for r in lows] + [run("m", "a", (1,), mem_gib=8)]
    again = plan([job("j", mem_gib=8)], hosts, now_running, CFG, now=101)
    assert again.preempts == {} and again.starts == []
    assert again.held["j"] == first.held["j"]
