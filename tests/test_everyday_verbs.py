"""Verbs people reach for and screens that fit: `gpuq wait` (exit status by how the jobs ended,
as `pueue wait` and `sbatch --wait`), a mistyped verb, status narrowed and summed up, submit's
limits, logs of groups, retry of a rejected spec, forget, and `show` folding a long environment.
What a verb does to the spool and what status and show then say of it run in this process
(tests/harness.py: the CLI's main and a box's passes on a clock the test moves); what needs the
real CLI, worker, supervisors or users (wait, logs -f, a dead box, time limits) is marked slow."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from harness import FOREVER, PassWorker, Run, Team, gpuq, status
from team import ALICE, BOB

from conftest import PY, REPO, wait_until
from gpuq import __version__
from gpuq.model.states import State
from gpuq.spool.teamstate import live_window_s

# A killed box's heartbeat this old is past its live window (the tests' poll_interval: 0.2 s).
LIVE_WINDOW_S = live_window_s({"poll_interval": 0.2}) + 1


def _wait_cmd(queue, *args: str) -> list[str]:
    return [PY, str(REPO / "gpuq.py"), "--root", str(queue.root), "wait", *args]


@pytest.mark.slow
def test_wait_returns_when_the_jobs_end_and_exits_by_how_they_ended(queue):
    queue.gpuq("submit", "--gpus", "0", "--id", "slow", "--", "sleep 3; echo slow done")
    queue.gpuq("submit", "--gpus", "0", "--id", "broken", "--", "exit 3")
    queue.drop("nodir.yaml", "command: 'true'\ngpus: 0\nworkdir: /no/such/dir\n")  # it never runs
    waiting = subprocess.Popen(
        _wait_cmd(queue, "slow"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=queue.env()
    )
    queue.start_worker("a", "1x80GiB")
    out, err = waiting.communicate(timeout=120)
    returned_at = time.time()
    slow = queue.finished("slow")
    assert waiting.returncode == 0 and out == "slow: done (exit 0)\n", (out, err)
    assert slow is not None and slow["ended_at"] <= returned_at  # it returned after the job ended
    both = queue.gpuq("wait", "slow", "broken", "nodir", check=False, timeout=120)
    assert both.returncode == 1  # one of them did not succeed
    assert both.stdout.splitlines() == [
        "slow: done (exit 0)",
        "broken: failed (exit 3)",
        "nodir: failed (cannot start: No such file or directory (workdir): /no/such/dir)",  # not "exit None"
    ]


@pytest.mark.slow
def test_wait_for_a_cancelled_job_a_group_and_no_such_job(queue):
    out = queue.gpuq("submit", "--gpus", "0", "--name", "arr", "--array", "0-2", "--", "echo index=$GPUQ_ARRAY_INDEX")
    group = out.stdout.strip().splitlines()[-1]
    # Waited for before any worker has expanded the array's one spec into its members:
    members = subprocess.Popen(_wait_cmd(queue, group), stdout=subprocess.PIPE, text=True, env=queue.env())
    queue.start_worker("a", "1x80GiB")
    out, _ = members.communicate(timeout=120)
    assert members.returncode == 0 and sorted(out.splitlines()) == [f"{group}_{i}: done (exit 0)" for i in range(3)]
    queue.gpuq("submit", "--gpus", "0", "--id", "doomed", "--", "sleep 60")
    wait_until(lambda: queue.record("doomed"), what="doomed to start")
    waiting = subprocess.Popen(_wait_cmd(queue, "doomed"), stdout=subprocess.PIPE, text=True, env=queue.env())
    queue.gpuq("cancel", "doomed")
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 1 and out.startswith("doomed: cancelled")
    nope = queue.gpuq("wait", "nope", check=False)
    assert nope.returncode == 1 and nope.stdout == "" and nope.stderr == "gpuq wait: nope: no such job\n"
    bad = queue.gpuq("wait", "../etc", check=False)
    assert bad.returncode == 1 and "not a job id" in bad.stderr


@pytest.mark.slow
def test_wait_gives_up_after_its_timeout_and_says_where_the_job_is(queue):
    queue.gpuq("submit", "--gpus", "0", "--id", "patient", "--", "true")  # no worker: it stays pending
    started = time.monotonic()
    out = queue.gpuq("wait", "--timeout", "1s", "patient", check=False)
    assert out.returncode == 3 and out.stdout == "patient: still pending after 1 s\n"
    assert time.monotonic() - started >= 1
    bad = queue.gpuq("wait", "--timeout", "soon", "patient", check=False)
    assert bad.returncode == 2 and "--timeout" in bad.stderr and "not a duration" in bad.stderr


@pytest.mark.slow
def test_a_mistyped_verb_gets_the_nearest_ones_and_no_internal_verb(queue):
    out = queue.gpuq("stauts", check=False)
    assert out.returncode == 2
    assert out.stderr == "gpuq: unknown verb 'stauts'; did you mean status? (`gpuq --help` lists the verbs)\n"
    far = queue.gpuq("frobnicate", check=False)
    assert far.returncode == 2 and "did you mean" not in far.stderr and "_ids" not in far.stderr
    helped = queue.gpuq("--help")
    assert "wait" in helped.stdout and "_ids" not in helped.stdout and "_hosts" not in helped.stdout


@pytest.mark.slow
def test_status_narrows_to_me_a_user_and_a_state(team):
    team.write_config(poll_interval=0.2)
    big = "command: 'true'\ngpus: 1\ngpu_mem: 100GiB\nworkdir: /\n"  # fits no GPU here: stays pending
    team.drop_as(ALICE, "al-big.yaml", big)
    team.drop_as(BOB, "bo-big.yaml", big)
    team.drop_as(ALICE, "al-ok.yaml", "command: 'true'\ngpus: 0\nworkdir: /\n")
    team.drop_as(BOB, "bo-bad.yaml", "command: exit 3\ngpus: 0\nworkdir: /\n")
    team.start_worker("a", "1x80GiB")
    wait_until(lambda: team.finished("al-ok") and team.finished("bo-bad"), what="the small jobs to end")
    # One finished line only: a narrowed screen shows the latest of ITS jobs, not whichever of
    # the two ended last, filtered (an audit: `--state done` was empty with 8 done jobs).
    team.write_config(poll_interval=0.2, recent_finished=1)
    view = lambda *args: json.loads(team.as_user(ALICE, "status", "--json", *args).stdout)  # noqa: E731
    assert [f["id"] for f in view("--state", "done")["finished"]] == ["al-ok"]
    mine = view("--me")
    assert [p["id"] for p in mine["pending"]] == ["al-big"] and mine["pending_total"] == 1
    assert [f["id"] for f in mine["finished"]] == ["al-ok"]
    bobs = view("--user", BOB)
    assert [p["id"] for p in bobs["pending"]] == ["bo-big"] and [f["id"] for f in bobs["finished"]] == ["bo-bad"]
    failed = view("--state", "failed")
    assert [f["id"] for f in failed["finished"]] == ["bo-bad"] and failed["pending"] == failed["running"] == []
    pending = view("--state", "pending")
    assert sorted(p["id"] for p in pending["pending"]) == ["al-big", "bo-big"] and pending["finished"] == []
    text = team.as_user(BOB, "status", "--me").stdout
    assert "bo-big" in text and "al-big" not in text and "al-ok" not in text


def test_a_long_queue_shows_its_head_and_how_many_wait_for_each_reason(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    for i in range(119):
        box.drop(f"big{i:03d}.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 100GiB\n")
    box.drop("elsewhere.yaml", "command: 'true'\ngpus: 1\nhosts: [b]\n")
    box.run_pass(after_s=2)  # past spec_settle_s: each is a job that waits, none rejected
    view = status(box.root)
    assert view["pending_total"] == 120 and box.launched() == []
    assert sum(view["pending_by_reason"].values()) == 120 and len(view["pending_by_reason"]) == 2
    (common, n), (rare, one) = view["pending_by_reason"].items()
    assert n == 119 and one == 1 and "behind" not in common
    text = gpuq(box.root, "status").stdout
    assert "... and 100 more (gpuq status --all). All 120 wait for:" in text
    assert f"{119:6d}  {common}" in text and f"{1:6d}  {rare}" in text
    assert len(text.splitlines()) < 50, text  # short by default: 20 rows and the counts, not 120 rows
    assert gpuq(box.root, "status", "--all").stdout.count("big") >= 119


@pytest.mark.slow
def test_submit_takes_slurms_spellings_for_limits_and_checks_them_as_a_spec_would(queue):
    queue.start_worker("a", "1x80GiB")
    queue.gpuq(
        "submit",
        "--gpus",
        "0",
        "--id",
        "capped",
        "--time",
        "2s",
        "--grace",
        "1s",
        "--cpus",
        "1",
        "--mem",
        "1GiB",
        "--retries",
        "0",
        "--",
        "sleep 60",
    )
    record = wait_until(lambda: queue.finished("capped"), timeout=60, what="the time limit to stop it")
    assert record["state"] == "timeout" and record["time_limit_s"] == 2
    assert len(record["cpu_cores"]) == 1 and record["mem_limit_mib"] == 1024
    assert record["spec"]["retries"] == 0 and record["spec"]["grace_s"] == 1
    queue.gpuq(
        "submit",
        "--gpus",
        "0",
        "--id",
        "service",
        "--restart",
        "on-failure",
        "--preemptible",
        "--time-limit",
        "90m",
        "--cpus-per-task",
        "1",
        "--",
        "true",
    )
    service = wait_until(lambda: queue.finished("service"), timeout=60, what="service to end")
    assert service["state"] == "done" and service["time_limit_s"] == 5400
    assert service["spec"]["restart"] == "on-failure" and service["spec"]["preemptible"] is True
    assert service["spec"]["cpus"] == 1  # sbatch's --cpus-per-task
    for option, value, says in (
        ("--time", "soon", "--time soon: 'soon' is not a time; write it like 90 (minutes, as sbatch reads it)"),
        ("--time", "0", "--time 0: '0' (sbatch's \"no limit\") is not one gpuq has; leave the option out"),
        ("--time", "UNLIMITED", "is not one gpuq has; leave the option out for the queue's default"),
        ("--mem", "0", "--mem 0 (sbatch's \"all the box's memory\") is not one gpuq has"),
        ("--dependency", "afternotok:x", "--dependency afternotok:x: 'afternotok:x' is not one gpuq takes"),
        ("--cpus", "two", "--cpus: 'two' is not a number of CPU cores"),
        ("--restart", "sometimes", "--restart: 'sometimes' is not a restart policy"),
        (
            "--time",
            "400d",
            "--time-limit: 400d is out of range. Fix: give more than 0 and at most 365 days, e.g. `--time-limit 12h`",
        ),
    ):
        bad = queue.gpuq("submit", "--gpus", "0", option, value, "--", "true", check=False)
        assert bad.returncode == 2 and says in bad.stderr and "Nothing was written" in bad.stderr
    typed = queue.gpuq("submit", "-G", "a100:2", "--", "true", check=False)  # sbatch's [type:]count
    assert typed.returncode == 2 and "gpuq does not choose GPUs by type (a100); give the count" in typed.stderr


@pytest.mark.slow
def test_sbatch_options_read_as_sbatch_reads_them(queue):
    """--time 90 is 90 minutes and 1:30 two (sbatch rounds seconds up; never YAML's base-60 90), -J names it,
    -G and -c count GPUs and cores, --mem 1000 is MiB, --dependency afterok/afterany are
    --after/--after-any; all through the real CLI and worker."""
    assert queue.gpuq("--version").stdout.strip() == f"gpuq {__version__}"
    queue.start_worker("a", "1x80GiB")
    first = queue.gpuq("submit", "-G", "0", "--id", "first", "--", "true").stdout.split()[-1]
    job = queue.gpuq(
        "submit",
        *("-J", "train", "-G", "gpu:0", "-c", "1", "--mem", "1000", "-t", "90"),
        *("--dependency", f"afterok:{first},afterany:{first}", "--", "true"),
    ).stdout.split()[-1]
    assert job.startswith("train-")
    short = queue.gpuq("submit", "-G", "0", "--id", "short", "--time", "1:30", "--", "true").stdout.split()[-1]
    days = queue.gpuq("submit", "-G", "0", "--id", "days", "--time", "2-12", "--", "true").stdout.split()[-1]
    done = {j: wait_until(lambda j=j: queue.finished(j), timeout=60, what=j) for j in (first, job, short, days)}
    assert done[job]["started_at"] >= done[first]["ended_at"]
    assert done[job]["time_limit_s"] == 5400 and done[job]["spec"]["name"] == "train"
    assert done[job]["mem_limit_mib"] == 1000 and len(done[job]["cpu_cores"]) == 1 and done[job]["gpus"] == []
    assert (done[job]["spec"]["after"], done[job]["spec"]["after_any"]) == ([first], [first])
    assert done[short]["time_limit_s"] == 120 and done[days]["time_limit_s"] == 216000  # 1:30 rounded up
    assert "sbatch's --time: 90 is 90 minutes" in queue.gpuq("submit", "--help").stdout
    # Before it starts, `show` says what it asks for, as scontrol show job does: held, or pending.
    queue.gpuq("submit", "--hold", "-G", "0", "--id", "kept", "-t", "2-12:30", "-c", "1", "--mem", "1000", "--", "true")
    waiting = queue.gpuq("submit", "-G", "0", "--id", "waiting", "-t", "45", "-d", "afterok:kept", "--", "true")
    assert waiting.stdout.split()[-1] == "waiting"
    for job_id, limit in (("kept", "2-12:30:00"), ("waiting", "00:45:00")):
        shown = queue.gpuq("show", job_id).stdout
        assert f"time_limit:       {limit}" in shown and "command:          true" in shown, shown
    kept = json.loads(queue.gpuq("show", "kept", "--json").stdout)
    assert (kept["state"], kept["time_limit_s"], kept["cpus"], kept["mem_limit_mib"]) == (
        "held",
        216000 + 1800,
        1,
        1000,
    )
    # More cores or memory than any box has: refused at submit, as more GPU memory is.
    for option, value, says in (("-c", "512", "no box has 512 cores"), ("--mem", "100T", "has 102400GiB of memory")):
        refused = queue.gpuq("submit", "-G", "0", option, value, "--", "true", check=False)
        assert refused.returncode == 2 and says in refused.stderr and "the most is" in refused.stderr, refused
    # sbatch's options gpuq has no such thing for: what to do instead, and nothing written.
    for option, instead in (
        ("--partition=gpu", "--hosts a,b picks the boxes"),
        ("--output=train.out", "gpuq logs ID"),
        ("--mail-type=END", "gpuq wait ID; mail"),
    ):
        refused = queue.gpuq("submit", option, "-G", "0", "--", "true", check=False)
        assert refused.returncode == 2 and f"sbatch's {option.split('=')[0]} is not one gpuq has" in refused.stderr
        assert instead in refused.stderr and "Nothing was written" in refused.stderr


@pytest.mark.slow
def test_a_command_the_shell_cannot_find_says_why_with_its_path(queue):
    queue.start_worker("a", "1x80GiB")
    queue.drop("typo.yaml", "command: no-such-command-gpuq --flag\ngpus: 0\nenv: {PATH: /usr/bin:/bin}\n")
    record = wait_until(lambda: queue.finished("typo"), timeout=60, what="typo to end")
    assert record["state"] == "failed" and record["exit_code"] == 127
    assert record["reason"].startswith(
        "exit 127: no such command was found; the job's PATH was /usr/bin:/bin and it ran in "
    )
    assert "==> gpuq: exit 127: no such command was found" in queue.log("typo")
    assert "no such command" in queue.gpuq("show", "typo").stdout
    queue.drop("fine.yaml", "command: exit 3\ngpus: 0\n")
    assert wait_until(lambda: queue.finished("fine"), timeout=60)["reason"] is None  # other exits: no note


@pytest.mark.slow
def test_logs_of_a_group_and_following_a_job_that_has_not_started(queue):
    out = queue.gpuq("submit", "--gpus", "0", "--name", "arr", "--array", "0-2", "--", "echo index=$GPUQ_ARRAY_INDEX")
    group = out.stdout.strip().splitlines()[-1]
    queue.gpuq("submit", "--gpus", "0", "--id", "later", "--", "echo later ran")
    follow = subprocess.Popen(
        [PY, str(REPO / "gpuq.py"), "--root", str(queue.root), "logs", "-f", "later"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=queue.env(),
    )
    first = follow.stderr.readline()  # said at once, before any worker runs it
    assert first.startswith("gpuq logs: later is pending: ") and "following its log" in first
    # The array is one spec until a worker expands it: following it then follows its members
    # (it followed a log under the array's own id, which never comes, and hung).
    members = subprocess.Popen(
        [PY, str(REPO / "gpuq.py"), "--root", str(queue.root), "logs", "-f", group],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=queue.env(),
    )
    assert "is pending: an array: the next worker pass turns it into its jobs" in members.stderr.readline()
    queue.start_worker("a", "1x80GiB")
    out, _ = follow.communicate(timeout=120)
    assert follow.returncode == 0 and "later ran" in out
    followed, _ = members.communicate(timeout=120)
    assert members.returncode == 0 and all(f"index={i}" in followed for i in range(3)), followed
    queue.gpuq("wait", group, timeout=120)
    logs = queue.gpuq("logs", group).stdout
    heads = [line for line in logs.splitlines() if line.startswith("==> ") and line.endswith(" <==")]
    assert heads == [f"==> {group}_{i} <==" for i in range(3)]
    for i in range(3):
        assert f"index={i}" in logs.split(f"==> {group}_{i} <==")[1]


def _array_behind_a_sleeper(queue, size: int) -> str:
    """A worker, a job `first` that sleeps, and an array of `size` waiting for it: its id, once
    the worker has expanded it into pending members."""
    queue.start_worker("a", "1x80GiB")
    queue.gpuq("submit", "--gpus", "0", "--id", "first", "--", "sleep 600")
    group = queue.gpuq(
        "submit",
        "--gpus",
        "0",
        "--name",
        "arr",
        "--array",
        f"0-{size - 1}",
        "--after",
        "first",
        "--",
        "echo member ran",
    ).stdout.split()[-1]
    wait_until(
        lambda: len([p for p in queue.status()["pending"] if p["id"].startswith(f"{group}_")]) == size,
        what="the array's members",
    )
    return group


@pytest.mark.slow
def test_logs_of_a_group_that_has_not_started_says_what_its_members_wait_for(queue):
    """An audit as a newcomer: `logs GROUP` printed nothing and `logs -f GROUP` was silent
    while the members waited (only a single job said what it waited for)."""
    group = _array_behind_a_sleeper(queue, 2)
    quiet = queue.gpuq("logs", group)
    assert quiet.stdout == "" and f"2 of {group}'s 2 members have no output yet: {group}_0, {group}_1" in quiet.stderr
    follow = subprocess.Popen(
        [PY, str(REPO / "gpuq.py"), "--root", str(queue.root), "logs", "-f", group],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=queue.env(),
    )
    said = [follow.stderr.readline() for _ in range(2)]
    for i, line in enumerate(said):
        assert line.startswith(f"gpuq logs: {group}_{i} is pending: ") and "first" in line, said
    queue.gpuq("cancel", "first")  # the members can never start now: cancelled, and the follow ends
    out, _ = follow.communicate(timeout=120)
    assert follow.returncode == 1  # `logs -f` exits as the jobs ended: cancelled members, not all done


def test_a_rejected_spec_is_retried_after_its_fix_and_leaves_the_rejected_list(tmp_path):
    root = tmp_path / "root"
    box = PassWorker(root, "a", "1x80GiB", allow_root_jobs=False)  # root's specs are refused (the tests run as root)
    box.drop("mine.yaml", "command: echo mine ran\ngpus: 0\n")
    box.drop("typo.yaml", "command: echo typo ran\ngpus: two\n")
    box.run_pass()
    box.run_pass(after_s=2)  # past spec_settle_s
    assert {r["id"] for r in status(root)["rejected"]} == {"mine", "typo"}
    said = (root / "state" / "rejected" / "typo.error").read_text()  # where the spec is now, and how back
    assert said.rstrip().endswith(
        "The spec is kept as state/rejected/typo.yaml: fix it there, writing into the file itself (an editor; "
        "not sed -i, which needs to write beside it), or drop a fixed one, then `gpuq retry typo`."
    ), said
    early = gpuq(root, "retry", "typo", check=False)  # its text is wrong: refused again
    assert early.returncode == 0 and "back in the queue, to be checked again" in early.stdout
    assert not (root / "state" / "rejected" / "typo.error").exists()
    box.run_pass(after_s=2)
    assert (root / "state" / "rejected" / "typo.error").exists()
    # The admin's fix, read by the worker at its start: the box's worker starts again with it.
    box = PassWorker(root, "a", "1x80GiB", allow_root_jobs=True)
    box.run_pass(after_s=1)
    done = gpuq(root, "retry", "mine")
    assert "mine: its refused spec is back in the queue" in done.stdout
    box.drop("typo.yaml", "command: echo typo ran\ngpus: 0\n")  # the user's fix: dropped anew
    box.run_pass(after_s=2)
    assert sorted(box.launched()) == ["mine", "typo"]
    for job_id in ("mine", "typo"):
        assert box.finish(job_id).state is State.DONE
    box.run_pass(after_s=1)
    assert status(root)["rejected"] == []  # both lived on: their REJECTED lines are gone
    assert "REJECTED" not in gpuq(root, "status").stdout


@pytest.mark.slow
def test_forget_takes_a_decommissioned_host_off_the_list_but_not_a_live_one_or_one_with_jobs(queue):
    queue.write_config(lost_after_s=300)  # nothing is taken over during the test
    queue.start_worker("a", "1x80GiB")
    queue.start_worker("b", "1x80GiB")
    go = queue.root / "go"
    queue.drop("there.yaml", f"command: while [ ! -e {go} ]; do sleep 0.1; done\ngpus: 1\nhosts: [b]\n")
    wait_until(lambda: (queue.record("there") or {}).get("state") == "running", what="a job on b")
    # Its supervisor has it (its log is open): a supervisor still being handed its job when b's
    # worker dies goes with b's spawner, and the job waits for lost_after_s instead.
    wait_until(lambda: (queue.root / "logs" / "there.log").exists(), what="there's supervisor to start it")
    alive = queue.gpuq("forget", "a", check=False)
    assert alive.returncode == 1 and "a's worker is alive" in alive.stdout + alive.stderr
    queue.kill_worker("b", silent_s=LIVE_WINDOW_S)  # b dies with a job recorded running there
    wait_until(
        lambda: not any(h["alive"] for h in queue.status()["hosts"] if h["host"] == "b"),
        timeout=60,
        what="b to be seen dead",
    )
    busy = queue.gpuq("forget", "b", check=False)
    assert busy.returncode == 1 and "still has 1 job(s) recorded running (there)" in busy.stdout + busy.stderr
    # Its supervisor outlived b's worker (as supervisors do): the job ends and is recorded, and
    # nothing keeps b any more. (A cancel would wait for b's worker, which is gone.)
    go.touch()
    wait_until(lambda: queue.finished("there"), timeout=60, what="there to be settled")
    done = queue.gpuq("forget", "b")
    assert "b: forgotten" in done.stdout
    assert [h["host"] for h in queue.status()["hosts"]] == ["a"]
    state = queue.root / "state"  # nothing of b is left but its events (reports count its past)
    assert [p.name for p in (state / "workers").iterdir() if p.name.startswith("b.")] == []
    assert not (state / "control" / "b").exists()
    again = queue.gpuq("forget", "b", check=False)
    assert again.returncode == 1 and "no host named 'b'" in again.stdout + again.stderr


def test_show_folds_a_long_environment_and_lists_it_whole_with_env(tmp_path):
    root = PassWorker(tmp_path / "root", "a", "1x80GiB").root  # no pass: submit and show only read the spool
    # A submit exports the submitter's shell: here 30 variables of their own besides the rest.
    shell = {**{f"MY_SETTING_{i}": f"value-{i}" for i in range(30)}, "PATH": "/opt/tools/bin:/usr/bin:/bin"}
    gpuq(root, "submit", "--gpus", "1", "--id", "wide-env", "--", "python train.py", env=shell)
    folded = gpuq(root, "show", "wide-env").stdout
    env_lines = [line.strip() for line in folded.splitlines() if "=" in line and line.startswith(" ")]
    assert "PATH=/opt/tools/bin:/usr/bin:/bin" in env_lines and "CUDA_VISIBLE_DEVICES=0" in env_lines, folded
    assert "GPUQ_GPU_MEM_MIB=<its GPU's usable MiB>" in env_lines, folded  # a whole GPU's, not 0
    assert not any(line.startswith("MY_SETTING_") for line in env_lines), folded
    more = [line for line in folded.splitlines() if "more (all of them: gpuq show wide-env --env)" in line]
    assert len(more) == 1 and int(more[0].split("and ")[1].split()[0]) >= 30, more  # folded into one line
    whole = gpuq(root, "show", "wide-env", "--env").stdout
    assert all(f"MY_SETTING_{i}=value-{i}" in whole for i in range(30)) and "more (all of them" not in whole
    short = gpuq(root, "submit", "--gpus", "1", "--id", "short-env", "--export", "NONE", "--", "true")
    assert short.returncode == 0
    assert "more (all of them" not in gpuq(root, "show", "short-env").stdout  # a short one is shown whole


def test_one_size_rule_and_show_prints_what_was_asked(tmp_path):
    """Newcomer review: `8gb` and `8GB` gave 7.5 GiB while `8g` gave 8 GiB, and show printed
    7.5GiB. Every spelling of 8 gigabytes is 8 GiB, in submit and in a dropped spec."""
    team = Team(tmp_path / "root")
    team.add("a", "1x80GiB")
    root = team.root
    for i, size in enumerate(("8g", "8G", "8GB", "8gb", "8GiB", "8192MiB", "8192mb")):
        gpuq(root, "submit", "--gpus", "1", "--gpu-mem", size, "--id", f"size-{i}", "--", "true")
        shown = gpuq(root, "show", f"size-{i}").stdout
        assert "gpu_mem:          8GiB" in shown, (size, shown)
    team.drop("dropped.yaml", "command: 'true'\ngpus: 1\ngpu_mem: 8GB\nmem: 2gb\nenv: {A: '1'}\n")
    team.run_until(lambda: team.finished("dropped"))
    record = team.finished("dropped")
    assert record is not None
    assert record.spec["gpu_mem_mib"] == 8192 and record.spec["mem_mib"] == 2048, record.spec
    shown = gpuq(root, "show", "dropped").stdout
    assert "gpus:             1 (index 0)" in shown  # how many, and which
    assert "env:              1 variables from the spec (gpuq show dropped --env lists the whole environment)" in shown
    bad = gpuq(root, "submit", "--gpus", "1", "--gpu-mem", "8 bananas", "--", "true", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("gpuq submit: --gpu-mem:") and "20GiB" in bad.stderr


def test_every_refusal_names_its_verb_and_exits_1(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    box.run_pass()
    # (edit holds first: still "edit"; unbook's: the bookings extra's tests)
    for verb in ("cancel", "hold", "release", "retry", "edit"):
        done = gpuq(box.root, verb, "no-such-job", check=False)
        assert done.returncode == 1 and done.stderr.startswith(f"gpuq {verb}: "), (verb, done.stderr)
        if verb == "edit":  # its refusal speaks of editing, not only of holding
            assert "can be held or edited" in done.stderr, done.stderr


def test_submit_hold_keeps_the_job_from_starting_until_released(tmp_path):
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    box.run_pass()
    root = box.root
    held = gpuq(root, "submit", "--hold", "--gpus", "1", "--id", "h1", "--", "echo ran-h1")
    assert held.stdout == "h1\n" and "h1 is held: `gpuq release h1` puts it in the queue" in held.stderr, held
    assert not list((root / "jobs").iterdir())  # never through jobs/: nothing another member could take
    assert [h["id"] for h in status(root)["held"]] == ["h1"] and "HELD (1" in gpuq(root, "status").stdout
    for _ in range(3):  # whole passes with a free GPU: it never started
        box.run_pass(after_s=1)
    assert box.launched() == [] and not (root / "state" / "running" / "h1.json").exists()
    gpuq(root, "release", "h1")
    box.run_pass(after_s=2)
    assert box.launched() == ["h1"] and box.finish("h1").state is State.DONE
    spec = root.parent / "from-file.yaml"
    spec.write_text("command: echo ran-h5\ngpus: 0\n")
    assert gpuq(root, "submit", "--hold", "--spec", str(spec)).stdout.splitlines()[-1] == "from-file-1"
    assert [h["id"] for h in status(root)["held"]] == ["from-file-1"]


@pytest.mark.slow
def test_submit_hold_with_no_worker_waits_and_never_starts_the_job(team):
    """A member's hold request waits for a worker (root's own CLI would apply it itself)."""
    team.start_worker("a", "1x80GiB")
    team.stop_worker("a")  # a box the queue knows, with its worker down
    waiting = team.as_user(ALICE, "submit", "--hold", "--gpus", "1", "--id", "h2", "--", "echo ran-h2")
    assert waiting.returncode == 3 and waiting.stdout.splitlines()[-1] == "h2", (waiting.stdout, waiting.stderr)
    assert "request" in waiting.stderr and "waits" in waiting.stderr
    assert not (team.root / "jobs" / "h2.yaml").exists()  # nothing a worker could start
    team.start_worker("a", "1x80GiB")
    wait_until(
        lambda: [(h["id"], h["user"]) for h in team.status()["held"]] == [("h2", ALICE)],
        what="h2 held by the worker, as alice's",
    )
    team.wait_passes("a", 2)
    assert team.record("h2") is None and "ran-h2" not in team.log("h2")
    again = team.as_user(ALICE, "submit", "--hold", "--gpus", "1", "--id", "h2", "--", "true")
    assert again.returncode == 2 and "already used" in again.stderr
    # A held array (sbatch --hold --array): hers, and its members hers once she releases it.
    group = team.as_user(ALICE, "submit", "--hold", "--gpus", "0", "--array", "0-2", "--", "true").stdout.split()[-1]
    wait_until(lambda: (group, ALICE) in [(h["id"], h["user"]) for h in team.status()["held"]], what="held array")
    assert team.as_user(ALICE, "release", group).returncode == 0
    for member in (f"{group}_{i}" for i in range(3)):
        record = wait_until(lambda m=member: team.finished(m), timeout=90, what=member)
        assert record["state"] == "done" and record["user"] == ALICE


@pytest.mark.slow
def test_messages_point_at_the_fix(queue, tmp_path):
    """The newcomer review's CLI errors: each names the verb and the fix that applies."""
    none_yet = queue.gpuq("status").stdout
    assert "no worker has run yet" in none_yet and "python worker.py" not in none_yet
    unknown = queue.gpuq("submit", "--gpu-memory", "8G", "--", "true", check=False)
    assert unknown.returncode == 2 and unknown.stderr.startswith("usage: gpuq submit"), unknown.stderr
    assert "gpuq submit: error: unrecognized arguments: --gpu-memory" in unknown.stderr
    habits = (("squeue", "Slurm's squeue is gpuq status"), ("sprio", "Slurm's sprio is gpuq status --shares"))
    for slurm, says in habits:
        habit = queue.gpuq(slurm, check=False)
        assert habit.returncode == 2 and says in habit.stderr, habit.stderr
    queue.start_worker("box-a", "1x80GiB")
    nowhere = queue.gpuq("submit", "--hosts", "box-z", "--", "true", check=False)
    assert nowhere.returncode == 2 and "Fix: --hosts names boxes gpuq knows: box-a." in nowhere.stderr
    assert "less memory" not in nowhere.stderr
    cpu_nowhere = queue.gpuq("submit", "--gpus", "0", "--hosts", "box-z", "--", "true", check=False)
    assert cpu_nowhere.returncode == 2 and "Fix: --hosts names boxes gpuq knows: box-a." in cpu_nowhere.stderr
    assert not list((queue.root / "jobs").glob("*.yaml"))  # neither was written
    tabbed = tmp_path / "tabbed.yaml"
    tabbed.write_text("command: echo\n\tgpus: 1\n")
    tab = queue.gpuq("submit", "--spec", str(tabbed), check=False)
    assert (
        tab.returncode == 2 and "Fix: indent with spaces: YAML does not allow tabs. Nothing was written." in tab.stderr
    )
    nowhere_dir = queue.gpuq("submit", "--workdir", str(tmp_path / "no-such-dir"), "--gpus", "0", "--", "true")
    assert "warning: --workdir" in nowhere_dir.stderr and "is not a directory here" in nowhere_dir.stderr
    init = queue.gpuq("init", str(tmp_path / "new-root"))
    assert f"export GPUQ_ROOT={tmp_path / 'new-root'}" in init.stdout  # for every command after it


