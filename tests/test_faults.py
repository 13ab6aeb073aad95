"""Faults injected into the real worker.py, spawner and supervisors: crashes at every named
step, dead and frozen hosts (fencing), reboots, cron overlap."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import psutil
import pytest

from conftest import PY, REPO, remove_local_dir, wait_until, worker_argv
from gpuq.host.faults import CANCEL_CRASH_POINTS, CRASH_ENV, CRASH_POINTS, FAULT_LOG_ENV, RECOVERY_CRASH_POINTS
from gpuq.single_instance import _config_may_set_local_dir, _plain_cron_start, holds_lock_at, take_worker_lock
from gpuq.spool.layout import Layout

RUN_LINE = "ran-attempt-"
JOB = f"command: echo {RUN_LINE}$GPUQ_ATTEMPT\ngpus: 1\n"

# What a crash at each point leaves once a fresh worker has settled everything: the final
# state, and how often the job ran. One point cannot do better than "lost": the supervisor
# had marked the attempt as starting, so nobody can prove that it did not start. Where the
# supervisor died after the job ran, the job's keeper kept its exit status (the chaos review:
# such jobs were "lost" before).
EXPECTED = {point: ("done", 1) for point in CRASH_POINTS}
EXPECTED["supervisor:marked"] = ("lost", 0)


# The job's events once a crash at each point is settled: which recoveries may run, and
# nothing else (no "claimed but never recorded" where a record was written, no rejection).
# Where only the spawner or a supervisor died, the worker lives on until the test stops it:
# it may settle and claim the job again meanwhile, so those hops may repeat; the job's one
# run is checked apart (its log).
_START, _DONE = ("pending", "running", None), ("running", "done", None)
_NEVER_STARTED = ("running", "pending", "never started; requeued")
_UNRECORDED_CLAIM = ("note", "requeued", "claimed but never recorded; requeued")  # it never left pending
_LOST = ("running", "lost", "exit unknown: supervisor and job gone without a result")
_KEPT = ("running", "done", "its supervisor died; the job's keeper kept its exit status")
HOPS_AFTER = {  # point -> (the hops allowed before the last event, the last event)
    "worker:planned": ({_START}, _DONE),
    "worker:claimed": ({_START, _UNRECORDED_CLAIM}, _DONE),
    "worker:owned": ({_START, _UNRECORDED_CLAIM}, _DONE),
    "worker:recorded": ({_START, _NEVER_STARTED}, _DONE),
    "worker:sent": ({_START, _NEVER_STARTED}, _DONE),
    "spawner:locked": ({_START, _NEVER_STARTED, _UNRECORDED_CLAIM}, _DONE),
    "supervisor:owned": ({_START, _NEVER_STARTED, _UNRECORDED_CLAIM}, _DONE),
    "supervisor:marked": ({_START}, _LOST),
    "supervisor:exited": ({_START}, _KEPT),
    "supervisor:ended": ({_START}, _KEPT),
    "supervisor:recorded": ({_START}, _DONE),
    "supervisor:cleaned": ({_START}, _DONE),
}
# Where the crash left the attempt provably unstarted, at least one requeue must show. Where
# the worker lives on, the test kills it at any moment, also between a requeue's change of the
# record and its event: the next worker then finishes that requeue from the claim left behind,
# and only its note shows.
_ANY_REQUEUE = {_NEVER_STARTED, _UNRECORDED_CLAIM}
MUST_REQUEUE = {
    "worker:claimed": {_UNRECORDED_CLAIM},
    "worker:owned": {_UNRECORDED_CLAIM},
    "worker:recorded": {_NEVER_STARTED},
    "spawner:locked": _ANY_REQUEUE,
    "supervisor:owned": _ANY_REQUEUE,
}


def _runs(queue, job_id: str) -> list[str]:
    return [line for line in queue.log(job_id).splitlines() if line.startswith(RUN_LINE)]


def _final(queue, job_id: str) -> dict | None:
    record = queue.finished(job_id)
    return record if record and not (queue.root / "state" / "running" / f"{job_id}.json").exists() else None


def fired(fault_log, kind: str, name: str) -> list[int]:
    """Pids of the processes whose fault `kind name` fired (gpuq.host.faults writes the line)."""
    try:
        lines = fault_log.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [int(line.rsplit(" ", 1)[1]) for line in lines if line.rsplit(" ", 1)[0].startswith(f"{kind} {name}")]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_any_step_leaves_a_complete_record_and_no_second_run(queue, point, tmp_path):
    fault_log = tmp_path / "faults"
    worker = queue.start_worker("a", "1x80GiB", env={CRASH_ENV: point, FAULT_LOG_ENV: str(fault_log)})
    queue.drop("job.yaml", JOB)
    # The crash happened, at that point, and killed the process that reached it: without this,
    # a point that never fires would pass (its outcome is what a run without a crash gives).
    pids = wait_until(lambda: fired(fault_log, "crash", point), what=f"the crash at {point}")
    wait_until(lambda: gone(pids[0]), what=f"the process that reached {point} to die")
    beat = json.loads((queue.root / "state" / "workers" / "a.json").read_text())
    if point.startswith("worker:"):  # the worker died, and its starter with it, as the worker did
        worker.wait(timeout=20)
        assert worker.returncode == -signal.SIGKILL and pids == [beat["pid"]], (pids, beat["pid"])
    else:  # the spawner or a supervisor died; the worker lives on: stop it as a crash would
        assert pids[0] not in (worker.pid, beat["pid"])
        queue.kill_worker("a")
    # Settled by the worker just killed: its event, if it did not append it before the kill,
    # never comes (no process of that attempt is left), so it is not waited for.
    settled_before_restart = _final(queue, "job") is not None
    queue.start_worker("a", "1x80GiB")  # as cron would, without the fault
    record = wait_until(lambda: _final(queue, "job"), timeout=120, what=f"job to be settled after a crash at {point}")
    state, runs = EXPECTED[point]
    assert record["state"] == state and len(_runs(queue, "job")) == runs, (record, queue.log("job"))
    if runs:
        assert _runs(queue, "job") == [f"{RUN_LINE}{record['attempt']}"]
    if state == "lost":
        assert "exit unknown" in record["reason"]
    events = settled_events(queue, wait=not settled_before_restart)
    allowed, last = HOPS_AFTER[point]  # the recovery took only paths its point calls for
    if events[-1][1] not in ("done", "lost") and point.startswith("supervisor:"):
        # The live worker settled the attempt and was killed (as the test kills it, at any
        # moment) between the record and its event (docs/protocol.md: the record first): the
        # record says which path the recovery took.
        assert ("running", record["state"], record.get("reason")) == last and set(events) <= allowed, events
    else:
        assert events[-1] == last and set(events[:-1]) <= allowed and events.count(last) == 1, events
    assert point not in MUST_REQUEUE or MUST_REQUEUE[point] & set(events), events
    assert_nothing_left(queue)


def settled_events(queue, wait: bool = True) -> list[tuple]:
    """The job's events, once its final one is there: the supervisor appends it after the
    finished record (a loaded run read the log in between and missed it). `wait=False`: as
    they are now (whoever could append more is gone)."""

    def events() -> list[tuple]:
        return [
            ("note", e["note"], e.get("reason")) if "note" in e else (e["from"], e["to"], e.get("reason"))
            for e in queue.events()
            if e["job"] == "job"
        ]

    if not wait:
        return events()
    try:
        return wait_until(
            lambda: (ev := events()) and ev[-1][1] in ("done", "lost") and ev, timeout=90, what="the job's final event"
        )
    except AssertionError:
        return events()  # the assertions after show what is there


def assert_nothing_left(queue) -> None:
    """Nothing of the job left behind once the worker has settled it (a pass or two after the
    record): waited for, not slept on, so that a loaded machine's slow pass is not a failure."""
    left = lambda: {
        d: list((queue.root / d).glob("job*"))  # noqa: E731
        for d in ("jobs", "state/claims", "state/running", "state/requeued", "state/rejected")
    }
    try:
        wait_until(lambda: not any(left().values()), timeout=20, what="nothing left behind")
    except AssertionError:
        assert not any(left().values()), left()


