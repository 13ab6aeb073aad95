"""What one worker pass decides, driven in this process pass by pass on a clock the test moves
(tests/harness.py): no process starts and nothing waits, so these are in the fast set."""

from __future__ import annotations

import json
import os

import pytest
from harness import PassWorker, status

from gpuq.host.files import atomic_write
from gpuq.model.markers import Marker, Phase
from gpuq.model.states import State
from gpuq.run.joblocal import LOCAL_MODE
from gpuq.spool.inbox import send
from gpuq.spool.store import read_record
from gpuq.worker import arrivals


def test_a_spec_being_written_is_not_rejected_until_it_stays_unchanged(tmp_path):
    """An editor saving a half-written file between passes, for longer than spec_settle_s:
    each version is retried, none rejected; once it stays as it is that long, it is."""
    box = PassWorker(tmp_path / "root", spec_settle_s=3)
    rejected = box.layout.rejected
    for i in range(8):  # 8 s of saves, a second apart
        box.drop("slow.yaml", "command: [echo, 'unfinished" + "x" * i)
        box.run_pass(after_s=1)
        assert not list(rejected.iterdir()), f"rejected while still being written (save {i})"
    box.run_pass(after_s=2)
    assert not list(rejected.iterdir())  # unchanged for 2 s of the 3
    box.run_pass(after_s=2)
    assert (rejected / "slow.error").exists()
    assert box.launched() == []


def test_invalid_specs_are_rejected_with_file_field_fix_and_the_good_one_starts(tmp_path):
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    box.drop("bad-mem.yaml", "command: x\ngpu_mem: 20 gigs\n")
    box.drop("typo.yaml", "comand: echo\n")
    os.mkfifo(box.root / "jobs" / "pipe.yaml")
    os.symlink("/etc/passwd", box.root / "jobs" / "link.yaml")
    box.drop("good.yml", "command: echo good\ngpus: 0\n")
    box.drop("two words.yaml", "command: echo spaced\ngpus: 0\n")
    box.run_pass()
    assert box.launched() == ["good"]
    box.run_pass(after_s=2)  # past spec_settle_s: the bad ones are not being written, they are bad
    errors = {p.stem: p.read_text() for p in box.layout.rejected.glob("*.error")}
    # A name that is no job id is kept (and its event named) under an id of gpuq's.
    spaced = next(stem for stem in errors if stem.startswith("bad-name-"))
    errors["two words"] = errors.pop(spaced)
    assert "jobs/'two words.yaml'" in errors["two words"] or "jobs/two words.yaml" in errors["two words"]
    assert set(errors) == {"bad-mem", "typo", "pipe", "link", "two words"}
    assert "jobs/bad-mem.yaml: field 'gpu_mem'" in errors["bad-mem"] and "20GiB" in errors["bad-mem"]
    assert "field 'comand': unknown field" in errors["typo"] and "command" in errors["typo"]
    assert "not a regular file" in errors["pipe"]
    assert "symbolic link" in errors["link"]
    assert "not a usable job id" in errors["two words"] and "train-a.yaml" in errors["two words"]
    assert "not starting with '.'" in errors["two words"]
    assert (box.layout.rejected / "bad-mem.yaml").read_text() == "command: x\ngpu_mem: 20 gigs\n"  # nothing lost


def test_an_opportunistic_job_waits_out_idle_after_s_and_the_worker_stays_for_it(tmp_path):
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB", idle_after_s=30)
    box.drop("lo.yaml", "command: 'true'\ngpus: 1\npriority: low\n")
    box.run_pass()
    box.run_pass(after_s=10)
    assert box.launched() == []
    assert not box.worker.idle()  # --exit-when-idle stays: the GPU is becoming idle
    box.run_pass(after_s=25)
    assert box.launched() == ["lo"]


