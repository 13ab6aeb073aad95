"""Limits through the real worker on fake GPUs: time limit, host RAM, CPU cores, and GPU
memory above the declaration (warn or kill). Those tests start processes (slow) and see that
a limit is enforced, not where: the decisions themselves are checked at their boundaries
(just under: no stop; over: stop) with plain numbers, at the end (fast)."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

from conftest import PY, REPO, wait_until
from gpuq.model.config import Config
from gpuq.model.record import Record
from gpuq.model.states import State
from gpuq.model.stops import StopCause
from gpuq.run.limits import LimitWatch
from gpuq.sched.overuse import GpuMemWatch

FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"


@pytest.mark.slow
def test_a_job_past_its_time_limit_is_stopped_after_its_grace_and_recorded_as_timeout(queue):
    queue.start_worker("a", "1x80GiB")
    # Ignores SIGTERM (and so does its sleep, which inherits that): only SIGKILL ends it.
    queue.drop("slow.yaml", "command: trap '' TERM; echo started; sleep 60\ngpus: 0\ntime_limit: 1s\ngrace: 1s\n")
    queue.drop(
        "polite.yaml",
        "command: trap 'echo bye; exit 3' TERM; while true; do sleep 0.1; done\ngpus: 0\ntime_limit: 1s\n",
    )
    slow = wait_until(lambda: queue.finished("slow"), timeout=20, what="the time limit to end it")
    assert slow["state"] == "timeout" and slow["signal"] == 9 and slow["time_limit_s"] == 1.0
    assert slow["reason"] == "time limit 1.0s reached"
    assert slow["ended_at"] - slow["started_at"] >= 2  # 1 s limit + 1 s grace
    polite = wait_until(lambda: queue.finished("polite"), timeout=20, what="the polite job to end")
    assert polite["state"] == "timeout" and polite["exit_code"] == 3 and "bye" in queue.log("polite")


@pytest.mark.slow
def test_config_gives_the_default_time_limit(queue):
    queue.write_config(time_limit="1s")
    queue.start_worker("a", "1x80GiB")
    queue.drop("long.yaml", "command: sleep 30\ngpus: 0\n")
    record = wait_until(lambda: queue.finished("long"), timeout=20, what="the default limit")
    assert record["state"] == "timeout" and record["time_limit_s"] == 1.0


@pytest.mark.slow
def test_a_job_over_its_host_memory_is_stopped_with_the_reason(queue):
    queue.start_worker("a", "1x80GiB")
    hog = f"{PY} -c \"import time; b = b'x' * (300 * 2**20); print('holding', flush=True); time.sleep(60)\""
    queue.drop("hog.yaml", f"command: {json.dumps(hog)}\ngpus: 0\nmem: 100MiB\n")
    queue.drop("lean.yaml", "command: echo fine\ngpus: 0\nmem: 100MiB\n")
    record = wait_until(lambda: queue.finished("hog"), timeout=30, what="the memory limit to stop it")
    assert record["state"] == "failed" and record["mem_limit_mib"] == 100
    assert record["reason"].startswith("limit: host memory ") and "above its mem 100MiB" in record["reason"]
    assert wait_until(lambda: queue.finished("lean"))["state"] == "done"


@pytest.mark.slow
def test_cpus_pins_each_job_to_its_own_cores_where_the_host_has_room(queue, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two jobs on distinct cores need a machine with two cores")
    queue.start_worker("a", "2x80GiB")
    barrier = tmp_path / "barrier"  # a directory of its own: only the two jobs write here
    barrier.mkdir()
    # Each job says it started and waits (bounded) for the other: they surely run together.
    show = (
        f"{PY} -c \"import os, pathlib, sys, time; print('cores', sorted(os.sched_getaffinity(0)), flush=True); "
        f"d = pathlib.Path('{barrier}'); (d / sys.argv[1]).touch(); end = time.time() + 60\n"
        f"while len(list(d.iterdir())) < 2 and time.time() < end: time.sleep(0.05)\n"
        f"print('met', len(list(d.iterdir())), flush=True)\""
    )
    for name in ("c1", "c2"):
        queue.drop(f"{name}.yaml", f"command: {json.dumps(show + ' ' + name)}\ngpus: 0\ncpus: 1\n")
    records = [wait_until(lambda n=n: queue.finished(n), timeout=90, what=n) for n in ("c1", "c2")]
    cores = [r["cpu_cores"] for r in records]
    assert all(len(c) == 1 for c in cores)
    for name, c in zip(("c1", "c2"), cores):
        assert f"cores {c}" in queue.log(name) and "met 2" in queue.log(name)  # the barrier held
    assert records[0]["started_at"] < records[1]["ended_at"] and records[1]["started_at"] < records[0]["ended_at"]
    assert cores[0] != cores[1]


@pytest.mark.slow
def test_gpu_memory_above_the_declaration_is_killed_when_config_says_kill(queue):
    queue.write_config(gpu_mem_overuse="kill", gpu_mem_overuse_after_s=1)
    queue.start_worker("a", "1x80GiB")
    queue.drop("greedy.yaml", f"command: {FAKE_USE} --mem 20GiB --seconds 60\ngpus: 1\ngpu_mem: 10GiB\n")
    queue.drop("honest.yaml", f"command: {FAKE_USE} --mem 10GiB --seconds 3\ngpus: 1\ngpu_mem: 10GiB\n")
    greedy = wait_until(lambda: queue.finished("greedy"), timeout=30, what="the overuse to be stopped")
    assert greedy["state"] == "failed"
    assert greedy["reason"] == "limit: uses 20GiB of GPU memory on GPU 0, declared 10GiB (+10% tolerated)"
    assert wait_until(lambda: queue.finished("honest"), timeout=30)["state"] == "done"


@pytest.mark.slow
def test_gpu_memory_above_the_declaration_is_warned_about_once_by_default(queue, tmp_path):
    queue.write_config(gpu_mem_overuse_after_s=1)
    queue.start_worker("a", "1x80GiB")
    go = tmp_path / "go"  # the job holds its memory until the test has seen what it needs
    queue.drop(
        "greedy.yaml",
        f"command: {FAKE_USE} --mem 20GiB -- sh -c 'while [ ! -e {go} ]; do sleep 0.1; done'\n"
        "gpus: 1\ngpu_mem: 10GiB\n",
    )
    shown = wait_until(
        lambda: [r for r in queue.status()["running"] if r["id"] == "greedy" and r["warning"]],
        timeout=20,
        what="status to show the warning",
    )
    assert shown[0]["warning"].startswith("uses 20GiB of GPU memory on GPU 0, declared 10GiB")
    assert "! greedy uses 20GiB" in queue.gpuq("status").stdout
    queue.wait_passes("a", 5)  # passes that see the overuse go on, after the one that warned
    go.touch()
    record = wait_until(lambda: queue.finished("greedy"), timeout=60, what="the job to finish")
    assert record["state"] == "done"
    warnings = [
        e
        for e in queue.events()
        if e["job"] == "greedy" and e.get("note") == "warning" and e["reason"].startswith("uses 20GiB")
    ]
    assert len(warnings) == 1


@pytest.mark.slow
def test_usage_is_sampled_into_the_record_and_show_suggests_a_right_sized_gpu_mem(queue):
    """The job spends a fixed amount of CPU time (its own process_time, not a span of wall time,
    which a loaded box gives less CPU in), so the CPU it must be charged is the same under any load."""
    queue.start_worker("a", "1x80GiB")
    work = (
        f"{FAKE_USE} --mem 6GiB --util 40 --seconds 3 && "
        f"{PY} -c \"b = b'x' * (150 * 2**20); import time\n"
        f'while time.process_time() < 1.5: pass"'
    )
    for n in (1, 2):
        queue.gpuq("submit", "--name", "train", "--gpu-mem", "10GiB", "--", "sh", "-c", work)
        record = wait_until(lambda n=n: queue.finished(f"train-{n}"), timeout=60, what=f"train-{n}")
        assert record["state"] == "done"
    assert record["peak_gpu_mem_mib"] == 6144 and 0 < record["mean_gpu_mem_mib"] <= 6144
    assert 0 < record["mean_gpu_util_pct"] <= 40
    # The tree's CPU time holds the job's 1.5 s, and is CPU time, not the time it ran: one of its
    # processes runs at a time, and fake-use sleeps its 3 s. Its peak in cores is a rate, which
    # the load decides (four busy sessions beside it leave it about 0.4 of a core on two): only sampled.
    ran_s = record["ended_at"] - record["started_at"]
    assert 1.5 <= record["cpu_s"] < ran_s - 2, (record["cpu_s"], ran_s)
    assert record["peak_rss_mib"] >= 150 and record["peak_cpus"] > 0
    shown = queue.gpuq("show", "train-2").stdout
    assert "suggested gpu_mem: 7GiB (peak 6GiB over 2 finished runs of this name, +10%)" in shown, shown  # a space
    assert "peak_rss:" in shown and "mean_gpu_util:" in shown


@pytest.mark.slow
def test_a_supervisor_waits_out_a_grace_without_spinning(queue):
    """Past the fencing check it no longer made, the wait used to wake at once again and again:
    a stopped job that took its grace cost a CPU core for the rest of it."""
    queue.start_worker("a", "1x80GiB")  # lost_after_s 180: a fencing check every 5 s
    # The queue's root in the command: a second copy of the suite beside this one runs a job
    # with the same command, and its supervisor is not this one's.
    mark = f"stubborn-up {queue.root}"
    queue.drop("stubborn.yaml", f"command: trap '' TERM; echo {mark}; sleep 60\ngpus: 0\ntime_limit: 1s\ngrace: 10s\n")
    wait_until(lambda: mark in queue.log("stubborn"), timeout=30, what="the job to start")
    job = wait_until(
        lambda: next((p for p in psutil.process_iter(["cmdline"]) if mark in " ".join(p.info["cmdline"] or [])), None),
        what="the job's process",
    )
    supervisor = job.parent()
    cpu_s, deadline = 0.0, time.monotonic() + 60
    while queue.finished("stubborn") is None and time.monotonic() < deadline:  # until it recorded the end
        try:
            cpu_s = sum(supervisor.cpu_times()[:2])
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)  # a sampling period, not a wait for something
    record = wait_until(lambda: queue.finished("stubborn"), timeout=30, what="the KILL after the grace")
    assert record["state"] == "timeout" and record["signal"] == 9
    assert cpu_s < 2.0, f"the supervisor used {cpu_s:.1f} s of CPU over an 11 s job"


# --- the decisions at their boundaries, with plain numbers ------------------------------------


def _running(**limits: float | int) -> Record:
    return Record(id="j", state=State.RUNNING, spec={}, **limits)  # type: ignore[arg-type]


class _TreeUsing:
    """Stands in for the job's process-tree sampler (host/usage.py): the tree uses `mib`."""

    def __init__(self, mib: int) -> None:
        self.mib = mib

    def sample(self, now: float) -> int:
        return self.mib