def test_a_retried_job_shows_where_it_is_now_not_also_as_finished(tmp_path):
    """Newcomer review: a retried job appeared both in PENDING and in FINISHED."""
    box = PassWorker(tmp_path / "root", "a", "1x80GiB")
    gpuq(box.root, "submit", "--gpus", "0", "--id", "flaky", "--", "exit 1")
    box.run_pass(after_s=2)
    assert box.finish("flaky", exit_code=1).state is State.FAILED
    box.run_pass(after_s=1)
    gpuq(box.root, "retry", "flaky")  # no pass after it: it waits in the queue while we look
    view = status(box.root)
    assert [p["id"] for p in view["pending"]] == ["flaky"], view["pending"]
    assert "flaky" not in [f["id"] for f in view["finished"]], view["finished"]


def test_an_ended_jobs_id_is_kept_and_the_refusal_says_how_to_run_it_again(tmp_path):
    """Newcomer review: a cancelled --id "can never be reused". Its record and log keep the
    id (a second job of that id would overwrite them), so submit refuses it and names the
    way to run it again, which works."""
    team = Team(tmp_path / "root", lambda record: FOREVER)
    box = team.add("a", "1x80GiB")
    root = team.root
    gpuq(root, "submit", "--gpus", "0", "--id", "sz-test", "--", "sleep 30")
    team.run_until(lambda: team.running())
    gpuq(root, "cancel", "sz-test")
    team.run_until(lambda: team.finished("sz-test"))
    assert (record := team.finished("sz-test")) is not None and record.state is State.CANCELLED
    again = gpuq(root, "submit", "--gpus", "0", "--id", "sz-test", "--", "true", check=False)
    assert again.returncode == 2 and "already used" in again.stderr and "gpuq retry sz-test" in again.stderr
    assert again.stderr.startswith("gpuq submit:"), again.stderr
    gpuq(root, "retry", "sz-test")
    team.run_until(lambda: [r for r in team.running() if r.attempt == 2])
    assert [(r.id, r.attempt) for r in box.spawner.launched] == [("sz-test", 1), ("sz-test", 2)]
    # a rejected spec keeps its own id, not every id it starts with (ids hold dots)
    team.drop("data.v2.yaml", "command: 'true'\ngpus: two\n")
    team.run_until((root / "state" / "rejected" / "data.v2.error").exists)
    assert gpuq(root, "submit", "--gpus", "0", "--id", "data", "--", "true").stdout.split() == ["data"]
    taken = gpuq(root, "submit", "--gpus", "0", "--id", "data.v2", "--", "true", check=False)
    assert taken.returncode == 2 and "already used" in taken.stderr