def test_a_users_jobs_running_on_another_box_count_against_the_cap_here(tmp_path):
    """b plans with a's running jobs: the two GPUs the user holds on a fill the cap, and b starts
    none of the jobs only b may run. Where jobs may land anywhere (test_team_passes.py,
    test_a_user_cap_holds_across_boxes), a plan of b's that left a's jobs out passed: it placed
    b's starts on a's GPUs (fake GPUs show no use), which b does not start."""
    root = tmp_path / "root"
    a = PassWorker(root, "a", "2x16GiB", max_gpus_per_user=2)
    b = PassWorker(root, "b", "2x16GiB", max_gpus_per_user=2)
    for i in range(2):
        a.drop(f"on-a{i}.yaml", "command: sleep 100\ngpus: 1\nhosts: [a]\n")
    a.run_pass(after_s=1)
    assert sorted(a.launched()) == ["on-a0", "on-a1"]
    for i in range(2):
        b.drop(f"on-b{i}.yaml", "command: sleep 100\ngpus: 1\nhosts: [b]\n")
    for _ in range(3):
        b.run_pass(after_s=1)
    assert b.launched() == []
    assert (b.root / "jobs" / "on-b0.yaml").exists() and (b.root / "jobs" / "on-b1.yaml").exists()


def test_a_box_silent_for_lost_after_s_is_taken_over_and_its_job_runs_again_elsewhere(tmp_path):
    """Liveness is judged on the observer's own clock: b's heartbeat stops changing, and once
    lost_after_s has passed on a's clock, a takes b's job over (its next attempt runs on a)."""
    root = tmp_path / "root"
    b = PassWorker(root, "b", "1x16GiB", lost_after_s=180)
    a = PassWorker(root, "a", "1x16GiB", lost_after_s=180)
    b.drop("long.yaml", "command: sleep 1000\ngpus: 1\n")
    b.run_pass()
    assert b.launched() == ["long"]
    for _ in range(2):  # a sees b's heartbeat change: b is a live box
        a.run_pass(after_s=1)
        b.run_pass(after_s=1)
    a.run_pass(after_s=1)  # a last sees b's heartbeat change here: silence counts from now
    for _ in range(3):
        a.run_pass(after_s=50)
    assert a.launched() == []  # silent for 150 s of 180: still b's
    a.run_pass(after_s=50)
    assert a.launched() == ["long"]
    assert a.spawner.launched[0].attempt == 2 and a.spawner.launched[0].host == "a"


def test_retries_n_re_runs_a_job_lost_with_its_box_n_times(tmp_path, monkeypatch: pytest.MonkeyPatch):
    """`retries: 2` is two re-runs, three attempts in all (docs/reference.md): a job whose box
    reboots under it each time runs as attempts 1, 2 and 3, and the third loss is final. Only
    the default and 0 were tested, which an off-by-one in the count passes."""
    root = tmp_path / "root"
    attempts: list[int] = []
    for boot in range(1, 5):
        monkeypatch.setenv("GPUQ_TEST_BOOT_ID", f"boot-{boot}")  # a new boot id: the box rebooted
        box = PassWorker(root, "a", "1x16GiB")
        if boot == 1:
            box.drop("fragile.yaml", "command: sleep 1000\ngpus: 1\nretries: 2\n")
        for _ in range(3):  # the first pass finds the last boot's attempt lost and requeues it
            box.run_pass(after_s=1)
        attempts += [r.attempt for r in box.spawner.launched]
    assert attempts == [1, 2, 3]
    lost = read_record(box.layout.finished / "fragile.json")
    assert lost is not None and lost.state is State.LOST and lost.attempt == 3
    assert lost.reason == "host rebooted; no retries left (2)"


