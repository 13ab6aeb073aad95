"""The attack review of 2026-12-05 (review F1-F5 and its medium findings; F1, a container's
client, is the containers extra's: its tests/test_attack_containers.py), as created members
against README's team setup: a root made by `gpuq init --group`, root workers, and bob, the
attacker, against alice. Each test was seen failing on the code before the privilege
boundary and these defences (docs/security.md)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from team import ALICE, BOB, needs_root

from conftest import wait_until

pytestmark = needs_root


# --- F3: nothing the worker trusts is the job's to write ----------------------------------------


def test_a_job_can_reach_neither_its_lock_file_nor_anything_the_worker_trusts(team, users):
    """F3a-d: the job inherited its root-owned lock file as fd 3, read-write, and wrote the
    markers the worker believed: a forged result (root wrote a file anywhere, ran bob's command
    as alice), a pid for root to SIGTERM, or "ended" (its GPU counted free). Now the job holds
    only its stdio, and the local directory is the queue account's alone."""
    victim = psutil.Popen(["sleep", "300"])  # a root process bob would have had root kill
    try:
        team.start_worker("a", "1x80GiB")
        local = team.local_base / "a"
        lock = local / "jobs" / "f3.lock"
        attack = f"""
import json, os
out = {{"fds": sorted(os.listdir('/proc/self/fd'))}}
for fd in range(3, 64):
    try:
        os.write(fd, json.dumps({{"claim": "x", "supervisor_pid": {victim.pid}, "ended": True,
                                "result": {{"state": "done", "id": "../../../pwned"}}}}).encode())
        out.setdefault("wrote", []).append(fd)
    except OSError:
        pass
try:
    open({str(lock)!r}, "r+").write("forged")
    out["lock"] = "written"
except OSError as e:
    out["lock"] = e.strerror
print(json.dumps(out))
"""
        script = team.base / "f3.py"
        script.write_text(attack)
        script.chmod(0o644)
        team.drop_as(BOB, "f3.yaml", f"command: [{team.python!r}, {str(script)!r}]\ngpus: 1\nworkdir: /\n")
        record = wait_until(lambda: team.finished("f3"), timeout=30, what="f3 to end")
        found = json.loads(team.log("f3").splitlines()[-2])
        assert record["state"] == "done", team.log("f3")
        assert "wrote" not in found and found["lock"] == "Permission denied", found
        assert set(found["fds"]) <= {"0", "1", "2", "3"}, found  # 3: the listing's own descriptor
        assert victim.is_running() and record["id"] == "f3" and record["uid"] == users[BOB].pw_uid
        assert not list(team.base.glob("pwned*")) and not Path("/pwned.json").exists()
    finally:
        victim.kill()
        victim.wait()


def test_every_way_a_record_is_built_is_checked():
    """F3a: a result carried `id: ../../..`, and dataclasses.replace built the record without
    Record.check: the id became a path. Now every construction is checked."""
    import dataclasses

    from gpuq.model.record import Record, RecordError
    from gpuq.model.states import State

    record = Record(id="ok", state=State.RUNNING, spec={})
    for bad in ({"id": "../../../rootonly/pwned"}, {"host": "../x"}, {"claim": "other@a@b@1@n@a1.yaml"}):
        with pytest.raises(RecordError):
            dataclasses.replace(record, **bad)
        with pytest.raises(RecordError):
            Record(**{"id": "ok", "state": State.RUNNING, "spec": {}, **bad})


def test_a_result_kept_in_the_lock_file_carries_no_identity():
    """F3b: a kept result's uid and spec_text were applied to the record: bob's command ran as
    alice at her retry. A result carries only a result's fields."""
    from gpuq.model.states import State
    from gpuq.run.joblocal import checked_result

    state, fields = checked_result(
        {"state": "done", "exit_code": 0, "uid": 1, "user": "alice", "spec_text": "command: id", "id": "../x"}
    )
    assert state is State.DONE and fields == {"exit_code": 0, "cause": None}
    with pytest.raises(ValueError):
        checked_result({"state": "running"})


# --- F5: events are read as events -------------------------------------------------------------


def test_a_forged_event_never_stops_status_or_show(team, users):
    """F5: an event with id `../../../rootonly/pwned` made every member's status and show exit
    with "cannot read .../finished/../../../rootonly/pwned.json". Now a line that is not an
    event is skipped, and said once. (`gpuq report` reads the same log: the reports extra's
    tests hold its case.)"""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "fine.yaml", "command: echo fine\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("fine"), what="fine to run")
    events = team.root / "state" / "events" / "z.jsonl"  # as if written into the spool somehow
    bad = [
        {"t": time.time(), "by": "a", "job": "../../../rootonly/pwned", "to": "done", "user": ALICE},
        {"t": time.time(), "by": "../b", "job": "x", "to": "failed"},
        "not json",
    ]
    compact = (",", ":")  # as gpuq writes events: status looks for `"to":"done"` before it parses
    events.write_text("\n".join(json.dumps(b, separators=compact) if isinstance(b, dict) else b for b in bad) + "\n")
    os.chown(events, os.stat(team.root / "state").st_uid, -1)
    for verb in (["status"], ["status", "--json"], ["show", "fine"]):
        done = team.as_user(BOB, *verb)
        assert done.returncode == 0, (verb, done.stderr)
    said = team.as_user(BOB, "status").stdout
    assert "z.jsonl: 2 line(s) that are not gpuq's events were skipped" in said, said