@pytest.mark.slow
@pytest.mark.parametrize("torn", [False, True], ids=["no-record", "torn-record"])
def test_a_box_that_died_between_claim_and_start_gives_its_claim_back_when_forgotten(queue, tmp_path, torn):
    """Box a dies for good right after a claim: before the record, or (`torn`) after it, the
    record's data lost in a power cut (a start's record is written without an fsync: the
    job never started). Nobody else may start the claimed spec while a could come back and
    go on; `gpuq forget a`, an admin's word that it will not, puts it back, and b runs it once."""
    fault_log = tmp_path / "faults"
    point = "worker:recorded" if torn else "worker:claimed"
    queue.write_config(lost_after_s=5, grace_s=1)
    worker = queue.start_worker("a", "1x80GiB", env={CRASH_ENV: point, FAULT_LOG_ENV: str(fault_log)})
    queue.drop("job.yaml", JOB)
    assert wait_until(lambda: fired(fault_log, "crash", point)) == [queue.worker_pid("a")]
    worker.wait(timeout=20)
    record = queue.root / "state" / "running" / "job.json"
    if torn:
        record.write_bytes(b"")  # what a power cut leaves of a file written without an fsync
    queue.start_worker("b", "1x80GiB")
    wait_until(
        lambda: not any(h["alive"] for h in queue.status()["hosts"] if h["host"] == "a"),
        timeout=60,
        what="a to be seen dead",
    )
    assert [p.name.split("@")[:2] for p in (queue.root / "state" / "claims").iterdir()] == [["job", "a"]]
    assert record.exists() == torn and not (queue.root / "jobs" / "job.yaml").exists()
    if not torn:
        shown = queue.gpuq("show", "job").stdout
        assert "claimed by a, whose worker stopped before starting it" in shown and "gpuq forget a" in shown, shown
    done = queue.gpuq("forget", "a")
    assert "1 job(s) it had claimed but never started are back in the queue (job)" in done.stdout, done.stdout
    final = wait_until(lambda: _final(queue, "job"), timeout=60, what="b to run it")
    assert (final["state"], final["host"], final["attempt"]) == ("done", "b", 1), final
    assert _runs(queue, "job") == [f"{RUN_LINE}1"]
    assert_nothing_left(queue)


@pytest.mark.slow
@pytest.mark.parametrize("point", RECOVERY_CRASH_POINTS)
def test_a_crash_in_the_middle_of_a_requeue_is_finished_by_the_next_worker(queue, point, tmp_path):
    """The supervisor dies before it marks the attempt as starting (so it provably never
    started); the worker, requeueing it, dies at `point`; the next worker must finish the
    requeue and run the job once (a crash at recovery:held once left it stuck for good)."""
    fault_log = tmp_path / "faults"
    worker = queue.start_worker(
        "a", "1x80GiB", env={CRASH_ENV: f"supervisor:owned,{point}", FAULT_LOG_ENV: str(fault_log)}
    )
    queue.drop("job.yaml", JOB)
    assert wait_until(lambda: fired(fault_log, "crash", point), what=f"the crash at {point}") == [queue.worker_pid("a")]
    worker.wait(timeout=20)
    assert worker.returncode == -signal.SIGKILL and len(fired(fault_log, "crash", "supervisor:owned")) == 1
    queue.start_worker("a", "1x80GiB")  # as cron would, without the fault
    record = wait_until(lambda: _final(queue, "job"), timeout=120, what=f"job to be settled after a crash at {point}")
    assert record["state"] == "done" and record["attempt"] == 2, record
    assert _runs(queue, "job") == [f"{RUN_LINE}2"], queue.log("job")
    events = settled_events(queue)
    assert set(events[:-1]) <= {_START, _NEVER_STARTED, _UNRECORDED_CLAIM} and events[-1] == _DONE, events
    assert_nothing_left(queue)


