"""Verbs that take filters, as scancel's -u/-t/-n (cancel, hold, release, retry), and `logs`
as people use tail: the last lines, a near id suggested, and `logs -f` ending with the job's
exit status. Through the real CLI and worker, as two members where owners matter."""

from __future__ import annotations

import json

import pytest
from team import ALICE, BOB

from conftest import wait_until, worker_argv

pytestmark = pytest.mark.slow  # workers and members' CLIs

BIG = ["--gpus", "1", "--gpu-mem", "100GiB"]  # fits no 80 GiB GPU: stays pending


def _pending(team, who: str) -> list[str]:
    view = json.loads(team.as_user(who, "status", "--json", "--all").stdout)
    return sorted(p["id"] for p in view["pending"])


def _held(team, who: str) -> list[str]:
    return sorted(h["id"] for h in json.loads(team.as_user(who, "status", "--json").stdout)["held"])


def test_filters_act_on_the_callers_matching_jobs_and_never_on_anothers(team):
    team.write_config(poll_interval=0.2)
    for who, name in ((ALICE, "sw"), (ALICE, "sw"), (ALICE, "other"), (BOB, "sw")):
        assert team.as_user(who, "submit", *BIG, "-J", name, "--", "true").returncode == 0
    team.as_user(ALICE, "submit", "--gpus", "0", "-J", "broken", "--", "exit 4")
    team.start_worker("a", "1x80GiB")
    wait_until(lambda: team.finished("broken-1"), timeout=90, what="the broken job to fail")

    held = team.as_user(ALICE, "hold", "--name", "sw")  # a filter alone: the caller's own jobs
    assert held.returncode == 0, held.stderr
    assert sorted(held.stdout.splitlines()) == [
        "sw-1: held (gpuq release sw-1 puts it back at its place)",
        "sw-2: held (gpuq release sw-2 puts it back at its place)",
    ]
    assert _held(team, ALICE) == ["sw-1", "sw-2"] and "sw-3" in _pending(team, BOB)

    # Another member's jobs, named: refused by the worker, one line each, nothing done.
    refused = team.as_user(ALICE, "cancel", "--user", BOB, "--state", "PD")
    assert refused.returncode == 1 and "sw-3" in refused.stderr and refused.stdout == "", refused
    assert "sw-3" in _pending(team, BOB)

    released = team.as_user(ALICE, "release", "--me", "sw-1", "other-1")  # ids and a filter: those it keeps
    assert released.returncode == 0 and released.stdout.startswith("sw-1: released"), released
    assert _held(team, ALICE) == ["sw-2"]

    none = team.as_user(ALICE, "cancel", "--me", "--name", "nothing-*")
    assert none.returncode == 1 and "no job matches --me (yours) --name nothing-*" in none.stderr
    wrong = team.as_user(ALICE, "hold", "--state", "running")
    assert wrong.returncode == 2 and "hold acts on jobs that are pending" in wrong.stderr
    bare = team.as_user(ALICE, "cancel")
    assert bare.returncode == 2 and "name the jobs" in bare.stderr

    retried = team.as_user(ALICE, "retry", "-t", "F")
    assert retried.returncode == 0 and retried.stdout.startswith("broken-1:"), retried
    wait_until(lambda: team.finished("broken-1"), timeout=90, what="the retried job to fail again")

    cancelled = team.as_user(ALICE, "cancel", "--me")  # pending, held and running: all of hers
    assert cancelled.returncode == 0, cancelled.stderr
    assert sorted(line.split(":")[0] for line in cancelled.stdout.splitlines()) == ["other-1", "sw-1", "sw-2"]
    assert _pending(team, ALICE) == ["sw-3"] and _held(team, ALICE) == []