# --- medium findings ---------------------------------------------------------------------------


def test_only_admins_rank_a_job_above_everyones(team, users):
    """priority: high (or an integer above 0) was anyone's to set: it ranks before fair share and
    preempts others' jobs. Now a member's is refused, by submit and by the worker."""
    team.start_worker("a", "1x80GiB")
    for name, priority in (("hi", "high"), ("big", "1000")):
        team.drop_as(BOB, f"{name}.yaml", f"command: echo {name}\ngpus: 0\nworkdir: /\npriority: {priority}\n")
        refused = wait_until(lambda name=name: team.refusals(name), what=f"{name} refused")
        assert "only the queue's admins (config admins) may" in refused and "field 'priority'" in refused
    submitted = team.as_user(BOB, "submit", "--priority", "high", "--gpus", "0", "--", "true")
    assert submitted.returncode != 0 and "only the queue's admins" in submitted.stderr, submitted.stderr
    team.drop_as(BOB, "low.yaml", "command: echo low\ngpus: 0\nworkdir: /\npriority: -5\n")
    assert wait_until(lambda: team.finished("low"), what="a lower rank is anyone's")["state"] == "done"
    team.write_config(admins=[ALICE])
    team.stop_worker("a")
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "ahi.yaml", "command: echo ahi\ngpus: 0\nworkdir: /\npriority: high\n")
    assert wait_until(lambda: team.finished("ahi"), what="an admin's high")["state"] == "done"


def test_a_members_pending_specs_are_capped(team, users):
    """1600 pending 200 KB specs filled every worker's memory (and every status). Now a
    member's pending specs are capped by count and by size, naming the limit."""
    team.write_config(max_pending_per_user=3, max_pending_size_per_user="1MiB")
    team.start_worker("a", "1x80GiB")
    never = "command: sleep 1\ngpus: 8\nworkdir: /\n"  # fits no box: pending for good
    for i in range(4):
        team.drop_as(BOB, f"p{i}.yaml", never)
    refused = wait_until(lambda: "".join(team.refusals(f"p{i}") for i in range(4)), what="one over the count")
    assert "over config max_pending_per_user 3" in refused
    assert len([j for j in team.status()["pending"] if j["user"] == BOB]) == 3
    team.drop_as(ALICE, "a0.yaml", never)  # another member's room is her own
    wait_until(lambda: any(j["id"] == "a0" for j in team.status()["pending"]), what="alice's spec pending")
    team.write_config(max_pending_per_user=100, max_pending_size_per_user="1MiB")
    team.stop_worker("a")
    team.start_worker("a", "1x80GiB")
    big = team.base / "big.yaml"  # 200 KiB each: five fit in 1 MiB together, a sixth does not
    big.write_text(never + "# " + "x" * (200 * 1024) + "\n")
    big.chmod(0o644)
    names = [f"big{i}" for i in range(6)]
    for name in names:
        copied = team.run_as(ALICE, ["cp", str(big), str(team.root / "jobs" / f"{name}.yaml")])
        assert copied.returncode == 0, copied.stderr
    refused = wait_until(lambda: "".join(team.refusals(n) for n in names), what="one too big")
    assert "over config max_pending_size_per_user 1MiB" in refused, refused
    assert sum(bool(team.refusals(n)) for n in names) == 1