# What the spool shows while the process that reached each point is paused there (SIGSTOP):
# the point is where its name says, not merely somewhere a crash happens to end the same way.
# (spec in jobs/, a claim, running record, finished record, `started` marker, the job ran)
AT_POINT = {
    "worker:planned": (True, False, False, False, False, False),
    "worker:claimed": (False, True, False, False, False, False),
    "worker:owned": (False, True, False, False, False, False),
    "worker:recorded": (False, True, True, False, False, False),
    "spawner:locked": (False, True, True, False, False, False),
    "supervisor:owned": (False, True, True, False, False, False),
    "supervisor:marked": (False, True, True, False, True, False),
    "supervisor:exited": (False, True, True, False, True, True),
    "supervisor:ended": (False, True, True, False, True, True),
    "supervisor:recorded": (False, True, False, True, True, True),
    "supervisor:cleaned": (False, False, False, True, False, True),
}
WHO = {
    "worker": "the worker",
    "spawner": "the spawner (the worker's child)",
    "supervisor": "a supervisor (the spawner's child)",
}


def _spool_now(queue) -> tuple[bool, ...]:
    lock = queue.local_base / "a" / "jobs" / "job.lock"
    marker = lock.exists() and lock.stat().st_size > 0
    return (
        (queue.root / "jobs" / "job.yaml").exists(),
        bool(list((queue.root / "state" / "claims").glob("job@*"))),
        (queue.root / "state" / "running" / "job.json").exists(),
        (queue.root / "state" / "finished" / "job.json").exists(),
        marker,
        bool(_runs(queue, "job")),
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", [*AT_POINT, "worker:sent"])
def test_each_crash_point_is_where_its_name_says(queue, point, tmp_path):
    fault_log = tmp_path / "faults"
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_PAUSE_AT": point, FAULT_LOG_ENV: str(fault_log)})
    queue.drop("job.yaml", JOB)
    (pid,) = wait_until(lambda: fired(fault_log, "pause", point), what=f"the pause at {point}")
    paused = psutil.Process(pid)
    wait_until(lambda: paused.status() == psutil.STATUS_STOPPED, what=f"{point}'s process to stop")
    parent, worker_pid = paused.ppid(), queue.worker_pid("a")
    role = "worker" if pid == worker_pid else "spawner" if parent == worker_pid else "supervisor"
    assert role == point.split(":")[0], f"{point} was reached by {WHO[role]}"
    if point == "worker:sent":  # sent: the spawner and a supervisor run the job while the worker waits
        wait_until(lambda: _spool_now(queue)[3], what="the job, sent before the pause, to be recorded")
        assert _runs(queue, "job") and not (queue.root / "jobs" / "job.yaml").exists()
        return
    assert _spool_now(queue) == AT_POINT[point], (point, _spool_now(queue))


@pytest.mark.slow
def test_a_gpu_is_free_for_the_next_job_once_the_job_ended_while_its_result_is_written(queue, tmp_path):
    """The supervisor marks its job as ended before it writes the result: the worker starts
    the next job on that GPU at once (the record write is off the slot's path), and the first
    job is recorded as usual afterwards. Paused between the two, the next job has started."""
    fault_log = tmp_path / "faults"
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_PAUSE_AT": "supervisor:ended", FAULT_LOG_ENV: str(fault_log)})
    queue.drop("first.yaml", "command: echo first\ngpus: 1\n")
    (pid,) = wait_until(lambda: fired(fault_log, "pause", "supervisor:ended"), what="first's supervisor to pause")
    queue.drop("second.yaml", "command: sleep 60\ngpus: 1\n")
    second = wait_until(
        lambda: (r := queue.record("second")) and r.get("state") == "running" and r, what="second to start"
    )
    assert second["gpus"] == [0]
    first = queue.record("first")
    assert first["state"] == "running" and not queue.finished("first"), first  # still being recorded
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: (queue.finished("first") or {}).get("state") == "done", what="first to be recorded")
    assert "first" in queue.log("first")


@pytest.mark.slow
def test_a_reboot_requeues_running_jobs_as_their_next_attempt(queue):
    queue.drop("long.yaml", "command: echo attempt-$GPUQ_ATTEMPT; sleep 60\ngpus: 1\n")
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_BOOT_ID": "boot-one"})
    wait_until(lambda: (queue.record("long") or {}).get("state") == "running", what="long to start")
    queue.stop_worker("a", signal.SIGKILL)
    queue.close_jobs()  # the machine went down with everything on it
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_BOOT_ID": "boot-two"})
    wait_until(lambda: "attempt-2" in queue.log("long"), what="attempt 2 after the reboot")
    # Its supervisor's header names the attempt it runs (once a test of retry's, test_workflow.py).
    assert "==> gpuq job long · attempt 2 · host a · " in queue.log("long")
    events = [e for e in queue.events() if e["job"] == "long" and e.get("to") == "pending"]
    assert events and "host rebooted; requeued as attempt 2" in events[-1]["reason"]


def _power_cut_before_the_sync(queue, fault_log, boot: str, left: str, job_id: str = "job") -> None:
    """The worker wrote job_id's start record (no fsync: its supervisor syncs it) and the box
    lost power before the supervisor ran: a SIGKILL at worker:recorded, then the record's
    data gone as a power cut can leave it, then a new boot."""
    wait_until(lambda: fired(fault_log, "crash", "worker:recorded"), what="the worker to die at worker:recorded")
    queue.workers["a"].wait(timeout=20)
    queue.close_jobs()
    (queue.root / "state" / "running" / f"{job_id}.json").write_text(left)
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_BOOT_ID": boot})


