"""The pure planner, fed plain data: memory accounting, best fit, order, reasons."""

from __future__ import annotations

from dataclasses import replace

from gpuq.model.config import Config
from gpuq.model.gpu import GpuProcess, GpuSnapshot
from gpuq.model.jobs import HostView, PendingJob, RunningJob
from gpuq.model.spec import JobSpec
from gpuq.sched.placement import usable_mib
from gpuq.sched.plan import plan

CFG = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=4, cpu_slots=1)
GIB = 1024


def gpu(index: int, total_gib: int = 80, used_gib: float = 0, procs=()) -> GpuSnapshot:
    return GpuSnapshot(
        index,
        f"GPU-{index}",
        "Test",
        total_gib * GIB,
        int(used_gib * GIB),
        processes=tuple(GpuProcess(p, int(m * GIB)) for p, m in procs),
    )


def host(name: str, *gpus: GpuSnapshot, cpu: int = 1) -> HostView:
    return HostView(name, tuple(gpus), cpu)


def job(
    job_id: str,
    gpus: int = 1,
    mem_gib: float | None = 10,
    priority: str | int = "normal",
    age: float = 0.0,
    hosts: tuple[str, ...] = (),
) -> PendingJob:
    cls, prio = (priority, 0) if isinstance(priority, str) else ("normal", priority)
    spec = JobSpec(
        command="x",
        gpus=gpus,
        gpu_mem_mib=None if mem_gib is None else int(mem_gib * GIB),
        priority_class=cls,
        priority=prio,
        hosts=hosts,
    )
    return PendingJob(job_id, "u", spec, age)


def running(
    job_id: str, host_name: str, gpus: tuple[int, ...], mem_gib: float | None, observed: dict[int, float] | None = None
) -> RunningJob:
    return RunningJob(
        job_id,
        "u",
        host_name,
        gpus,
        None if mem_gib is None else int(mem_gib * GIB),
        {i: int(m * GIB) for i, m in (observed or {}).items()},
    )


def starts(result) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {s.job_id: (s.host, s.gpus) for s in result.starts}


def test_nvml_lag_counts_declared_memory_not_just_observed():
    # A job started a second ago: NVML sees 1 GiB of its declared 30 GiB.
    r = running("new", "a", (0,), 30, observed={0: 1})
    assert usable_mib(gpu(0, 80, used_gib=1), [r], 0) == 50 * GIB


def test_observed_above_declared_counts_observed():
    r = running("greedy", "a", (0,), 10, observed={0: 25})
    assert usable_mib(gpu(0, 80, used_gib=25), [r], 0) == 55 * GIB


def test_non_gpuq_processes_and_reserve_reduce_usable_memory():
    snap = gpu(0, 80, used_gib=30, procs=[(999, 30)])  # a person's notebook
    assert usable_mib(snap, [], 1024) == 50 * GIB
    assert usable_mib(gpu(0, 80, used_gib=0.5), [], 1024) == 79 * GIB  # driver share within reserve


def test_the_plan_keeps_the_reserve_that_status_leaves_out_of_usable_memory():
    """config gpu_mem_reserve_mib is the driver's share of each GPU: status's USABLE (usable_mib)
    leaves it out, and so must the plan, or a job that fits only in the reserve starts and runs
    out of memory. The other plan tests use a reserve of 0, where the two cannot disagree."""
    cfg = replace(CFG, gpu_mem_reserve_mib=GIB)
    snap = gpu(0, 80, used_gib=0.5)  # the driver's own 0.5 GiB, within the reserve
    assert usable_mib(snap, [], GIB) == 79 * GIB
    at_usable = plan([job("fits", mem_gib=79)], [host("h", snap)], [], cfg, 0)
    assert starts(at_usable) == {"fits": ("h", (0,))}
    # 79.5 GiB: what is left beside the driver's 0.5 GiB, but half of it is the reserve's.
    into_reserve = plan([job("over", mem_gib=79.5)], [host("h", snap)], [], cfg, 0)
    assert into_reserve.starts == [], "placed in the reserve"
    assert into_reserve.reasons["over"] == "needs 79.5GiB on one GPU; the largest GPU holds 79GiB usable (h:0)"


def test_two_jobs_in_one_pass_never_overcommit():
    result = plan([job("a", mem_gib=50), job("b", mem_gib=50)], [host("h", gpu(0))], [], CFG, 0)
    assert list(starts(result)) == ["a"]
    assert "most free now is 30GiB on h:0" in result.reasons["b"]