def test_another_members_file_under_a_missing_dependency_releases_nothing(team, users):
    """alice's hand-written `after: [alprep]` waited "no such job yet"; bob dropped
    jobs/alprep.yaml (echo) and her dependent ran at once. A dependency is met only by a job
    of her own, or one that was in the queue before hers."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "dependent.yaml", "command: echo dependent\ngpus: 0\nworkdir: /\nafter: [alprep]\n")
    wait_until(lambda: any(j["id"] == "dependent" for j in team.status()["pending"]), what="dependent waiting")
    team.drop_as(BOB, "alprep.yaml", "command: echo bobs\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("alprep"), what="bob's alprep to run")
    team.wait_passes("a")
    waiting = next(j for j in team.status()["pending"] if j["id"] == "dependent")
    assert f"alprep is {BOB}'s, queued after this one" in waiting["reason"], waiting
    assert team.finished("dependent") is None
    # A teammate's job that was there first is met as before (pipelines across members).
    team.drop_as(BOB, "bprep.yaml", "command: sleep 2\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.record("bprep"), what="bob's bprep taken in")
    team.drop_as(ALICE, "after-b.yaml", "command: echo after-b\ngpus: 0\nworkdir: /\nafter: [bprep]\n")
    assert wait_until(lambda: team.finished("after-b"), timeout=30, what="after-b")["state"] == "done"


def test_logs_of_a_huge_sparse_log_stream_in_bounded_memory(team, users):
    """bob's `truncate -s 512M` of his own log: alice's `gpuq logs` of it grew to 7.8 GB RSS
    (the whole file read, then decoded). Now it streams a MiB at a time (64 MiB here: the
    escaping of a NUL a byte takes time, not memory)."""
    team.start_worker("a", "1x80GiB")
    team.drop_as(BOB, "big.yaml", "command: echo start\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("big"), what="big to run")
    truncated = team.run_as(BOB, ["truncate", "-s", "64M", str(team.root / "logs" / "big.log")])
    assert truncated.returncode == 0, truncated.stderr
    code = (
        "import resource, subprocess, sys\n"
        f"p = subprocess.run([{team.python!r}, {str(team.code / 'gpuq.py')!r}, '--root', {str(team.root)!r},"
        " 'logs', 'big'], stdout=subprocess.DEVNULL)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = team.py_as(ALICE, code, timeout=300)
    rc, peak_kib = map(int, done.stdout.split())
    assert rc == 0 and peak_kib < 100 * 1024, (rc, peak_kib, done.stderr)  # the whole file: 400 MB


def test_a_spec_of_nobody_or_a_system_account_is_refused(team, users):
    """A squashed NFS root writes as `nobody`, and an unmapped uid shows as one: such a spec
    ran as nobody, unattributed and outside every cap."""
    team.start_worker("a", "1x80GiB")
    for name, owner in (("nb", "nobody"), ("sys", "daemon")):
        path = team.root / "jobs" / f"{name}.yaml"
        path.write_text("command: echo ran\ngpus: 0\nworkdir: /\n")
        os.chown(path, int(__import__("pwd").getpwnam(owner).pw_uid), -1)
        refused = wait_until(lambda name=name: team.refusals(name), what=f"{name} refused")
        assert "a system account or nobody" in refused, refused
        assert team.finished(name) is None or team.finished(name)["state"] == "rejected"


# --- the chaos run: what outlives a supervisor ---------------------------------------------------

LEDGER = (
    "command: |\n  echo start $GPUQ_ATTEMPT $(date +%s.%N) >> {ledger}\n"
    "  trap 'echo end $GPUQ_ATTEMPT $(date +%s.%N) >> {ledger}; exit 143' TERM\n"
    "  while true; do sleep 0.05; done\n"
    "gpus: 1\nworkdir: /\nretries: 1\n"
)


def test_a_job_whose_supervisor_and_worker_died_is_fenced_before_another_box_runs_it(team, users):
    """The chaos review: a job's supervisor SIGKILLed, then its box's worker kept down past
    lost_after_s: another box started attempt 2 while attempt 1 ran on (both to the end). The
    keeper that started attempt 1 stops it at 60% of lost_after_s, before the takeover."""
    ledger_dir = team.base / "ledger"
    ledger_dir.mkdir(mode=0o777)
    ledger_dir.chmod(0o777)
    ledger = ledger_dir / "ledger"
    team.write_config(lost_after_s=10, grace_s=1)
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "j.yaml", LEDGER.format(ledger=ledger))
    wait_until(lambda: ledger.exists() and "start 1" in ledger.read_text(), what="attempt 1 on a")
    marker = json.loads((team.local_base / "a" / "jobs" / "j.lock").read_text())
    os.kill(marker["supervisor_pid"], signal.SIGKILL)
    team.stop_worker("a", signal.SIGKILL)  # and a stays down
    team.start_worker("b", "1x80GiB")
    wait_until(lambda: "start 2" in ledger.read_text(), timeout=60, what="attempt 2 on b")
    lines = [line.split() for line in ledger.read_text().splitlines()]
    ended_1 = next(float(t) for kind, attempt, t in lines if (kind, attempt) == ("end", "1"))
    started_2 = next(float(t) for kind, attempt, t in lines if (kind, attempt) == ("start", "2"))
    assert ended_1 < started_2, lines  # never two copies at once


# --- found by an attack session on the boundary itself -----------------------------------------


def test_the_admins_client_settings_are_in_no_process_arguments(team, users):
    """The spawner once took the worker's runtime settings as an argument: `ps` showed every
    local user the admin's container_env (a proxy's password, say)."""
    secret = "http://proxy:s3cret-in-config@proxy:3128"
    team.write_config(container_env={"HTTPS_PROXY": secret})
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "one.yaml", "command: sleep 1\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: team.finished("one"), what="a job, through the spawner")
    shown = [" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
    assert [c for c in shown if str(team.root) in c or "gpuq.run.spawner" in c]  # the team's processes are there
    assert not [c for c in shown if "s3cret-in-config" in c]