@pytest.mark.slow
@pytest.mark.parametrize("left", ["", '{"attempt":1,"claim":"job@a@boot-one'], ids=["empty", "torn"])
def test_a_start_record_a_power_cut_emptied_is_put_back_as_never_recorded(queue, tmp_path, left: str):
    """A power cut between a start's record (written without an fsync) and its supervisor's
    sync may leave it empty or torn beside its claim. The rebooted worker runs the job (before,
    the file's existence made it leave the claim alone: the job waited for ever, neither
    pending nor running)."""
    fault_log = tmp_path / "faults"
    env = {"GPUQ_TEST_BOOT_ID": "boot-one", CRASH_ENV: "worker:recorded", FAULT_LOG_ENV: str(fault_log)}
    queue.start_worker("a", "1x80GiB", env=env)
    queue.drop("job.yaml", JOB)
    _power_cut_before_the_sync(queue, fault_log, "boot-two", left)
    record = wait_until(lambda: _final(queue, "job"), what="job to run after the reboot")
    assert record["state"] == "done" and record["boot_id"] == "boot-two", record
    assert _runs(queue, "job") == [f"{RUN_LINE}1"]  # it had never run
    assert_nothing_left(queue)  # waited for: its supervisor removes the claim after the record
    notes = [e for e in queue.events() if e["job"] == "job" and e.get("note") == "requeued"]
    assert notes and "never recorded" in notes[-1]["reason"], notes


@pytest.mark.slow
def test_a_power_cut_before_the_sync_keeps_the_attempts_number(queue, tmp_path):
    """Attempt 2 (after a reboot took attempt 1) loses its start record to a power cut before
    its supervisor synced it: it runs as attempt 2 again, not as a first attempt with its
    retries anew (the attempt kept in requeued/ goes only once the record is synced)."""
    fault_log = tmp_path / "faults"
    queue.drop("job.yaml", f"command: echo {RUN_LINE}$GPUQ_ATTEMPT; sleep 60\ngpus: 1\n")
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_BOOT_ID": "boot-one"})
    wait_until(lambda: _runs(queue, "job") == [f"{RUN_LINE}1"], what="attempt 1 to run")
    queue.stop_worker("a", signal.SIGKILL)
    queue.close_jobs()  # a reboot: attempt 1 is lost, attempt 2 is claimed and recorded
    env = {"GPUQ_TEST_BOOT_ID": "boot-two", CRASH_ENV: "worker:recorded", FAULT_LOG_ENV: str(fault_log)}
    queue.start_worker("a", "1x80GiB", env=env, wait=False)  # it dies in its first pass
    _power_cut_before_the_sync(queue, fault_log, "boot-three", "")
    wait_until(lambda: len(_runs(queue, "job")) == 2, what="the job to run after the second reboot")
    assert _runs(queue, "job") == [f"{RUN_LINE}1", f"{RUN_LINE}2"]
    assert queue.record("job")["attempt"] == 2


@pytest.mark.slow
def test_a_reboot_with_no_retries_left_records_the_job_as_lost(queue):
    queue.drop("once.yaml", "command: sleep 60\ngpus: 1\nretries: 0\n")
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_BOOT_ID": "boot-one"})
    wait_until(lambda: (queue.record("once") or {}).get("state") == "running", what="once to start")
    queue.stop_worker("a", signal.SIGKILL)
    queue.close_jobs()
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_BOOT_ID": "boot-two"})
    record = wait_until(lambda: queue.finished("once"), what="once to be settled")
    assert record["state"] == "lost" and "no retries left" in record["reason"]


def _host_processes(queue, host: str) -> list[psutil.Process]:
    """Host `host`'s gpuq processes: its starter, worker, spawner, supervisors and keepers (its
    jobs are left alone). The keepers are the starter's children, in sessions of their own."""
    starter = psutil.Process(queue.workers[host].pid)
    ours = ("worker.py", "gpuq.run.spawner", "gpuq.worker_run")
    found = [starter]
    for p in starter.children(recursive=True):
        try:
            if any(mark in " ".join(p.cmdline()) for mark in ours):
                found.append(p)
        except psutil.Error:
            pass
    return found


# Each marker is written beside its name and renamed in: a test that sees the name reads the
# whole value (`date > f` creates f empty first, and a loaded machine's test read it so).
FLAKY_FIRST = (
    "command: |\n  echo $$ > {pids}/.pid && mv {pids}/.pid {pids}/pid-$GPUQ_ATTEMPT\n"
    "  if [ $GPUQ_ATTEMPT = 1 ]; then trap 'date +%s.%N > {pids}/.stopped && "
    "mv {pids}/.stopped {pids}/stopped-1; exit 143' TERM;"
    " while true; do sleep 0.05; done; fi\n"
    "  date +%s.%N > {pids}/.started && mv {pids}/.started {pids}/started-$GPUQ_ATTEMPT\n"
    "gpus: 1\n"
)


@pytest.mark.slow
def test_a_frozen_host_is_taken_over_and_its_stale_copy_fenced(queue, tmp_path):
    queue.write_config(lost_after_s=6, grace_s=1)
    queue.start_worker("a", "1x80GiB")
    queue.drop("job.yaml", FLAKY_FIRST.format(pids=tmp_path))
    wait_until(lambda: (tmp_path / "pid-1").exists(), what="attempt 1 on a")
    stale_job = int((tmp_path / "pid-1").read_text())
    queue.start_worker("b", "1x80GiB")
    frozen = _host_processes(queue, "a")
    for p in frozen:
        p.suspend()  # SIGSTOP: the box hangs; its job process keeps running
    record = wait_until(lambda: queue.finished("job"), timeout=40, what="b to take over and run attempt 2")
    assert record["state"] == "done" and record["host"] == "b" and record["attempt"] == 2
    assert psutil.pid_exists(stale_job)
    for p in frozen:
        p.resume()
    wait_until(lambda: not psutil.pid_exists(stale_job), timeout=10, what="a's stale copy to be killed")
    # Whichever a's supervisor sees first on waking: its own stale lease, or the takeover. It says
    # so once it has settled the stale copy; then a has written nothing.
    fenced = r"result is not recorded \(fenced: (another host took this job over|this host's heartbeat is \d+ s old)"
    wait_until(lambda: re.search(fenced, queue.log("job")), what="a's supervisor to fence its copy")
    assert queue.finished("job") == record  # a wrote nothing


