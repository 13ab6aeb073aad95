"""The slurm-easy anchor the simulator compares the plan with (slurm_easy.py): EASY backfill
on the jobs' time limits, and multifactor priority from decayed usage."""

from __future__ import annotations

from test_plan import gpu, host
from test_plan_scheduling import job, run

from gpuq.extras.sim.slurm_easy import SlurmEasy
from gpuq.extras.sim.trace import TraceJob


def _trace_job(job_id: str, user: str, gpus: int, duration: float, limit: float) -> TraceJob:
    pending = job(job_id, user=user, gpus=gpus, mem_gib=None, limit_s=limit)
    return TraceJob(job_id, 0.0, duration, pending.spec, 100.0, user, False, limit)


def test_slurm_easy_backfills_only_what_ends_before_the_heads_reservation():
    traces = [
        _trace_job("s0", "u", 1, 100, 3600),
        _trace_job("s1", "u", 1, 100, 7200),
        _trace_job("pair", "u", 2, 10, 3600),
        _trace_job("short", "u", 1, 10, 1800),
        _trace_job("long", "u", 1, 10, 7200),
    ]
    easy = SlurmEasy(traces)
    busy = [
        run("s0", gpus=(0,), mem_gib=None, started_at=0, limit_s=3600),
        run("s1", gpus=(1,), mem_gib=None, started_at=0, limit_s=7200),
    ]
    hosts = [host("h", gpu(0), gpu(1)), host("g", gpu(0))]
    pending = [job(j.id, gpus=j.spec.gpus, mem_gib=None, queued_at=i) for i, j in enumerate(traces[2:])]
    starts = easy(pending, hosts, busy, 10.0).starts
    # pair is due on h at 7200; short (ends 1810) may take g; long (ends 7210) may too: g is not h.
    assert {s.job_id: s.host for s in starts} == {"short": "g"}
    starts = easy([p for p in pending if p.id != "short"], [host("h", gpu(0), gpu(1))], busy, 10.0).starts
    assert starts == []  # long would run past pair's start on h, its only node


def test_slurm_easy_ranks_the_user_who_used_less_first():
    traces = [_trace_job("heavy-run", "ana", 1, 1000, 3600), _trace_job("a2", "ana", 1, 10, 3600)]
    traces += [_trace_job("b1", "bo", 1, 10, 3600)]
    easy = SlurmEasy(traces)
    hosts = [host("h", gpu(0), gpu(1))]
    easy([], hosts, [run("heavy-run", gpus=(0,), mem_gib=None, user="ana", started_at=0)], 0.0)
    pending = [job("a2", user="ana", mem_gib=None, queued_at=0), job("b1", user="bo", mem_gib=None, queued_at=5)]
    starts = easy(pending, hosts, [run("heavy-run", gpus=(0,), mem_gib=None, user="ana", started_at=0)], 500.0).starts
    assert [s.job_id for s in starts] == ["b1"]  # one GPU free: bo's, though ana's came first