def test_best_fit_prefers_the_tightest_gpu():
    hosts = [host("h", gpu(0, 80), gpu(1, 24), gpu(2, 40))]
    result = plan([job("small", mem_gib=20), job("big", mem_gib=70)], hosts, [], CFG, 0)
    assert starts(result) == {"small": ("h", (1,)), "big": ("h", (0,))}


def test_multi_gpu_jobs_take_gpus_on_one_host():
    hosts = [host("a", gpu(0), gpu(1, used_gib=79, procs=[(5, 79)])), host("b", gpu(0), gpu(1))]
    result = plan([job("pair", gpus=2, mem_gib=40)], hosts, [], CFG, 0)
    assert starts(result) == {"pair": ("b", (0, 1))}
    result = plan([job("wide", gpus=3, mem_gib=1)], hosts, [], CFG, 0)
    assert result.reasons["wide"] == "needs 3 GPUs on one host; the most any host offers is 2"


def test_whole_gpu_jobs_are_exclusive():
    hosts = [host("h", gpu(0), gpu(1))]
    result = plan(
        [job("w0", mem_gib=None, age=0), job("w1", mem_gib=None, age=1), job("s", mem_gib=1, age=2)], hosts, [], CFG, 0
    )
    assert set(starts(result)) == {"w0", "w1"}
    assert "most free now is 0MiB" in result.reasons["s"]
    busy = [running("x", "h", (0,), 1)]
    result = plan([job("w", mem_gib=None)], [host("h", gpu(0))], busy, CFG, 0)
    assert result.starts == [] and "0 GPUs are wholly free" in result.reasons["w"]


def test_a_leftover_process_keeps_the_gpu_occupied():
    # The job ended, its process still holds 60 GiB: the GPU is not whole, and only 20 GiB fit.
    hosts = [host("h", gpu(0, used_gib=60, procs=[(4242, 60)]))]
    result = plan([job("w", mem_gib=None), job("s", mem_gib=30)], hosts, [], CFG, 0)
    assert result.starts == []
    assert "most free now is 20GiB on h:0" in result.reasons["s"]


def test_queue_order_class_then_priority_then_age():
    jobs = [
        job("old-low", priority="low", age=1),
        job("new-high", priority="high", age=9),
        job("normal-7", priority=7, age=5),
        job("normal-old", age=2),
        job("normal-new", age=3),
    ]
    result = plan(jobs, [], [], CFG, 0)
    assert result.order == ["new-high", "normal-7", "normal-old", "normal-new", "old-low"]
    behind = {
        "new-high": "",
        "normal-7": "; behind 1 higher-priority job",
        "normal-old": "; behind 2 higher-priority jobs",
        "normal-new": "; behind 2 higher-priority jobs",
        "old-low": "; behind 4 higher-priority jobs",
    }
    assert result.reasons == {i: "no worker is running" + b for i, b in behind.items()}


def test_big_head_does_not_block_smaller_jobs_that_fit():
    result = plan([job("huge", mem_gib=90, age=0), job("small", mem_gib=10, age=1)], [host("h", gpu(0))], [], CFG, 0)
    assert list(starts(result)) == ["small"]
    assert result.reasons["huge"] == "needs 90GiB on one GPU; the largest GPU holds 80GiB usable (h:0)"


def test_max_jobs_per_gpu_and_cpu_slots():
    cfg = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=2, cpu_slots=1)
    result = plan(
        [job(f"j{i}", mem_gib=1, age=i) for i in range(3)] + [job("c1", gpus=0, age=10), job("c2", gpus=0, age=11)],
        [host("h", gpu(0))],
        [],
        cfg,
        0,
    )
    assert set(starts(result)) == {"j0", "j1", "c1"}
    assert result.reasons["j2"] == "every GPU has max_jobs_per_gpu=2 jobs"
    assert result.reasons["c2"] == "all CPU-only slots are busy"


def test_hosts_restriction():
    hosts = [host("a", gpu(0)), host("b", gpu(0))]
    result = plan([job("only-b", hosts=("b",)), job("only-z", hosts=("z",))], hosts, [], CFG, 0)
    assert starts(result) == {"only-b": ("b", (0,))}
    assert result.reasons["only-z"] == "no live host among hosts z"


def test_without_explain_the_worker_stops_early_but_starts_the_same_jobs():
    pending = [job(f"j{i}", mem_gib=30, age=i) for i in range(1000)]
    hosts = [host("h", gpu(0), gpu(1))]
    quick = plan(pending, hosts, [], CFG, 0, explain=False)
    full = plan(pending, hosts, [], CFG, 0, explain=True)
    assert quick.starts == full.starts and len(full.starts) == 4
    assert quick.reasons == {} and len(full.reasons) == 996