@pytest.mark.slow
def test_a_host_that_cannot_renew_its_heartbeat_stops_its_jobs_before_takeover(queue, tmp_path):
    queue.write_config(lost_after_s=10, grace_s=1)  # margins that a loaded machine keeps
    queue.start_worker("a", "1x80GiB")
    queue.drop("job.yaml", FLAKY_FIRST.format(pids=tmp_path))
    wait_until(lambda: (tmp_path / "pid-1").exists(), what="attempt 1 on a")
    queue.start_worker("b", "1x80GiB")
    queue.worker_process("a").suspend()  # only the worker: no more heartbeats
    wait_until(lambda: (tmp_path / "started-2").exists(), timeout=40, what="attempt 2 elsewhere")
    stopped = float((tmp_path / "stopped-1").read_text())
    assert stopped < float((tmp_path / "started-2").read_text())  # never two copies at once
    queue.worker_process("a").resume()
    record = wait_until(lambda: queue.finished("job"), what="attempt 2 to be recorded")
    assert record["state"] == "done" and record["attempt"] == 2


@pytest.mark.slow
def test_cron_overlap_starts_exactly_one_worker_and_jobs_do_not_inherit_its_lock(queue):
    starts = [
        subprocess.Popen(
            worker_argv(queue.root, "a", "1x80GiB", "--foreground"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=queue.env(),
        )
        for _ in range(20)
    ]
    wait_until(lambda: sum(p.poll() is None for p in starts) == 1, timeout=30, what="all but one to exit")
    assert all(p.returncode == 0 for p in starts if p.poll() is not None)
    (survivor,) = [p for p in starts if p.poll() is None]
    queue.workers["a"] = survivor
    queue.drop("fds.yaml", "command: ls -l /proc/self/fd/\ngpus: 0\n")
    wait_until(lambda: queue.finished("fds"), what="fds to run")
    assert "worker.lock" not in queue.log("fds") and queue.finished("fds")["state"] == "done"


@pytest.mark.slow
def test_a_cron_start_that_finds_its_worker_leaves_before_loading_gpuq(queue):
    """With local_dir at its default, the every-minute start answers from the lock alone:
    no argparse, PyYAML or worker code is imported (what keeps 20 overlapping starts cheap)."""
    config = queue.root / "config.yaml"
    config.write_text(config.read_text().replace("local_dir:", "# local_dir was:") + "local_dir:  # default\n")
    default_dir = Layout(queue.root.resolve()).default_local_dir("a")
    try:
        queue.start_worker("a", "1x80GiB")
        assert (default_dir / "worker.lock").exists()
        start = subprocess.run(
            [
                PY,
                "-X",
                "importtime",
                str(REPO / "worker.py"),
                "--root",
                str(queue.root),
                "--host",
                "a",
                "--fake-gpus",
                "1x80GiB",
                "--foreground",
            ],
            capture_output=True,
            text=True,
            env=queue.env(),
            timeout=30,
        )
        imported = {line.split("|")[-1].strip() for line in start.stderr.splitlines()}
        assert start.returncode == 0 and "gpuq.single_instance" in imported
        assert not imported & {"gpuq.worker_main", "yaml", "argparse", "filelock"}
        queue.stop_worker("a")
    finally:
        remove_local_dir(default_dir)


@pytest.mark.parametrize(
    "text, may_set",
    [
        (None, False),
        ("", False),
        ("local_dir:\n", False),
        ("local_dir:   # the default\n", False),
        ("# local_dir: /var/tmp/x\n", False),
        ("grace_s: 5\n", False),
        ("local_dir: /var/tmp/gpuq-{host}\n", True),
        ("{local_dir: /x}\n", True),
        ("local_dir: null\n", True),
        ("local_dir:\n  /var/tmp/x-{host}\n", True),  # its value on the next line
        ('"local\\x5fdir": /var/tmp/x\n', True),  # the key spelt with an escape
        ("local_dir:\n# a comment\ngrace_s: 5\n", False),
    ],
)
def test_the_cron_fast_path_trusts_only_a_config_that_surely_keeps_the_default_local_dir(tmp_path, text, may_set):
    path = tmp_path / "config.yaml"
    if text is not None:
        path.write_text(text)
    assert _config_may_set_local_dir(str(path)) is may_set


@pytest.mark.parametrize(
    "argv, read",
    [
        (["--root", "/q", "--host", "a", "--foreground"], {"--root": "/q", "--host": "a", "--foreground": ""}),
        (["--root=/q", "--fake-gpus", "2x8GiB"], {"--root": "/q", "--fake-gpus": "2x8GiB"}),
        (["--host", "b", "--host", "a"], None),  # argparse takes the last: the scan does not guess
        (["--root", "/q2", "--root=/q3"], None),
        (["--root", "/q", "stray"], None),  # argparse's error, from the full start
        (["--host", "a", "--root"], None),  # no value
        (["--root="], None),
        (["--root", "--host"], None),
        (["--fore"], None),  # an abbreviation argparse would take
        (["--verbose"], None),
    ],
)
def test_the_cron_scan_reads_only_what_argparse_would_read_the_same(argv, read):
    assert _plain_cron_start(argv) == read


def test_a_handed_lock_is_checked_against_the_lock_file_there(tmp_path):
    fd = take_worker_lock(str(tmp_path / "worker.lock"))
    assert fd is not None and holds_lock_at(fd, str(tmp_path / "worker.lock"))
    (tmp_path / "other").mkdir()
    assert not holds_lock_at(fd, str(tmp_path / "other" / "worker.lock"))  # none there
    (tmp_path / "other" / "worker.lock").touch()
    assert not holds_lock_at(fd, str(tmp_path / "other" / "worker.lock"))
    os.close(fd)


@pytest.mark.slow  # (no "local_dir" in its name: the temp paths in the value's line would show the scan)
def test_a_config_the_cron_scan_misreads_still_means_one_worker(queue):
    """A config whose local_dir the early scan cannot see (its value on the next line): the fast
    path locks the default directory, and the worker it hands that lock to must notice and
    take the lock its config names; else a second start, which reads the config, runs a
    second worker for the same root and host."""
    lines = [line for line in (queue.root / "config.yaml").read_text().splitlines() if not line.startswith("local_dir")]
    configured = queue.local_base / "{host}"
    (queue.root / "config.yaml").write_text("\n".join(lines) + f"\nlocal_dir:\n  {json.dumps(str(configured))}\n")
    default_dir = Layout(queue.root.resolve()).default_local_dir("a")
    try:
        queue.start_worker("a", "1x80GiB")
        wait_until(lambda: (queue.local_base / "a" / "worker.lock").exists(), what="the worker's lock")
        second = subprocess.run(
            [*worker_argv(queue.root, "a", "1x80GiB"), "--verbose", "--once"],
            capture_output=True,
            text=True,
            env=queue.env(),
            timeout=60,
        )
        assert second.returncode == 0 and "a worker already runs for a" in second.stderr, second.stderr[-2000:]
        queue.stop_worker("a")
    finally:
        remove_local_dir(default_dir)


def _drop_many(queue, n: int, command: str = "echo once") -> list[str]:
    jobs = queue.root / "jobs"
    ids = [f"t{i:04d}" for i in range(n)]
    for job_id in ids:  # written aside, then renamed in: a worker never sees half a file
        (jobs / f".{job_id}.tmp").write_text(f"command: {command}\ngpus: 1\ngpu_mem: 1GiB\n")
        os.rename(jobs / f".{job_id}.tmp", jobs / f"{job_id}.yaml")
    return ids


def _assert_each_ran_once(queue, ids: list[str]) -> None:
    finished = queue.root / "state" / "finished"
    try:
        wait_until(
            lambda: all((finished / f"{i}.json").exists() for i in ids),
            timeout=300,
            interval=0.5,
            what=f"{len(ids)} jobs to finish",
        )
    except AssertionError:  # which jobs, and where each is: a rare stall must leave its trail
        left = [i for i in ids if not (finished / f"{i}.json").exists()]
        where = {i: json.loads(queue.gpuq("show", i, "--json", check=False).stdout or "{}") for i in left[:5]}
        raise AssertionError(f"{len(left)} of {len(ids)} jobs never finished: {where}") from None
    states = {i: json.loads((finished / f"{i}.json").read_text())["state"] for i in ids}
    assert set(states.values()) == {"done"}
    runs = {i: queue.log(i).splitlines().count("once") for i in ids}
    assert {i: n for i, n in runs.items() if n != 1} == {}
    for d in ("jobs", "state/claims", "state/running"):  # a killed writer's temp files may stay
        assert [n for n in os.listdir(queue.root / d) if not n.endswith(".tmp")] == [], d


HOSTS = ("a", "b", "c", "d")


@pytest.mark.long
@pytest.mark.slow
def test_each_job_runs_exactly_once_while_workers_are_killed_and_restarted(queue):
    """Four workers race for 1,000 specs (between kills they claim side by side, as four live
    boxes do: this is also the test that no two live workers run a job twice) while one of them
    is killed and restarted every moment."""
    import random

    ids = _drop_many(queue, 1000)
    for host in HOSTS:  # side by side: each one's first pass reads the 1,000 specs
        queue.start_worker(host, "2x80GiB", wait=False)
    for host in HOSTS:
        queue.wait_started(host)
    finished = queue.root / "state" / "finished"
    rng = random.Random(7)
    kills = 0
    while kills < 200:
        time.sleep(0.2)
        if len(os.listdir(finished)) >= len(ids):
            break
        host = rng.choice(HOSTS)  # killed while jobs remain: only such kills are counted
        queue.stop_worker(host, signal.SIGKILL)
        queue.start_worker(host, "2x80GiB", wait=False)  # cron, a moment later (a kill may meet it starting)
        kills += 1
    # The faults really happened while jobs ran. How many fit depends on the machine's speed,
    # not on correctness: a few do (on an idle 2-core box 197 came before the 1,000th job
    # ended; on a loaded one all 200 come with a few hundred done, and four live workers then
    # race for the rest). 2,000 jobs proved no more and cost the suite 40 s of CPU.
    assert kills >= 3
    _assert_each_ran_once(queue, ids)


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@pytest.mark.slow
def test_a_disk_that_refuses_running_records_loses_no_spec_and_no_worker(queue, tmp_path):
    fault_log = tmp_path / "faults"
    worker = queue.start_worker(
        "a", "1x80GiB", env={"GPUQ_TEST_IO_FAULT": "write:running=ENOSPC", FAULT_LOG_ENV: str(fault_log)}
    )
    queue.drop("job.yaml", JOB)
    wait_until(
        lambda: len(fired(fault_log, "io", "write:running ENOSPC")) >= 3,
        what="several passes, each refused the running record",
    )
    # Each pass claims the spec (it leaves jobs/ for claims/) and puts it back when the record
    # is refused: the assertion waits for it to be back, not for a moment between passes.
    wait_until(lambda: (queue.root / "jobs" / "job.yaml").exists(), what="the spec back in jobs/")
    assert _alive(worker)
    assert [n for n in os.listdir(queue.root / "state" / "running") if not n.endswith(".tmp")] == []
    queue.stop_worker("a")
    queue.start_worker("a", "1x80GiB")  # space was freed
    record = wait_until(lambda: _final(queue, "job"), what="job to run once the disk takes records")
    assert record["state"] == "done" and len(_runs(queue, "job")) == 1


@pytest.mark.slow
def test_a_start_record_the_disk_will_not_sync_never_starts_its_job(queue, tmp_path):
    """The worker writes a start's record without an fsync and the job's supervisor syncs it
    before the start: refused, the job does not start (a power cut could take a record it
    ran under) and the attempt is requeued as never started; once the disk syncs, it runs once."""
    fault_log = tmp_path / "faults"
    worker = queue.start_worker(
        "a", "1x80GiB", env={"GPUQ_TEST_IO_FAULT": "fsync:running=EIO", FAULT_LOG_ENV: str(fault_log)}
    )
    queue.drop("job.yaml", JOB)
    wait_until(lambda: len(fired(fault_log, "io", "fsync:running EIO")) >= 2, what="two starts refused")
    wait_until(
        lambda: any("never started" in (e.get("reason") or "") for e in queue.events() if e["job"] == "job"),
        what="the attempt requeued as never started",
    )
    assert _runs(queue, "job") == [] and _alive(worker)
    queue.stop_worker("a")
    queue.start_worker("a", "1x80GiB")  # the disk syncs again
    record = wait_until(lambda: _final(queue, "job"), what="job to run once the disk syncs")
    assert record["state"] == "done" and len(_runs(queue, "job")) == 1


@pytest.mark.slow
def test_a_result_the_disk_refused_is_kept_and_recorded_once_it_can_be(queue, tmp_path):
    fault_log = tmp_path / "faults"
    worker = queue.start_worker(
        "a", "1x80GiB", env={"GPUQ_TEST_IO_FAULT": "write:finished=EIO", FAULT_LOG_ENV: str(fault_log)}
    )
    queue.drop("job.yaml", "command: echo once; exit 3\ngpus: 1\n")
    wait_until(lambda: "==> exit 3" in queue.log("job"), what="the job to end")
    wait_until(lambda: fired(fault_log, "io", "write:finished EIO"), what="the result refused by the disk")
    queue.wait_passes("a")
    # Not recorded yet, nor lost (the worker's own writes to finished/ meet the same EIO: what
    # proves the result was kept is the record after the restart below, with the job's exit 3).
    assert _alive(worker) and queue.finished("job") is None
    assert (queue.record("job") or {}).get("state") == "running"
    queue.stop_worker("a")
    queue.start_worker("a", "1x80GiB")
    record = wait_until(lambda: _final(queue, "job"), what="the kept result to be recorded")
    assert record["state"] == "failed" and record["exit_code"] == 3
    assert queue.log("job").splitlines().count("once") == 1


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["write:log=ENOSPC", "write:workers=EIO", "rename:claim=ENOENT"])
def test_jobs_run_once_through_log_heartbeat_and_lost_reply_faults(queue, fault, tmp_path):
    fault_log, runs = tmp_path / "faults", tmp_path / "runs"
    # (not start_worker: with heartbeats refused, there is no heartbeat to wait for)
    worker = queue.workers["a"] = subprocess.Popen(
        worker_argv(queue.root, "a", "1x80GiB", "--foreground"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**queue.env(), "GPUQ_TEST_IO_FAULT": fault, FAULT_LOG_ENV: str(fault_log)},
    )
    # Runs are counted outside the log, which the write:log fault keeps from being written.
    queue.drop("job.yaml", f"command: echo once; echo once >> {runs}\ngpus: 1\n")
    record = wait_until(lambda: _final(queue, "job"), what=f"job to run despite {fault}")
    site, errno_name = fault.split("=")
    assert fired(fault_log, "io", f"{site} {errno_name}"), f"{fault} never fired"
    assert record["state"] == "done" and _alive(worker)
    assert runs.read_text() == "once\n"
    if site == "write:workers":
        assert not (queue.root / "state" / "workers" / "a.json").exists()  # no heartbeat was written
    if site == "write:log":
        # The supervisor's lines were refused (the header is the job's own process's, before
        # its command; its output is its own).
        assert "==> exit" not in queue.log("job") and "once" in queue.log("job")
    # The supervisor removes the claim just after writing the record (a crash in between
    # leaves it to recovery): it goes, but not necessarily before we look.
    wait_until(lambda: os.listdir(queue.root / "state" / "claims") == [], timeout=10, what="the claim to go")