def test_the_next_job_starts_on_the_pass_after_one_ends_and_the_spool_is_clean(tmp_path):
    """One GPU, two whole-GPU jobs: the second waits while the first runs, starts on the first
    pass after the first ended, and nothing of the first is left but its finished record."""
    box = PassWorker(tmp_path / "root", "a", "1x16GiB")
    box.drop("first.yaml", "command: sleep 10\ngpus: 1\n")
    box.run_pass()
    box.drop("second.yaml", "command: sleep 10\ngpus: 1\n")
    box.run_pass(after_s=2)
    box.run_pass(after_s=1)
    assert box.launched() == ["first"]  # the GPU is taken
    ended = box.finish("first")
    assert ended.state.value == "done"
    box.run_pass(after_s=1)
    assert box.launched() == ["first", "second"]
    left = [p.name for d in ("claims", "running", "requeued") for p in (box.layout.state / d).iterdir()]
    assert left == [c for c in left if c.startswith("second")], left
    events = [json.loads(line) for line in (box.layout.events / "a.jsonl").read_text().splitlines()]
    assert [(e["job"], e["to"]) for e in events] == [("first", "running"), ("first", "done"), ("second", "running")]


def test_many_sweeps_dropped_at_once_are_expanded_over_passes_and_never_run_unexpanded(tmp_path, monkeypatch):
    """An attack review dropped 24 arrays of 1,000 at once: one pass wrote all 24,000 members,
    and the heartbeat stood still 44 s (100 such arrays would outlast lost_after_s). A pass
    expands until MEMBERS_PER_PASS (1,000) members are written; the rest wait, and are no job
    to plan meanwhile. Here the bound is 100, with arrays of 60: the same rule, a tenth of the files."""
    assert arrivals.MEMBERS_PER_PASS <= 1000  # the product's bound, before the test lowers it
    monkeypatch.setattr(arrivals, "MEMBERS_PER_PASS", 100)
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    for name in ("s1", "s2", "s3"):
        box.drop(f"{name}.yaml", "command: echo $GPUQ_ARRAY_INDEX\ngpus: 0\narray: 0-59\n")
    box.run_pass()
    groups = box.layout.groups
    expanded = {n for n in ("s1", "s2", "s3") if (groups / f"{n}.json").exists()}
    assert len(expanded) == 2, expanded  # 60 + 60 written: the third waits
    (left,) = {"s1", "s2", "s3"} - expanded
    assert (box.root / "jobs" / f"{left}.yaml").exists() and left not in box.launched()
    box.run_pass(after_s=1)
    assert (groups / f"{left}.json").exists()
    assert (
        left not in box.launched()
        and len(list((box.root / "jobs").glob(f"{left}_*.yaml")))
        + sum(1 for j in box.launched() if j.startswith(f"{left}_"))
        == 60
    )


def _pass_until_planning(box: PassWorker, after_s: float = 0.0) -> None:
    """The steps of a pass before its plan: it has read jobs/ and not yet taken the queue lock."""
    box.clock.advance(after_s)
    box.run_steps(box.worker.STEPS[: box.worker.STEPS.index("start_jobs")])


def test_a_job_another_box_claims_while_this_one_waits_for_the_queue_lock_is_not_planned_again(tmp_path):
    """A pass reads jobs/, then waits for the queue lock while another box claims a job from
    it. Planned from that stale listing, the job was placed a second time: its running copy
    filled a's GPU, so b made its own low job yield for it (CI: two boxes each preempted one
    low job for the same job)."""
    root = tmp_path / "root"
    a = PassWorker(root, "a", "1x80GiB", idle_after_s=0.1)
    b = PassWorker(root, "b", "1x80GiB", idle_after_s=0.1)
    b.drop("lo.yaml", "command: sleep 100\ngpus: 1\npriority: low\nhosts: [b]\n")
    for _ in range(3):
        a.run_pass(after_s=1)
        b.run_pass(after_s=1)
    assert b.launched() == ["lo"]
    a.drop("real.yaml", "command: echo real\ngpus: 1\n")
    _pass_until_planning(b, after_s=1)  # b has read jobs/ with real in it ...
    a.run_pass()  # ... and a claims it meanwhile, onto its empty GPU
    assert a.launched() == ["real"]
    b.run_steps(["start_jobs"])
    assert b.stops == {}  # not lo's "preempted: job real needs its GPU memory"
    assert b.launched() == ["lo"]


