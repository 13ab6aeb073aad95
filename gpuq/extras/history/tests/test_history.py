"""`gpuq history` (sacct for the queue): the read model over hand-written event logs, and the
verb through the real CLI and worker as two members. The moments and names it reads are the
core's (tests/test_moments_and_names.py)."""

from __future__ import annotations

import json
import time

import pytest
from team import ALICE, BOB

from conftest import wait_until
from gpuq.extras.history.cli import COLUMNS
from gpuq.extras.history.view import CLOCK_SLACK_S, HistoryFilter, history
from gpuq.spool.layout import Layout

NOW = time.mktime((2026, 12, 6, 15, 30, 0, 0, 0, -1))  # a Sunday afternoon, local time


def _local(*day_time: int) -> float:
    return time.mktime((*day_time, 0, 0, 0, -1)[:9])


def _event(t: float, job: str, to: str, **fields: object) -> str:
    return json.dumps({"t": t, "by": "box0", "job": job, "from": "running", "to": to, **fields}, separators=(",", ":"))


def _write_log(root, host: str, lines: list[str]) -> None:
    events = root / "state" / "events"
    events.mkdir(parents=True, exist_ok=True)
    (events / f"{host}.jsonl").write_text("".join(line + "\n" for line in lines))


def _ids(found: dict) -> list[str]:
    return [row["id"] for row in found["jobs"]]


def test_history_gives_each_job_its_last_end_attempts_and_preemptions(tmp_path):
    since = NOW - 3600
    run = {"user": "ana", "host": "box0", "gpus": [1], "attempt": 1}
    filler = [_event(since - 2 * CLOCK_SLACK_S - 9000 + i, f"old-{i}", "done", user="bo") for i in range(3000)]
    _write_log(
        tmp_path,
        "box0",
        [
            *filler,  # over 64 KiB before the window: found by bisection, never read
            _event(since - 100, "before-1", "done", user="ana", started_at=since - 200, ended_at=since - 100),
            _event(since + 10, "train-1", "pending", cause="preempted", **run),
            _event(
                since + 60,
                "train-1",
                "done",
                exit_code=0,
                started_at=since + 20,
                ended_at=since + 60,
                name="train",
                **run,
            ),
            # Begun long before the window, ended in it: in the window, as sacct selects.
            _event(
                since + 70, "long-1", "timeout", user="ana", started_at=since - 86400, ended_at=since + 70, signal=9
            ),
            _event(since + 75, "cut-1", "done", user="ana")[:70],  # torn by a crash
            _event(since + 80, "sweep-3_4", "failed", exit_code=2, user="bo", reason="exit 2"),  # no name: from the id
        ],
    )
    _write_log(
        tmp_path,
        "box1",
        [
            _event(since + 30, "retried-1", "failed", exit_code=1, user="bo", attempt=1, host="box1", gpus=[0]),
            _event(since + 90, "retried-1", "done", exit_code=0, user="bo", attempt=2, host="box1", gpus=[0, 1]),
        ],
    )
    layout = Layout(tmp_path)
    found = history(layout, HistoryFilter(since, NOW), NOW)
    assert sorted(_ids(found)) == ["long-1", "retried-1", "sweep-3_4", "train-1"]  # not before-1, nor the filler
    rows = {row["id"]: row for row in found["jobs"]}
    assert rows["train-1"]["preemptions"] == 1 and rows["train-1"]["elapsed_s"] == 40 and rows["train-1"]["gpus"] == [1]
    assert rows["retried-1"]["attempts"] == 2 and rows["retried-1"]["state"] == "done"
    assert rows["retried-1"]["host"] == "box1" and rows["retried-1"]["gpus"] == [0, 1]
    assert rows["sweep-3_4"]["name"] == "sweep" and rows["sweep-3_4"]["exit_code"] == 2
    assert rows["long-1"]["elapsed_s"] == 86400 + 70
    # Killed, it has no exit code: EXIT said "-" where `status` says sig9 (a member).
    assert [COLUMNS["exit"][1](rows[j]) for j in ("long-1", "sweep-3_4", "train-1")] == ["sig9", "2", "0"]
    assert found["skipped_events"] == {"box0.jsonl": 1}
    assert _ids(found)[0] == "long-1"  # oldest start first

    def only(**narrow: object) -> list[str]:
        return sorted(_ids(history(layout, HistoryFilter(since, NOW, **narrow), NOW)))  # type: ignore[arg-type]

    assert only(users=frozenset({"bo"})) == ["retried-1", "sweep-3_4"]
    assert only(states=frozenset({"failed", "timeout"})) == ["long-1", "sweep-3_4"]
    assert only(names=("sw*", "train")) == ["sweep-3_4", "train-1"]
    assert only(hosts=frozenset({"box1"})) == ["retried-1"]
    # The filler is all there when the window takes it in.
    assert len(history(layout, HistoryFilter(0, NOW), NOW)["jobs"]) == 3000 + 5