@pytest.mark.slow
def test_hosts_with_clocks_ten_minutes_apart_neither_take_over_nor_stall(queue):
    # Clocks judged by the wall would make each box dead to the other at once (600 s > any
    # lost_after_s). 15 s, not 6: with eight tests at once on two cores (two copies of the
    # suite in four processes each) j0 once did not end within 60 s, most likely fenced by its
    # supervisor over a heartbeat 3.6 s old (0.6 x 6 s) while the box was starved.
    queue.write_config(lost_after_s=15, grace_s=1)
    queue.start_worker("a", "1x80GiB", env={"GPUQ_TEST_CLOCK_SHIFT_S": "-600"})
    queue.start_worker("b", "1x80GiB", env={"GPUQ_TEST_CLOCK_SHIFT_S": "600"})
    for i in range(6):
        queue.drop(f"j{i}.yaml", "command: sleep 3; echo once\ngpus: 1\n")
    beats = {h: json.loads((queue.root / "state" / "workers" / f"{h}.json").read_text())["t"] for h in "ab"}
    assert 1100 < beats["b"] - beats["a"] < 1300, beats  # the clocks really are 20 minutes apart
    for i in range(6):
        record = wait_until(lambda i=i: _final(queue, f"j{i}"), timeout=60, what=f"j{i} to run")
        assert record["state"] == "done" and record["attempt"] == 1
        assert queue.log(f"j{i}").splitlines().count("once") == 1
    assert not [e for e in queue.events() if e.get("to") == "pending"]  # nothing was taken over
    assert {queue.finished(f"j{i}")["host"] for i in range(6)} == {"a", "b"}