def test_temp_files_of_writers_killed_mid_write_are_swept_wherever_gpuq_writes(tmp_path):
    """An hour old, a dot temp file's writer is long gone: every directory gpuq's own writers
    write is swept (held/, groups/, places/, bookings/, a host's stop orders were not), and in
    jobs/ only `gpuq submit`'s; a recent one, and a member's own dot file, stay. Old means by
    its ctime too: a spec a cancel is moving aside keeps its old mtime, and was swept mid-move
    (a review: the spec of a job submitted over an hour before was lost). The sweep is the
    worker's full read of jobs/, as with a real worker: a pass's steps are the same."""
    box = PassWorker(tmp_path / "root", "a", "1x16GiB")
    state = box.layout.state
    (state / "control" / "b").mkdir(parents=True)
    old = [
        state / d / ".x.123.abcd.tmp"
        for d in ("held", "groups", "places", "bookings", "claims", "running", "finished", "requests", "control/b")
    ] + [state / ".doctor-1.tmp", box.layout.jobs / ".submit-1-ab.tmp"]
    recent, members = state / "held" / ".y.9.ef.tmp", box.layout.jobs / ".draft.tmp"
    for path in [*old, recent, members]:
        path.write_text("partial")
    # Being moved aside now: written two hours ago, renamed this moment.
    spec = box.layout.jobs / "old-job.yaml"
    spec.write_text("command: 'true'\n")
    os.utime(spec, (box.clock.wall() - 7200,) * 2)
    aside = state / "finished" / ".old-job.cancelling.1a2b3c4d.tmp"
    os.rename(spec, aside)
    box.run_pass()  # a worker's first pass reads jobs/ whole, and sweeps
    assert aside.exists(), "a file moved aside a moment ago was swept by its old mtime"
    assert all(p.exists() for p in old)  # nothing is an hour old yet

    box.clock.advance(3700)  # an hour on: all but the recent one are old by both times
    os.utime(recent, (box.clock.wall() - 600,) * 2)
    box.run_pass()  # a full read of jobs/ again (one every FULL_SCAN_EVERY_S)
    assert [p for p in [*old, aside] if p.exists()] == []
    assert recent.exists() and members.exists()


@pytest.mark.parametrize(
    "kept, recorded_as",
    [
        ({"state": "timeout", "exit_code": None, "signal": 15, "reason": "time limit 1m reached"}, "timeout"),
        ({"state": "failed", "exit_code": 3}, "failed"),
        ({"state": "running"}, "lost"),  # not how a job ends
        ("garbage", "lost"),
    ],
)
def test_a_result_the_shared_disk_refused_is_recorded_once_the_supervisor_is_gone(tmp_path, kept, recorded_as):
    """A supervisor the shared disk refused keeps its job's result in the lock file (the
    UNRECORDED marker, model/markers.py) and exits; the worker records it once the lock is
    free. Any end a supervisor records (a timeout too), and a kept result it cannot read as
    lost: the job never stays running for good, its settling failing pass after pass."""
    box = PassWorker(tmp_path / "root", "a", "1x16GiB")
    box.drop("j.yaml", "command: sleep 100\ngpus: 1\n")
    box.run_pass(after_s=2)
    running = read_record(box.layout.record(box.layout.running, "j"))
    assert running is not None
    box.spawner.starting.discard("j")  # its supervisor is gone, its lock free
    marker = Marker(Phase.UNRECORDED, running.claim, why="[Errno 28] No space left on device", result=kept)
    atomic_write(box.worker.rt.lock_path("j"), json.dumps(marker.fields()).encode(), LOCAL_MODE, durable=False)
    box.run_pass(after_s=1)
    finished = read_record(box.layout.record(box.layout.finished, "j"))
    assert finished is not None and finished.state.value == recorded_as
    assert not box.layout.record(box.layout.running, "j").exists()