@pytest.mark.slow
def test_a_held_submission_cannot_take_another_members_id_nor_lose_its_own(team):
    """Attacks on `submit --hold` (a helper's, as team members): alice sends the request by
    hand for bob's pending job's id; bob drops a spec under the id of alice's held submission
    while it waits for a worker. Neither job runs as the other, and nothing is taken over."""
    team.start_worker("a", "1x80GiB")
    assert team.as_user(BOB, "submit", "--gpus", "0", "--id", "first", "--", "sleep 30").returncode == 0
    bobs = team.as_user(BOB, "submit", "--gpus", "0", "--id", "bobjob", "--after", "first", "--", "echo bob-ran")
    assert bobs.returncode == 0, bobs.stderr
    script = (
        f"import json, os, sys, time; sys.path.insert(0, {str(team.code)!r})\n"
        "from gpuq.spool.inbox import read_reply, send\nfrom gpuq.spool.layout import Layout\n"
        f"layout = Layout(__import__('pathlib').Path({str(team.root)!r}))\n"
        "name = send(layout, 'submit-held', ('bobjob',), sent_from='x', text='command: echo alice-ran\\n')\n"
        "for _ in range(600):\n    reply = read_reply(layout, name, os.geteuid())\n"
        "    if reply: break\n    time.sleep(0.1)\n"
        "print(json.dumps(reply.outcomes))\n"
    )
    attack = team.py_as(ALICE, script, timeout=120)
    assert attack.returncode == 0, attack.stderr
    ((ok, message),) = json.loads(attack.stdout)
    assert not ok and "the id is used by another job" in message, message
    assert [(p["id"], p["user"]) for p in team.status()["pending"]] == [("bobjob", BOB)] and not team.status()["held"]
    assert team.as_user(ALICE, "cancel", "bobjob").returncode == 1
    assert team.as_user(BOB, "cancel", "bobjob", "first").returncode == 0
    team.stop_worker("a")
    waiting = team.as_user(ALICE, "submit", "--hold", "--gpus", "0", "--id", "xjob", "--", "echo alice-ran")
    assert waiting.returncode == 3, waiting.stderr  # waits for a worker; nothing is in jobs/ meanwhile
    assert not list((team.root / "jobs").glob("*xjob*"))
    team.drop_as(BOB, "xjob.yaml", "command: echo bob-took-it\ngpus: 0\n")  # bob takes the id first
    team.start_worker("a", "1x80GiB")
    record = wait_until(lambda: team.finished("xjob"), what="bob's xjob")
    assert record["user"] == BOB and "alice-ran" not in team.log("xjob")
    team.wait_passes("a", 2)  # alice's request was applied (refused): no held job of hers under that id
    assert not team.status()["held"] and not (team.root / "state" / "held" / "xjob.yaml").exists()