@pytest.mark.slow
def test_the_worker_refuses_a_local_dir_on_a_network_file_system(queue, tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {queue.local_base} rw - nfs4 server:/export rw\n"
    )
    result = subprocess.run(
        [PY, str(REPO / "worker.py"), "--root", str(queue.root), "--host", "a", "--fake-gpus", "1x80GiB", "--once"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**queue.env(), "GPUQ_TEST_MOUNTINFO": str(mountinfo)},
    )
    assert result.returncode == 2
    assert "is on nfs4, a network file system" in result.stderr and "Fix: set local_dir" in result.stderr


@pytest.mark.slow
def test_two_hosts_through_two_mount_paths_of_one_directory(queue, tmp_path):
    other = tmp_path / "other-mount"
    other.mkdir()
    if subprocess.run(["mount", "--bind", str(queue.root), str(other)], capture_output=True).returncode:
        pytest.skip("this machine does not allow bind mounts (needs root and CAP_SYS_ADMIN)")
    try:
        queue.workers["b"] = subprocess.Popen(
            worker_argv(other, "b", "2x80GiB", "--foreground"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=queue.env(),
        )
        wait_until(lambda: (queue.root / "state" / "workers" / "b.json").exists(), what="b through the other path")
        queue.start_worker("a", "2x80GiB")
        ids = _drop_many(queue, 100, command="sleep 0.2; echo once")  # long enough for both
        _assert_each_ran_once(queue, ids)
        hosts = {json.loads((queue.root / "state" / "finished" / f"{i}.json").read_text())["host"] for i in ids}
        assert hosts == {"a", "b"}
    finally:
        queue.stop_worker("b", signal.SIGKILL)
        queue.close_jobs()
        subprocess.run(["umount", "-l", str(other)], check=False)


@pytest.mark.slow
def test_a_really_full_disk_loses_no_spec_and_no_worker(queue, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("this machine does not allow mounting a small tmpfs (the injected faults above still run)")
    try:
        root = small / "root"
        (root / "jobs").mkdir(parents=True)
        (root / "config.yaml").write_text((queue.root / "config.yaml").read_text())
        queue.root = root
        for i in range(3):
            queue.drop(f"j{i}.yaml", "command: echo once\ngpus: 1\n")
        filler = small / "filler"
        with open(filler, "wb", buffering=0) as f:  # fill the disk to the last block
            try:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
            except OSError:
                pass
        # (not start_worker: on a full disk there is no heartbeat to wait for)
        err = tmp_path / "worker.err"  # on the test's own disk, not the full one
        with open(err, "wb") as err_file:
            worker = queue.workers["a"] = subprocess.Popen(
                worker_argv(root, "a", "1x80GiB", "--foreground"),
                stdout=subprocess.DEVNULL,
                stderr=err_file,
                env=queue.env(),
            )
        # The worker has met the full disk in its passes (it says so once) and goes on.
        wait_until(lambda: "No space left on device" in err.read_text(), what="the worker to meet the full disk")
        assert _alive(worker)
        for i in range(3):  # nothing could be recorded: every spec is still pending, whole
            assert (root / "jobs" / f"j{i}.yaml").read_text() == "command: echo once\ngpus: 1\n"
        assert [n for n in os.listdir(root / "state" / "running") if not n.startswith(".")] == []
        filler.unlink()  # space comes back
        for i in range(3):
            record = wait_until(lambda i=i: _final(queue, f"j{i}"), what=f"j{i} once the disk has room")
            assert record["state"] == "done" and queue.log(f"j{i}").splitlines().count("once") == 1
    finally:
        queue.close()
        subprocess.run(["umount", "-l", str(small)], check=False)


@pytest.mark.slow
def test_a_start_the_disk_refuses_is_retried_at_the_poll_not_in_a_loop(queue, tmp_path):
    """The refused start puts its spec back into jobs/: the worker's own change there must not
    wake it again at once (a disk that refuses records would keep it busy)."""
    queue.write_config(poll_interval=2)
    fault_log = tmp_path / "faults"
    queue.start_worker(
        "a", "1x80GiB", env={"GPUQ_TEST_IO_FAULT": "write:running=ENOSPC", FAULT_LOG_ENV: str(fault_log)}
    )
    queue.drop("job.yaml", JOB)

    def refusals() -> int:
        return len(fired(fault_log, "io", "write:running ENOSPC"))

    seen = wait_until(refusals, what="a first refused start")
    since = time.monotonic()
    wait_until(lambda: refusals() >= seen + 2, timeout=60, what="two more refused starts")
    # Two more refusals take two polls of 2 s (a slow machine only spaces them further).
    assert time.monotonic() - since >= 1.5


@pytest.mark.slow
@pytest.mark.parametrize("point", CANCEL_CRASH_POINTS)
def test_a_cancel_cut_off_is_finished_by_a_worker_and_the_job_never_lost(queue, point):
    """A cancel killed after it moved the spec aside into finished/ (no record yet), or after
    the record (the file aside still there). A worker's sweep of old temp files (its clock two
    hours on) finishes the cancel: the job is recorded cancelled once, and nothing is left
    aside. Before, the sweep deleted the spec aside: the job was gone, with no record."""
    queue.drop("x.yaml", "command: 'true'\ngpus: 1\n")
    cut = queue.gpuq("cancel", "x", check=False, env={**queue.env(), CRASH_ENV: point})
    assert cut.returncode == -signal.SIGKILL, cut.stderr
    aside = list(queue.root.glob("state/finished/.x.cancelling.*.tmp"))
    assert len(aside) == 1 and not (queue.root / "jobs" / "x.yaml").exists()
    queue.start_worker("a", "1x24GiB", env={"GPUQ_TEST_CLOCK_SHIFT_S": "7200"})
    wait_until(lambda: not aside[0].exists(), timeout=60, what="the sweep to finish the cancel")
    ended = queue.finished("x")
    assert ended is not None and ended["state"] == "cancelled", ended
    if point == "cancel:aside":
        assert "the cancel was cut off; a worker finished it" in ended["reason"]
    show = queue.gpuq("show", "x")
    assert "cancelled" in show.stdout