def test_a_slow_pass_does_not_let_an_exit_when_idle_worker_leave_before_its_plan_saw_the_gpu_idle(
    tmp_path, monkeypatch
):
    """The plan at +10 s saw the GPU idle for 10 of its 30 s; the pass then took 25 s more.
    Judged at the pass's end (+35 s) the GPU was idle long enough, so nothing was 'becoming
    idle', and a worker with --exit-when-idle left with the job never started."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB", idle_after_s=30)
    box.drop("lo.yaml", "command: 'true'\ngpus: 1\npriority: low\n")
    box.run_pass()
    box.worker.idle()  # as the run loop asks after every pass
    report = box.worker.report

    def slow_report() -> None:
        box.clock.advance(25)
        report()

    monkeypatch.setattr(box.worker, "report", slow_report)
    box.run_pass(after_s=10)
    assert box.launched() == []
    assert not box.worker.idle()
    monkeypatch.setattr(box.worker, "report", report)
    box.run_pass(after_s=1)
    assert box.launched() == ["lo"]


def test_a_restarted_worker_still_counts_a_job_it_told_to_stop_as_stopping(tmp_path):
    """A worker cancels a job and exits (cron starts another) while the job takes its grace:
    the new worker forgot the order, and the plan took the job to run to its limit again.
    It reads the orders back from the jobs' stop files, with when they were written."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    box.drop("busy.yaml", "command: sleep 600\ngpus: 1\n")
    box.run_pass(after_s=1)
    send(box.layout, "cancel", ("busy",), sent_from="a")
    box.run_pass(after_s=1)
    told = box.heartbeat()["stops"]["busy"]
    box.restart()
    box.run_pass(after_s=1)
    assert box.heartbeat()["stopping"] == ["busy"]
    again = box.heartbeat()["stops"]["busy"]
    assert again == told  # the stop file's mtime is when it was told, on this box's clock