def test_a_time_limit_stops_the_job_at_the_limit_and_not_before():
    """The end-to-end test waits for "timeout" and never checks when it came: a limit enforced
    at three times its value would pass it."""
    started = 1000.0  # the supervisor's monotonic clock when the job started
    watch = LimitWatch(_running(time_limit_s=60.0), started)
    assert watch.breach(started + 59.9) is None
    stop = watch.breach(started + 60.0)
    assert stop is not None and stop.cause is StopCause.TIMEOUT, stop
    assert stop.reason == "time limit 1m00s reached"


def test_a_host_memory_limit_stops_the_job_one_mib_above_it_and_not_at_it():
    """`mem`: above it the job is stopped (docs/reference.md). The end-to-end job is far over
    its limit: a limit enforced at twice its value would pass it."""
    started = 1000.0
    watch = LimitWatch(_running(mem_limit_mib=1024), started)
    watch.usage = _TreeUsing(1024)  # type: ignore[assignment]
    assert watch.breach(started + 1.0) is None  # at its limit: sampled, and within it
    watch.usage = _TreeUsing(1025)  # type: ignore[assignment]
    stop = watch.breach(started + 2.0)
    assert stop is not None and stop.cause is StopCause.LIMIT, stop
    assert stop.reason.startswith("limit: host memory ")


def test_gpu_memory_overuse_begins_just_past_the_tolerance():
    """Declared 10,000 MiB with 10% tolerated: 11,000 MiB is within, however long it lasts;
    11,001 is over, and acted on once it has lasted gpu_mem_overuse_after_s."""
    watch = GpuMemWatch(Config(gpu_mem_overuse="kill", gpu_mem_tolerance_pct=10, gpu_mem_overuse_after_s=10.0))
    job = _running(gpu_mem_mib=10_000)
    assert watch.update([job], {"j": {0: 11_000}}, now=0.0) == []
    assert watch.update([job], {"j": {0: 11_000}}, now=100.0) == []  # tolerated however long
    assert watch.update([job], {"j": {0: 11_001}}, now=200.0) == []  # over from now: not yet long enough
    assert watch.update([job], {"j": {0: 11_001}}, now=209.9) == []
    (overuse,) = watch.update([job], {"j": {0: 11_001}}, now=210.0)
    assert overuse.job_id == "j" and overuse.kill
    assert overuse.why.endswith("declared 9.8GiB (+10% tolerated)"), overuse.why