def test_logs_last_lines_near_ids_and_follow_exits_as_the_job(queue):
    queue.gpuq("submit", "--gpus", "0", "--id", "counts", "--", "for i in $(seq 1 50); do echo line $i; done; exit 7")
    queue.gpuq("submit", "--gpus", "0", "--id", "fine", "--", "echo all good")
    queue.gpuq("submit", "--gpus", "0", "--name", "arr", "--array", "0-1", "--", "exit $GPUQ_ARRAY_INDEX")
    queue.start_worker("a", "1x80GiB")
    # Ended first: `-n 2 -f` gives the last two lines there are when it starts, as tail does, so
    # one that started before the job printed would give the log's header, then every line.
    wait_until(lambda: queue.finished("counts"), timeout=90, what="counts to end")
    followed = queue.gpuq("logs", "-f", "-n", "2", "counts", check=False, timeout=120)
    assert followed.returncode == 7, followed
    assert followed.stdout.splitlines()[0] == "line 50"  # the last two lines: line 50 and gpuq's ending line
    assert followed.stdout.splitlines()[1].startswith("==> exit 7")
    assert queue.gpuq("logs", "-f", "fine", check=False, timeout=120).returncode == 0
    assert queue.gpuq("logs", "-f", "arr-1", check=False, timeout=120).returncode == 1  # a member failed
    last = queue.gpuq("logs", "--lines", "3", "counts").stdout.splitlines()
    assert last[:2] == ["line 49", "line 50"] and len(last) == 3
    assert queue.gpuq("logs", "-n", "0", "counts").stdout == ""
    near = queue.gpuq("logs", "count", check=False)
    assert near.returncode == 1 and near.stderr == "gpuq logs: no job 'count'; did you mean counts?\n"
    bad = queue.gpuq("logs", "-n", "x", "counts", check=False)
    assert bad.returncode == 2 and "not a number of lines" in bad.stderr


def test_cancelling_an_array_whose_members_partly_ended_is_no_failure(queue):
    """A Slurm user's finding: `cancel GROUP` exited 1 because one member had ended (scancel: 0)."""
    queue.gpuq(
        "submit", "--gpus", "0", "--id", "arr", "--array", "0-2", "--", '[ "$GPUQ_ARRAY_INDEX" = 0 ] || sleep 300'
    )
    queue.start_worker("a", "1x80GiB")
    wait_until(lambda: queue.finished("arr_0") and queue.record("arr_1"), timeout=90, what="arr_0 to end")
    out = queue.gpuq("cancel", "arr", check=False)
    assert out.returncode == 0 and "1 of its jobs had ended already: arr_0" in out.stderr, out
    assert sorted(out.stdout.splitlines())[0].startswith("arr_1: cancel")
    assert queue.gpuq("cancel", "arr_0", check=False).returncode == 1  # named itself, it is a refusal


def test_a_filtered_cancel_waits_for_an_array_a_worker_is_still_writing(queue):
    """A Slurm user's session: `cancel --me -t PD` just after `submit --array 0-7` cancelled the
    members already written and left the rest to run (2 times in 17). The members are written
    here by the worker's own code, three first and the rest once the cancel has begun."""
    import os
    import subprocess
    import threading
    import time

    from gpuq.spool.layout import Layout
    from gpuq.spool.sweeps import EXPANDING_S, being_expanded, group_file, group_members, kept_spec, place_members

    layout = Layout(queue.root)
    once = subprocess.run([*worker_argv(queue.root, "a", "1x80GiB"), "--once"], env=queue.env(), timeout=120)
    assert once.returncode == 0  # the queue's state/ made, as a first pass makes it
    data = {"command": "sleep 600", "gpus": 0, "array": "0-7"}
    kind, members = group_members(data, "arr")
    kept_spec(layout, "arr").write_text("command: sleep 600\ngpus: 0\narray: 0-7\n")  # taken out of jobs/
    place_members(layout, "arr", kind, members[:3], os.getuid(), time.time())
    group_file(layout, "arr").unlink()  # three written, the record not yet
    cancel = subprocess.Popen(
        [*queue.cli_command(), "--root", str(queue.root), "cancel", "--me", "-t", "PD"],
        env=queue.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    rest = threading.Timer(1.5, place_members, (layout, "arr", kind, members, os.getuid(), time.time()))
    rest.start()
    try:
        rest.join()
        queue.start_worker("a", "1x80GiB")  # applies the request
        out, err = cancel.communicate(timeout=120)
    finally:
        rest.cancel()
        if cancel.poll() is None:
            cancel.kill()
            cancel.wait()
    assert cancel.returncode == 0, err
    assert sorted(out.split(":")[0] for out in out.splitlines()) == sorted(m for m, _ in members), out
    for member, _ in members:
        assert wait_until(lambda m=member: queue.finished(m), timeout=60, what=member)["state"] == "cancelled"
    # A spec a worker took and then refused (or died on) is not being written: nobody waits for it
    # (an attack review: one stranded array made every member's filtered verb wait 5 s).
    kept_spec(layout, "stuck").write_text("command: 'true'\ngpus: 0\narray: 0-1\n")
    assert being_expanded(layout, time.time()) == ["stuck"]
    assert being_expanded(layout, time.time() + EXPANDING_S + 1) == []