def test_a_stop_file_older_than_its_attempt_is_not_read_as_its_order(tmp_path):
    """A stop file an earlier attempt of the id left (its supervisor killed between recording
    and cleaning up, its box cut off and the job taken over) was read by a restarted worker as
    this attempt's order: the job looked stopping for good, and a low one never yielded."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB", idle_windows="00:00-23:59")
    box.drop("lo.yaml", "command: sleep 600\ngpus: 1\npriority: low\n")
    for _ in range(8):  # a low job starts once its GPU has been idle for a minute
        box.run_pass(after_s=10)
    assert box.launched() == ["lo"]
    left = box.worker.rt.stop_path("lo")
    atomic_write(left, b"cancelled by someone", LOCAL_MODE, durable=False)
    os.utime(left, (box.clock.wall() - 3600,) * 2)  # an hour old: before this attempt's claim
    box.restart()
    box.run_pass(after_s=1)
    assert box.heartbeat()["stopping"] == []
    box.drop("hi.yaml", "command: x\ngpus: 1\n")
    for _ in range(5):
        box.run_pass(after_s=2)
    assert "lo" in box.stops and box.stops["lo"][0].cause.value == "preempted"
    running = {r["id"]: (r["stopping"], r["yielding"]) for r in status(box.root)["running"]}
    assert running == {"lo": (True, True)}  # told to yield: stopping, and yielding


def test_a_stop_a_grace_late_is_given_up_on_and_the_free_gpu_used(tmp_path):
    """told (1 GPU, a 1 h limit) is cancelled and never leaves. The pair job (2 GPUs) at the
    head holds GPU 1 for when told's stop ends; a grace after that the plan gives up on told,
    and long may use GPU 1. The worker skipped its plan while its inputs stood, and nothing
    in them said the stop had become a grace late: GPU 1 stayed idle."""
    box = PassWorker(tmp_path / "root", fake_gpus="2x80GiB")
    grace = box.worker.config.grace_s
    box.drop("told.yaml", "command: sleep 600\ngpus: 1\ntime_limit: 1h\n")
    box.run_pass(after_s=1)
    box.drop("pair.yaml", "command: x\ngpus: 2\ntime_limit: 1h\n")
    box.drop("long.yaml", "command: x\ngpus: 1\ntime_limit: 2h\n")
    for _ in range(4):
        box.run_pass(after_s=2)
    assert box.launched() == ["told"]  # long would hold GPU 1 past the pair's reservation
    send(box.layout, "cancel", ("told",), sent_from="a")
    box.run_pass(after_s=1)
    assert "told" in box.stops
    for _ in range(int(grace) + 2):  # within the stop's grace, and a grace after: expected soon
        box.run_pass(after_s=1)
        assert box.launched() == ["told"]
    for _ in range(int(grace) + 2):
        box.run_pass(after_s=1)
    assert box.launched() == ["told", "long"]


def test_status_applies_a_boxs_stops_to_its_own_jobs_and_a_bad_stop_skips_the_heartbeat(tmp_path):
    """Box a's last heartbeat still lists j as told to stop; j, retried, runs on box b. Status
    said j was stopping (stops were matched by id alone). A stop whose cause is not a word is
    a bad heartbeat, skipped whole (it was read, and crashed the plan of every box)."""
    from gpuq.spool.teamstate import heartbeat_problem

    b = PassWorker(tmp_path / "root", "b", fake_gpus="1x80GiB")
    b.drop("j.yaml", "command: sleep 600\ngpus: 1\n")
    b.run_pass(after_s=1)
    assert b.launched() == ["j"]
    beat = b.heartbeat()
    stale = {**beat, "host": "a", "stopping": ["j"], "stops": {"j": {"since": beat["t"], "cause": "cancelled"}}}
    assert heartbeat_problem(stale, "a") is None
    (b.layout.workers / "a.json").write_text(json.dumps(stale))
    (shown,) = status(b.root)["running"]
    assert shown["id"] == "j" and not shown["stopping"] and not shown["yielding"]
    bad = {**stale, "stops": {"j": {"since": beat["t"], "cause": {"not": "a word"}}}}
    assert heartbeat_problem(bad, "a") == "'stops' is not job -> {since, cause}"


def test_a_low_job_on_the_heads_reserved_gpu_is_told_to_yield_a_grace_before_the_head_is_due(tmp_path):
    """A member: lo (`grace: 30s`) ran on GPU 1 when pair (2 GPUs) came and was reserved both
    GPUs from when occ's limit (and a stop's grace) ends. lo was told to yield only when the
    head could start, and pair waited out lo's grace on GPUs otherwise free. It is told 30 s
    (and a poll) before occ's limit: nothing else changes by then, and a worker that skipped its plan
    while its inputs stood plans again at that moment (Plan.recheck_at)."""
    box = PassWorker(tmp_path / "root", fake_gpus="2x80GiB", idle_after_s=1)
    grace = box.worker.config.grace_s
    box.drop("occ.yaml", "command: sleep 600\ngpus: 1\ntime_limit: 2m\n")
    box.run_pass(after_s=1)
    box.drop("lo.yaml", "command: sleep 600\ngpus: 1\npriority: low\ngrace: 30s\n")
    for _ in range(4):
        box.run_pass(after_s=2)
    assert box.launched() == ["occ", "lo"]
    occ_started = box.clock.wall() - 8
    box.drop("pair.yaml", "command: x\ngpus: 2\ntime_limit: 1h\n")
    box.run_pass(after_s=1)
    (reserved,) = [j for j in status(box.root)["pending"] if j["id"] == "pair"]
    assert "reserved for it" in reserved["reason"], reserved
    due = occ_started + 120 + grace  # give or take the moment occ's record says it started
    while box.clock.wall() < due - grace - 30 - 10:
        box.run_pass(after_s=2)
        assert "lo" not in box.stops, box.clock.wall() - due  # it may use the GPU until then
    while box.clock.wall() < due - grace - 30 and "lo" not in box.stops:
        box.run_pass(after_s=2)
    assert "lo" in box.stops and "pair is due on its GPU" in box.stops["lo"][0].reason


def test_an_attempt_that_never_started_keeps_the_word_that_its_job_resumes_a_preemption(tmp_path):
    """lo was preempted; its attempt 2 (GPUQ_PREEMPTED=1) was handed back before its command
    ran (its supervisor died first). Attempt 3 was told GPUQ_PREEMPTED=0, the requeue of the
    unstarted attempt having taken the preemption's place, and began again from scratch though
    its checkpoint was there."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB", idle_windows="00:00-23:59")
    box.drop("lo.yaml", "command: sleep 600\ngpus: 1\npriority: low\n")
    for _ in range(8):  # a low job starts once its GPU has been idle for a minute
        box.run_pass(after_s=10)
    box.drop("hi.yaml", "command: sleep 600\ngpus: 1\n")
    for _ in range(3):
        box.run_pass(after_s=2)
    box.finish("lo")  # it yields
    for _ in range(3):
        box.run_pass(after_s=2)
    box.finish("hi")
    for _ in range(8):
        box.run_pass(after_s=10)
    second = box.spawner.launched[-1]
    assert (second.id, second.attempt, second.preempted) == ("lo", 2, True)
    box.spawner.starting.discard("lo")  # handed back unstarted: no marker of this attempt
    for _ in range(8):
        box.run_pass(after_s=10)
    third = box.spawner.launched[-1]
    assert (third.id, third.attempt, third.preempted) == ("lo", 3, True)