def test_a_cancelled_array_is_one_line_of_finished(tmp_path):
    """Newcomer review: one array cancel filled FINISHED with a line per member."""
    team = Team(tmp_path / "root", lambda record: FOREVER)
    team.add("a", "1x80GiB")
    root = team.root
    gpuq(root, "submit", "--gpus", "0", "--id", "first", "--", "sleep 600")
    array = ["--name", "arr", "--array", "0-5", "--after", "first", "--", "echo member ran"]
    group = gpuq(root, "submit", "--gpus", "0", *array).stdout.split()[-1]
    team.run_until(lambda: len([p for p in status(root)["pending"] if p["id"].startswith(f"{group}_")]) == 6)
    gpuq(root, "cancel", group)
    assert len([f for f in status(root)["finished"] if f["state"] == "cancelled"]) == 6
    lines = [line for line in gpuq(root, "status").stdout.splitlines() if f"{group}_" in line]
    assert len(lines) == 1 and f"{group}_* (all 6 members)" in lines[0] and "cancelled" in lines[0], lines
    with open(root / "config.yaml", "a") as config:  # FINISHED lists fewer than the array has: it says so
        config.write("recent_finished: 4\n")
    lines = [line for line in gpuq(root, "status").stdout.splitlines() if f"{group}_" in line]
    assert len(lines) == 1 and f"{group}_* (the latest 4 of its 6 members)" in lines[0], lines


