"""Fair share from usage: the event logs read into each user's decayed usage (spool/history.py),
and what the plan learns from them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_plan import gpu, host
from test_plan_scheduling import CFG, job, run

from gpuq.model.usage import kind_of
from gpuq.sched.estimate import learned_runs
from gpuq.sched.plan import plan
from gpuq.spool.history import UsageHistory
from gpuq.spool.layout import Layout
from gpuq.spool.store import append_event

WEEK = 7 * 86400.0


def _ended(layout: Layout, host: str, job_id: str, user: str, gpus: int, start: float, end: float, **extra) -> None:
    event = {"job": job_id, "from": "running", "to": "done", "user": user, "host": host, "gpus": list(range(gpus))}
    append_event(layout, host, {**event, "started_at": start, "ended_at": end, "gpu_mem_mib": None, **extra})


def test_the_event_logs_give_each_users_decayed_usage_read_incrementally(tmp_path):
    layout = Layout(tmp_path)
    layout.ensure()
    history = UsageHistory(layout, WEEK)
    _ended(layout, "a", "j1", "ana", 2, 0, 3600)
    _ended(layout, "b", "j2", "bo", 1, 0, 3600)
    first = history.usage(3600, {})
    assert first["ana"] == pytest.approx(2 * first["bo"]) and first["bo"] == pytest.approx(3600, rel=5e-3)
    # Only what was appended since is read; a running job's start, a line torn by a crash and
    # another's line are no usage.
    with open(layout.host_events("a"), "ab") as f:
        f.write(b'{"job":"j3","from":"pending","to":"running","user":"ana","started_at":1,"ended_at":null}\n')
        f.write(b"not json at all\n")
    _ended(layout, "a", "j4", "cy", 1, 3600, 3600 + WEEK)
    later = history.usage(3600 + WEEK, {})
    assert later["ana"] == pytest.approx(first["ana"] / 2, rel=1e-6)  # a half-life later
    assert (
        set(later) == {"ana", "bo", "cy"}
        and history.read_to[f"{'a'}.jsonl"][1] == layout.host_events("a").stat().st_size
    )


def test_a_shared_gpu_counts_as_its_memory_share_and_a_log_started_anew_is_read_anew(tmp_path):
    layout = Layout(tmp_path)
    layout.ensure()
    history = UsageHistory(layout, WEEK)
    _ended(layout, "a", "j1", "ana", 1, 0, 3600, gpu_mem_mib=20 * 1024)
    assert history.usage(3600, {"a": 80 * 1024})["ana"] == pytest.approx(900, rel=5e-3)  # a quarter of a GPU
    layout.host_events("a").unlink()  # an admin removed it: the worker starts a new one
    _ended(layout, "a", "j2", "bo", 1, 0, 3600)
    assert set(history.usage(3600, {"a": 80 * 1024})) == {"bo"}


def test_a_log_emptied_in_place_is_read_anew_though_its_inode_and_length_look_the_same(tmp_path):
    """The file system gives a log begun anew its old inode back as often as not (a suite run
    beside another saw it), and `: > log` keeps it: the inode and a length past what was read
    said "the same log", and what was appended was read from the middle of another line."""
    layout = Layout(tmp_path)
    layout.ensure()
    history = UsageHistory(layout, WEEK)
    _ended(layout, "a", "j1", "ana", 1, 0, 3600)
    assert set(history.usage(3600, {})) == {"ana"}
    inode = layout.host_events("a").stat().st_ino
    with open(layout.host_events("a"), "wb"):  # emptied in place
        pass
    for job_id in ("j2", "j3"):  # longer than what was read before
        _ended(layout, "a", job_id, "bo", 1, 0, 3600)
    assert layout.host_events("a").stat().st_ino == inode
    usage = history.usage(3600, {})
    assert set(usage) == {"bo"} and usage["bo"] == pytest.approx(2 * 3600, rel=5e-3)


def test_a_job_without_a_limit_is_expected_to_run_as_long_as_its_kinds_latest_runs(tmp_path):
    """train-1 and train-2 of ana's ran 100 s and 300 s: train-3, with no time_limit, is expected
    to run 300 s (the longest: a backfill that trusts it must not delay the head), so it may
    backfill before a head due in 1000 s; eval-1 (no past runs) may not."""
    layout = Layout(tmp_path)
    layout.ensure()
    history = UsageHistory(layout, WEEK)
    _ended(layout, "a", "train-1", "ana", 1, 0, 100)
    _ended(layout, "a", "train-2", "ana", 1, 200, 500)
    _ended(layout, "a", "failed-1", "ana", 1, 0, 50, to="failed")  # only runs that ended well count
    history.usage(600, {})
    assert history.durations == {kind_of("ana", "train"): [100.0, 300.0]}
    busy = [run("r", gpus=(0,), mem_gib=None, started_at=0, limit_s=1600)]
    pending = [
        job("pair", gpus=2, mem_gib=None, queued_at=1),
        job("train-3", user="ana", mem_gib=None, queued_at=2),
        job("eval-1", user="ana", mem_gib=None, queued_at=3),
    ]
    estimates, running = learned_runs(pending, busy, CFG, history.durations, 600)
    assert estimates == {"train-3": 300.0} and running == busy
    decided = plan(pending, [host("h", gpu(0), gpu(1))], running, CFG, now=600, estimates=estimates)
    assert [s.job_id for s in decided.starts] == ["train-3"]  # ends at 900, before pair (1600)
    running_unlimited = [run("train-4", user="ana", gpus=(0,), mem_gib=None, started_at=0)]
    assert learned_runs([], running_unlimited, CFG, history.durations, 100)[1][0].limit_s == 300.0
    # Longer than any run of its kind: nobody knows when it ends (not "ended 300 s after it began").
    assert learned_runs([], running_unlimited, CFG, history.durations, 600)[1][0].limit_s is None


def test_a_run_stopped_and_put_back_counts_from_when_it_started(tmp_path):
    """A review: a low job's two preempted runs counted no usage (the put-back event has no
    started_at): its start comes from the event that started it."""
    layout = Layout(tmp_path)
    layout.ensure()
    history = UsageHistory(layout, WEEK)
    start = {"job": "lo-1", "attempt": 1, "from": "pending", "to": "running", "user": "carol", "host": "a"}
    with open(layout.host_events("a"), "ab") as f:
        f.write(json.dumps({"t": 1000.0, "by": "a", **start}, separators=(",", ":")).encode() + b"\n")
        back = {**start, "from": "running", "to": "pending", "gpus": [0], "started_at": None, "ended_at": None}
        f.write(
            json.dumps({"t": 1060.0, "by": "a", **back, "cause": "preempted"}, separators=(",", ":")).encode() + b"\n"
        )
    assert history.usage(1060, {})["carol"] == pytest.approx(60, rel=1e-3)
    assert history.started == {}  # nothing kept once the run has ended


@pytest.mark.parametrize("fair_share", [True, False])
def test_an_arrays_members_start_in_index_order(fair_share):
    """A Slurm user's finding: members that share a queue place went by their ids as text,
    so _10 and _11 ran before _2."""
    from dataclasses import replace

    members = [job(f"arr-1_{i}", mem_gib=None) for i in (11, 2, 10, 0, 1)]
    decided = plan(members, [host("h", gpu(0))], [], replace(CFG, fair_share=fair_share), now=1000.0)
    assert decided.order == ["arr-1_0", "arr-1_1", "arr-1_2", "arr-1_10", "arr-1_11"]


def test_gpus_held_by_jobs_that_may_be_taken_back_weigh_nothing_more_than_their_use_so_far():
    """A member's use: cat's two low jobs on idle GPUs each counted as half an hour of use
    more, so her ordinary job ranked behind ben's; the moment they were told to yield she
    ranked first again, and the GPU `status` had shown held for ben's job went to hers. A GPU
    counts as held now only under a job that keeps it: not an opportunistic (preemptible) one,
    which yields to anyone's, nor one told to stop."""
    hosts = [host("h", gpu(0), gpu(1), gpu(2))]
    pending = [job("c-1", user="cat", mem_gib=None, queued_at=0), job("b-1", user="ben", mem_gib=None, queued_at=1)]
    low = [run(f"lo-{i}", gpus=(i,), mem_gib=None, user="cat", low=True, started_at=100) for i in (1, 2)]
    told = [run(j.id, gpus=j.gpus, mem_gib=None, user="cat", started_at=100, stopping=True) for j in low]
    for running in ([], low, told):
        assert plan(pending, hosts, running, CFG, now=100).order == ["c-1", "b-1"]
    held = [run("keeps", gpus=(1,), mem_gib=None, user="cat", started_at=100)]
    assert plan(pending, hosts, held, CFG, now=100).order == ["b-1", "c-1"]  # one she keeps counts
    # Where preemption is off nothing takes a low job's GPU back: it counts (a review: marking
    # one's work preemptible escaped the term).
    no_preemption = replace(CFG, preemption=False)
    assert plan(pending, hosts, low, no_preemption, now=100).order == ["b-1", "c-1"]