def test_a_second_cancel_of_a_stopping_job_leaves_the_first_ones_words(tmp_path):
    """A member cancelled huge (its grace under way), then root did: huge ended "cancelled by"
    root's queue account, and the member's cancel was lost from its record."""
    from gpuq.host.files import write_json

    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    box.drop("huge.yaml", "command: sleep 600\ngpus: 1\n")
    box.run_pass(after_s=1)
    control = box.layout.host_control("a")
    box.layout.make_state_dir(control)
    for by in ("ana", "root"):
        write_json(control / "huge.json", {"action": "cancel", "by": by, "t": box.clock.wall(), "attempt": 1})
        box.run_pass(after_s=1)
    assert box.stops["huge"][0].reason == "cancelled by ana"
    assert box.worker.rt.stop_path("huge").read_text() == "cancelled by ana"
    assert not (control / "huge.json").exists()
    assert box.finish("huge", exit_code=143).reason == "cancelled by ana"


def test_a_cancel_order_written_while_the_worker_obeys_the_one_before_is_obeyed_too(tmp_path, monkeypatch):
    """`gpuq cancel --now` right after a plain cancel: the worker read the plain order, the
    --now one replaced it, and the worker then removed the file by name, unread: the job that
    ignored SIGTERM took its day's grace (a full suite beside another caught it). An order is
    taken by a rename before it is read; one written meanwhile is there for the next pass."""
    from gpuq.host.files import write_json
    from gpuq.worker import stopping

    box = PassWorker(tmp_path / "root", fake_gpus="1x80GiB")
    box.drop("deaf.yaml", "command: sleep 600\ngpus: 1\ngrace: 1d\n")
    box.run_pass(after_s=1)
    control = box.layout.host_control("a")
    box.layout.make_state_dir(control)
    order = {"action": "cancel", "by": "ana", "t": box.clock.wall(), "attempt": 1}
    write_json(control / "deaf.json", order)
    real = stopping.read_json

    def read_then_now_arrives(path):
        data = real(path)
        write_json(control / "deaf.json", {**order, "now": True})  # `cancel --now`, applied meanwhile
        return data

    monkeypatch.setattr(stopping, "read_json", read_then_now_arrives)
    box.run_pass(after_s=1)
    monkeypatch.setattr(stopping, "read_json", real)
    assert box.worker.rt.stop_path("deaf").read_text() == "cancelled by ana"
    assert (control / "deaf.json").exists(), "the --now order was removed unread"
    box.run_pass(after_s=1)
    assert box.worker.rt.stop_path("deaf").read_text() == "cancelled by ana (at once, without its grace)"
    assert not list(control.iterdir())