@pytest.mark.slow
def test_status_says_a_cleanly_stopped_worker_stopped_and_a_killed_one_is_not_responding(queue):
    """Newcomer review: status called a worker that exited cleanly NOT RESPONDING, while doctor
    knew it had stopped (its last heartbeat says so)."""
    queue.write_config(lost_after_s=300)  # nothing is taken over during the test
    queue.start_worker("a", "1x80GiB")
    queue.start_worker("b", "1x80GiB")
    wait_until(lambda: {h["host"] for h in queue.status()["hosts"]} == {"a", "b"}, what="both boxes seen")
    queue.stop_worker("a")  # SIGTERM: a clean exit
    queue.kill_worker("b", silent_s=LIVE_WINDOW_S)
    hosts = wait_until(
        lambda: (
            (hs := {h["host"]: h for h in queue.status()["hosts"]})
            and not hs["a"]["alive"]
            and not hs["b"]["alive"]
            and hs
        ),
        timeout=60,
        what="both seen gone",
    )
    assert hosts["a"]["stopped"] and not hosts["b"]["stopped"]
    text = queue.gpuq("status").stdout
    assert "  a  stopped (its worker exited cleanly)" in text and "  b  NOT RESPONDING" in text, text


def test_mem_and_cpus_are_held_on_the_box_until_the_job_ends(tmp_path):
    """sbatch's --mem and -c hold what they ask: a second job asking 60% of the box's memory
    waits while the first runs (a Slurm user's session: three such jobs ran at once)."""
    team = Team(tmp_path / "root", lambda record: FOREVER if record.id == "first" else Run())
    box = team.add("a", "4x80GiB")
    team.step()
    mem = f"{box.heartbeat()['mem_mib'] * 6 // 10}M"
    root = team.root
    first = gpuq(
        root, "submit", "--id", "first", "--gpu-mem", "1GiB", "--mem", mem, "--", "sleep", "300"
    ).stdout.strip()
    team.run_until(lambda: team.running())
    second = gpuq(root, "submit", "--gpu-mem", "1GiB", "--mem", mem, "--", "true").stdout.strip()
    for _ in range(3):  # whole passes with three GPUs free: it waits for memory
        team.step()
    assert box.launched() == [first]
    row = next(p for p in status(root)["pending"] if p["id"] == second)
    assert row["reason"].startswith("needs ") and "of host memory (--mem) on one box" in row["reason"], row
    gpuq(root, "cancel", first)
    team.run_until(lambda: team.finished(second))
    assert (ended := team.finished(second)) is not None and ended.state is State.DONE
