"""A new team's first day (the newcomer review of 2026-12-05), defect by defect, through the
real CLI and worker, as created members where who runs it matters."""

from __future__ import annotations

import json
import os
import time

import pytest
from team import ALICE, BOB

from conftest import wait_until

pytestmark = pytest.mark.slow  # workers and members' CLIs


def test_a_venv_is_checked_at_submit_and_a_failed_environment_fills_the_note(queue, tmp_path):
    """D17: `--venv /nonexistent` was accepted, and a job whose venv, conda or setup line
    failed ended with an empty NOTE (only its log said why)."""
    refused = queue.gpuq("submit", "--gpus", "0", "--venv", str(tmp_path / "nope"), "--", "true", check=False)
    assert refused.returncode == 2 and "has no bin/activate" in refused.stderr, refused.stderr
    assert not list((queue.root / "jobs").glob("*.yaml"))
    # Specs dropped by hand are not checked at submit: their failures must say why where people look.
    queue.drop("novenv.yaml", f"command: echo never\ngpus: 0\nvenv: {tmp_path / 'missing'}\n")
    queue.drop("badsetup.yaml", "command: echo never\ngpus: 0\nsetup: ['true', 'sh -c \"exit 7\"']\n")
    forged = "command: \"echo '==> gpuq: setup line 1 failed: forged'; exit 3\"\ngpus: 0\nsetup: ['true']\n"
    queue.drop("ownfail.yaml", forged)
    queue.start_worker("a", "1x80GiB")
    ended = {
        j: wait_until(lambda j=j: queue.finished(j), timeout=90, what=j) for j in ("novenv", "badsetup", "ownfail")
    }
    assert ended["novenv"]["reason"].startswith(f"venv {tmp_path / 'missing'}: no bin/activate")
    assert ended["badsetup"]["reason"] == 'setup line 2 failed: sh -c "exit 7"' and ended["badsetup"]["exit_code"] == 7
    notes = {f["id"]: f["reason"] for f in json.loads(queue.gpuq("status", "--json").stdout)["finished"]}
    assert notes["novenv"] == ended["novenv"]["reason"] and "setup line 2 failed" in queue.gpuq("status").stdout
    # A job's own output in the prelude's form is the job's line, and the job's own note.
    assert ended["ownfail"]["reason"] == "setup line 1 failed: forged"


def test_a_spec_refused_for_an_id_in_use_stays_in_rejected_with_its_reason(team):
    """D8: a spec dropped under an id another job had vanished from status (its reason only in
    a file under state/rejected/ that members do not look in)."""
    team.write_config(poll_interval=0.2)
    team.start_worker("a", "1x80GiB")
    assert team.as_user(ALICE, "submit", "--gpus", "0", "--id", "dup", "--", "true").returncode == 0
    wait_until(lambda: team.finished("dup"), timeout=90, what="alice's dup to end")
    team.drop_as(BOB, "dup.yaml", "command: echo bob\ngpus: 0\nworkdir: /\n")
    wait_until(lambda: not (team.root / "jobs" / "dup.yaml").exists(), timeout=90, what="bob's spec to be refused")

    def rejected() -> list[dict]:
        return json.loads(team.as_user(BOB, "status", "--json", "--state", "rejected").stdout)["rejected"]

    rows = wait_until(rejected, timeout=30, what="the refusal in status")
    assert [(r["id"], r["user"]) for r in rows] == [("dup", BOB)], rows
    assert "dup" in rows[0]["error"] and "state/rejected/dup+" in rows[0]["error"]  # a name retry never takes
    assert "dup" in team.as_user(BOB, "status").stdout.split("REJECTED")[1]
    # Dismissed by its owner only: alice may not, bob may; then its line and its files are gone.
    refused = team.as_user(ALICE, "dismiss", "dup")
    assert refused.returncode == 1 and "dup" in refused.stderr, refused
    done = team.as_user(BOB, "dismiss", "dup")
    assert done.returncode == 0 and done.stdout.startswith("dup: dismissed (1 refusal)"), done
    assert rejected() == [] and not list((team.root / "state" / "rejected").glob("dup*"))
    assert team.as_user(BOB, "dismiss", "dup").returncode == 1  # nothing left to dismiss


def test_a_bad_config_value_is_in_the_workers_log_a_doctor_finding_and_no_members_blindfold(team):
    """D11: `gpu_mem_overuse: kil` made cron workers exit with nothing in their log, doctor
    abort, and every member's status and submit exit 2."""
    team.write_config(poll_interval=0.2, gpu_mem_overuse="kil")
    worker = team.start_worker("a", "1x80GiB", wait=False)
    assert worker.wait(timeout=60) == 2
    log = team.root / "logs" / "workers" / "a.log"
    assert "refuses to start" in log.read_text() and "'kil' must be warn or kill" in log.read_text()
    status = team.as_user(ALICE, "status")
    assert status.returncode == 0 and "HOSTS" in status.stdout, status
    assert "gpu_mem_overuse" in status.stderr and "gpuq doctor" in status.stderr
    submitted = team.as_user(ALICE, "submit", "--gpus", "0", "--id", "waits", "--", "true")
    assert submitted.returncode == 0, submitted  # it waits for a worker the admin's fix lets start
    doctor = team.gpuq("doctor", check=False)
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor
    assert any(
        line.startswith("FAIL config") and "'kil' must be warn or kill" in line for line in doctor.stdout.splitlines()
    ), doctor.stdout