def test_a_cancel_takes_the_waiting_jobs_before_it_stops_the_running_ones(tmp_path, monkeypatch):
    """`gpuq cancel` of a %2 array: its running members were stopped first, which freed their
    places, and another box started the waiting members this same cancel then killed. The
    waiting ones go first now; the reply keeps the order asked."""
    from gpuq.spool import cancel
    from gpuq.spool.applying import apply_request
    from gpuq.spool.inbox import Request

    box = PassWorker(tmp_path / "root", fake_gpus="2x24GiB")
    box.drop("arr.yaml", "command: sleep 60\ngpus: 1\narray: 0-3%2\n")
    box.run_pass()
    box.run_pass(after_s=1)
    assert sorted(box.launched()) == ["arr_0", "arr_1"]
    applied = []
    real = cancel.cancel_one
    monkeypatch.setattr(cancel, "cancel_one", lambda layout, i, *a: applied.append(i) or real(layout, i, *a))
    ids = ("arr_0", "arr_1", "arr_2", "arr_3")
    reply = apply_request(box.layout, box.worker.config, "a", Request("r-1", "cancel", os.getuid(), ids))
    assert applied == ["arr_2", "arr_3", "arr_0", "arr_1"]
    assert [m.split(":")[0] for _, m in reply.outcomes] == list(ids) and reply.ok, reply.outcomes
    assert "cancelled (was pending)" in reply.outcomes[2][1] and "cancelling (running" in reply.outcomes[0][1]


def test_the_worker_log_names_an_array_an_array(tmp_path, caplog):
    """It said "sweep arr: 3 jobs" of an array (a member read the log)."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x24GiB")
    box.drop("arr.yaml", "command: 'true'\ngpus: 0\narray: 0-2\n")
    box.drop("hp.yaml", "command: 'echo {lr}'\ngpus: 0\nsweep: {lr: [1, 2]}\n")
    with caplog.at_level("INFO"):
        box.run_pass()
    assert "array arr: 3 jobs" in caplog.text and "sweep hp: 2 jobs" in caplog.text, caplog.text


def test_refusing_a_flood_of_broken_links_is_spread_over_passes_and_good_specs_go_on(tmp_path, monkeypatch):
    """60,000 broken links a member made were each read in microseconds, within the read
    budget, and then all refused in one pass: 18 s without a heartbeat (a review). Refusing
    has a budget of its own too; here none, so one refusal a pass, and the good spec starts in
    the first pass all the same."""
    box = PassWorker(tmp_path / "root", fake_gpus="1x24GiB")
    monkeypatch.setattr(arrivals, "TAKE_IN_BUDGET_S", 0.0)
    for i in range(5):
        os.symlink("/nonexistent", box.root / "jobs" / f"l{i}.yaml")
    box.drop("good.yaml", "command: 'true'\ngpus: 0\n")
    box.run_pass()
    assert box.launched() == ["good"]
    refused = [len(list(box.layout.rejected.glob("l*.error")))]
    for _ in range(6):
        box.run_pass(after_s=0.1)
        refused.append(len(list(box.layout.rejected.glob("l*.error"))))
    assert refused == [1, 2, 3, 4, 5, 5, 5], refused
    assert box.worker.reading_behind() is False