@pytest.mark.slow  # a worker and two members
def test_history_as_members_narrowed_and_in_chosen_columns(team):
    team.write_config(poll_interval=0.2)
    team.as_user(ALICE, "submit", "--gpus", "0", "-J", "prep", "--", "true")
    team.as_user(ALICE, "submit", "--gpus", "0", "--id", "al-long", "--", "sleep 300")
    team.as_user(BOB, "submit", "--gpus", "0", "-J", "eval", "--", "exit 3")
    team.start_worker("a", "1x80GiB")
    wait_until(
        lambda: team.finished("prep-1") and team.finished("eval-1") and team.record("al-long"),
        timeout=90,
        what="two jobs to end and one to run",
    )

    def rows(who: str, *args: str) -> list[dict]:
        done = team.as_user(who, "history", "--json", *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["jobs"]

    mine = {r["id"]: r for r in rows(ALICE, "--me")}
    assert set(mine) == {"prep-1", "al-long"}
    assert mine["prep-1"]["state"] == "done" and mine["prep-1"]["name"] == "prep" and mine["prep-1"]["host"] == "a"
    assert mine["al-long"]["state"] == "running" and mine["al-long"]["end"] is None
    failed = rows(ALICE, "--user", BOB, "--state", "F")  # sacct's code for failed
    assert [(r["id"], r["exit_code"], r["name"]) for r in failed] == [("eval-1", 3, "eval")]
    assert [r["id"] for r in rows(BOB, "--name", "pr*", "--since", "yesterday")] == ["prep-1"]
    assert rows(BOB, "--host", "elsewhere") == []
    text = team.as_user(BOB, "history", "-o", "JobID,ExitCode,state")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["ID", "EXIT", "STATE"] and ["eval-1", "3", "failed"] in [ln.split() for ln in lines]
    for args, says in (
        (["-o", "id,nope"], "--format nope: no such column"),
        (["--state", "pending"], "--state pending: not a state history lists"),
        (["--since", "soon"], "--since 'soon' is not a moment"),
        (["--since", "now", "--until", "yesterday"], "--until (yesterday) is before --since (now)"),
    ):
        refused = team.as_user(ALICE, "history", *args)
        assert refused.returncode == 2 and says in refused.stderr, (args, refused.stderr)
    team.as_user(ALICE, "cancel", "al-long")


@pytest.mark.slow  # a worker runs the job
def test_history_takes_sacct_spellings_and_shows_a_running_jobs_start(queue):
    """A Slurm user's findings: a running job had no START nor ELAPSED; `-j ID`,
    `--state COMPLETED` and `--format jobname%30` were refused."""
    queue.gpuq("submit", "--gpus", "0", "--id", "runner", "--", "sleep 120")
    queue.gpuq("submit", "--gpus", "0", "--id", "quick", "--", "true")
    queue.start_worker("a", "1x80GiB")
    wait_until(lambda: queue.finished("quick") and queue.record("runner"), timeout=90, what="quick to end")
    rows = json.loads(queue.gpuq("history", "-j", "runner", "--json").stdout)["jobs"]
    assert [(r["id"], r["state"]) for r in rows] == [("runner", "running")]
    assert rows[0]["start"] is not None and rows[0]["elapsed_s"] >= 0
    done = json.loads(queue.gpuq("history", "--state", "COMPLETED", "--json").stdout)["jobs"]
    assert [r["id"] for r in done] == ["quick"]
    named = queue.gpuq("history", "-j", "quick", "--format", "JobID,jobname%30,ExitCode")
    text = named.stdout.splitlines()
    assert text[0].split() == ["ID", "NAME", "EXIT"] and text[1].split() == ["quick", "quick", "0"]
    assert named.stderr == "1 job of those named (-j), whenever they ran\n"  # not "from 1970-01-01"
    piped = queue.gpuq("history", "-X", "-P", "-j", "quick", "--format", "JobID,ExitCode,NodeList").stdout
    assert piped == "ID|EXIT|HOST:GPUS\nquick|0|a:cpu\n"  # sacct -X -P; a CPU job is a:cpu here as in status
    queue.gpuq("cancel", "runner")