def test_spread_then_pack_small_jobs_take_idle_gpus_before_sharing_one():
    hosts = [host("a", *(gpu(i) for i in range(4))), host("b", *(gpu(i) for i in range(4)))]
    small = [job(f"s{i}", mem_gib=4, age=i) for i in range(10)]
    placed = list(starts(plan(small[:4], hosts, [], CFG, 0)).values())
    assert len(set(placed)) == 4 and {h for h, _ in placed} == {"a"}  # four GPUs, one host kept whole
    placed = list(starts(plan(small, hosts, [], CFG, 0)).values())
    # While at least half the GPUs are empty each job takes one (5 of 8); then they pack.
    assert len(placed) == 10 and len(set(placed)) == 5
    one_box = [host("a", *(gpu(i) for i in range(4)))]
    placed = list(starts(plan(small[:4], one_box, [], CFG, 0)).values())
    assert len(set(placed)) == 3  # the fourth finds one GPU of four empty: under half, it packs
    no_spread = replace(CFG, spread=False)
    assert len(set(starts(plan(small[:4], hosts, [], no_spread, 0)).values())) == 1  # the control


def test_jobs_whose_declared_compute_fits_together_share_a_gpu_while_others_sit_idle():
    """Spreading is against jobs slowing each other on one GPU. Jobs that declare their share of
    compute (gpu_compute) and fit in one GPU's together slow nobody there: they share it, and the
    empty GPUs stay whole for jobs that need one. A job that declares none may keep a GPU busy:
    nobody joins it, and it joins nobody, while GPUs sit idle."""
    hosts = [host("a", *(gpu(i) for i in range(4)))]

    def share(job_id: str, pct: int | None, age: float) -> PendingJob:
        j = job(job_id, mem_gib=4, age=age)
        return replace(j, spec=replace(j.spec, gpu_compute_pct=pct))

    fitting = [share("p40", 40, 0), share("q40", 40, 1), share("r20", 20, 2)]
    assert set(starts(plan(fitting, hosts, [], CFG, 0)).values()) == {("a", (0,))}
    # 40 + 70 is over one GPU's compute: the second takes an empty GPU, as any job would.
    assert len(set(starts(plan([share("p40", 40, 0), share("q70", 70, 1)], hosts, [], CFG, 0)).values())) == 2
    # A job that declares no share is not joined, and does not join one that did.
    undeclared = [share("u", None, 0), share("p40", 40, 1), share("q", None, 2)]
    assert len(set(starts(plan(undeclared, hosts, [], CFG, 0)).values())) == 3
    # The same from running jobs, as a worker's records show them (RunningJob.of).
    busy = [replace(running("r40", "a", (2,), 4), compute_pct=40), running("r", "a", (3,), 4)]
    assert starts(plan([share("p60", 60, 0)], hosts, busy, CFG, 0)) == {"p60": ("a", (2,))}
    assert starts(plan([share("p70", 70, 0)], hosts, busy, CFG, 0))["p70"][1][0] in (0, 1)


def test_a_waiting_job_that_needs_whole_gpus_keeps_them_empty_while_small_ones_pack():
    hosts = [host("a", gpu(0), gpu(1))]
    busy = [running("r", "a", (0,), 10)]
    pending = [job("whole", mem_gib=None, age=0), job("small", mem_gib=4, age=1)]
    busy_whole = busy + [running("w", "a", (1,), None)]  # the whole job cannot start: GPU 1 is taken
    result = plan(pending, hosts, busy_whole, CFG, 0)
    assert starts(result) == {"small": ("a", (0,))}
    # With GPU 1 free the whole job takes it, and the small one joins GPU 0 rather than wait.
    assert starts(plan(pending, hosts, busy, CFG, 0)) == {"whole": ("a", (1,)), "small": ("a", (0,))}
    # One empty GPU, and a whole job behind the small one that needs it: the small one packs.
    late_whole = [job("small", mem_gib=4, age=0), job("whole", mem_gib=None, age=1)]
    assert starts(plan(late_whole, hosts, busy, CFG, 0)) == {"small": ("a", (0,)), "whole": ("a", (1,))}


def test_a_whole_gpu_job_no_box_can_ever_take_does_not_stop_spreading():
    hosts = [host("a", gpu(0, 16), gpu(1, 16)), host("b", gpu(0, 16), gpu(1, 16))]
    small = [job(f"s{i}", mem_gib=2, age=i + 1) for i in range(3)]
    placed = starts(plan([job("huge", gpus=8, mem_gib=None, age=0)] + small, hosts, [], CFG, 0))
    assert len(set(placed.values())) == 3