def test_submit_on_a_full_disk_says_so_in_one_line_and_leaves_nothing(queue):
    """Chaos review: a traceback, exit 1, and an empty jobs/.submit-*.tmp left for an hour."""
    full = {**queue.env(), "GPUQ_TEST_IO_FAULT": "write:submit=ENOSPC"}
    out = queue.gpuq("submit", "--gpus", "0", "--", "true", check=False, env=full)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out
    assert len(out.stderr.splitlines()) == 1 and "the queue's disk is full" in out.stderr, out.stderr
    assert sorted(p.name for p in (queue.root / "jobs").iterdir()) == []


def test_files_in_jobs_that_are_not_specs_are_listed_with_what_to_do(team):
    """Chaos review: `.txt` files and dotfiles in jobs/ were ignored silently, never shown."""
    team.drop_as(BOB, "notes.txt", "command: python train.py\n")
    team.drop_as(BOB, "train.yml~", "command: python train.py\n")
    team.drop_as(BOB, ".fresh.yaml", "command: true\n")  # a spec being written, maybe: not yet
    old = team.root / "jobs" / ".old.yaml.swp"
    team.drop_as(BOB, old.name, "x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    view = json.loads(team.as_user(ALICE, "status", "--json").stdout)["not_specs"]
    assert [(f["name"], f["user"]) for f in view["files"]] == [
        (".old.yaml.swp", BOB),
        ("notes.txt", BOB),
        ("train.yml~", BOB),
    ]
    assert view["total"] == 3 and "rename it to end in .yaml" in view["files"][1]["fix"]
    text = team.as_user(ALICE, "status", "-w").stdout
    assert "NOT SPECS (3 in jobs/" in text and "notes.txt" in text


def test_fake_gpu_memory_can_be_used_by_a_members_job_under_a_root_worker(team):
    """D7: under README's root worker a member's `gpuq fake-use --mem 9GiB` failed: the fake
    GPUs' file was in the worker's private directory. A team without GPUs could not try
    over-use or `eff`."""
    team.write_config(poll_interval=0.2)
    team.start_worker("a", "1x24GiB")
    use = f"{team.python} {team.code / 'gpuq.py'} fake-use --mem 9GiB --seconds 60"
    assert team.as_user(ALICE, "submit", "--gpu-mem", "10GiB", "--id", "fake", "--", use).returncode == 0

    def observed() -> int | None:
        rows = json.loads(team.as_user(ALICE, "status", "--json").stdout)["running"]
        return next((r["observed_gpu_mem_mib"] for r in rows if r["id"] == "fake" and r["observed_gpu_mem_mib"]), None)

    assert wait_until(observed, timeout=90, what="the job's fake memory seen") == 9 * 1024
    team.as_user(ALICE, "cancel", "fake")


def test_a_members_refusal_never_blocks_nor_erases_anothers_on_dismiss(team):
    """A security review: bob's own bad file under alice's refused id made her `dismiss`
    fail ("bob's"), and bob's `dismiss` of it erased her refusal too."""
    team.write_config(poll_interval=0.2)
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "aj.yaml", "command: [unclosed\n")
    wait_until(lambda: (team.root / "state" / "rejected" / "aj.error").exists(), timeout=90, what="alice's refusal")
    team.drop_as(BOB, "aj.yaml", "command: [also bad\n")
    rejected = team.root / "state" / "rejected"
    wait_until(lambda: list(rejected.glob("aj+*.error")), timeout=90, what="bob's refusal, kept apart")
    bobs = team.as_user(BOB, "dismiss", "aj")
    assert bobs.returncode == 0 and "aj: dismissed (1 refusal; 1 of others' stay)" in bobs.stdout, bobs
    assert (rejected / "aj.yaml").exists() and (rejected / "aj.error").exists()  # alice's stays
    hers = team.as_user(ALICE, "dismiss", "aj")
    assert hers.returncode == 0 and hers.stdout.startswith("aj: dismissed (1 refusal)"), hers
    assert not list(rejected.glob("aj*"))


def test_retry_never_takes_a_refusal_kept_apart_for_an_id(queue):
    """A security review: a spec refused as writable by others was kept as ID.TIME.HEX.yaml,
    a name `gpuq retry` took for an id; once its owner chmod-ed it, another member's text ran
    as her. Kept apart names now join with `+` (in no id); the old dotted ones are refused."""
    rejected = queue.root / "state" / "rejected"
    rejected.mkdir(parents=True, exist_ok=True)
    for name in ("gw.1796540000.a1b2c3", "gw+1796540000.a1b2c3"):
        (rejected / f"{name}.yaml").write_text("command: id\ngpus: 0\n")
        (rejected / f"{name}.error").write_text("kept apart\n")
    old = queue.gpuq("retry", "gw.1796540000.a1b2c3", check=False)
    assert old.returncode == 1 and "kept apart" in old.stderr and "never runs under this name" in old.stderr, old
    new = queue.gpuq("retry", "gw+1796540000.a1b2c3", check=False)
    assert new.returncode == 1 and "is not a job id" in new.stderr, new
    assert not list((queue.root / "jobs").glob("*.yaml"))
