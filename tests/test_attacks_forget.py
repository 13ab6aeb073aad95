"""A member against the specs a dead box had claimed (found by an attack review of `gpuq
forget` putting them back): bob may not take the id of alice's claimed job, nor make forget
drop it or leave it where no command reaches it; a box that died in the middle of taking
over a third box's job does not keep that job stuck once it is forgotten."""

from __future__ import annotations

import os
import signal

import pytest
from team import ALICE, BOB, needs_root

from conftest import wait_until
from gpuq.host.faults import CRASH_ENV

pytestmark = [needs_root, pytest.mark.slow]
WHO_RAN = "command: id -un\ngpus: 1\nworkdir: /\n"
FAULT_LOG_ENV = "GPUQ_TEST_FAULT_LOG"


def _dead(team, host: str) -> None:
    wait_until(
        lambda: not any(h["alive"] for h in team.status()["hosts"] if h["host"] == host),
        timeout=60,
        what=f"{host} to be seen dead",
    )


def test_a_member_can_neither_take_nor_strand_the_id_of_a_job_a_dead_box_claimed(team):
    """Box a dies right after claiming alice's `al`. bob's spec under that id was run by box b
    as `al` (intake did not look at claims), and a file of his in jobs/ under that name, kept
    unfinished so that it never settled, made `gpuq forget a` drop a's heartbeat and leave her
    claim where no command reached it. His files are refused at once; a file that may stay
    (her own draft) keeps the box listed, and forget names it."""
    team.write_config(lost_after_s=5, grace_s=1, spec_settle_s=600)  # bob's garbage stays unsettled
    a = team.start_worker("a", "1x80GiB", env={CRASH_ENV: "worker:claimed"})
    team.drop_as(ALICE, "al.yaml", WHO_RAN)
    a.wait(timeout=60)
    assert a.returncode == -signal.SIGKILL
    team.start_worker("b", "1x80GiB")
    team.drop_as(BOB, "al.yaml", "command: echo bob got al\ngpus: 0\nworkdir: /\n")
    said = wait_until(lambda: team.refusals("al"), what="bob's al to be refused")
    assert "job id 'al' is the id of a job being started on a" in said
    assert team.record("al") is None and "bob got al" not in team.log("al")
    team.drop_as(BOB, "al.yaml", "command: [never closed\n")  # would hold the name in jobs/ for ever
    rejected = team.root / "state" / "rejected"
    wait_until(lambda: len(list(rejected.glob("al*.error"))) == 2, what="bob's unfinished al refused at once")
    assert f"belongs to {ALICE}'s job" in "".join(p.read_text() for p in rejected.glob("al*.error"))
    team.drop_as(ALICE, "al.yaml", "command: [her own draft\n")  # hers: it may wait to settle
    _dead(team, "a")
    refused = wait_until(
        lambda: (r := team.gpuq("forget", "a", check=False)).returncode and "silent" not in r.stderr and r,
        timeout=60,
        what="forget to be refused for the file in jobs/, not for a's recent silence",
    )
    assert f"jobs/al.yaml is taken by a file of {ALICE}'s: ask them to remove it" in refused.stderr, refused.stderr
    assert "a" in [h["host"] for h in team.status()["hosts"]]  # still listed: forget can be run again
    assert team.status()["stranded"] == [{"id": "al", "user": ALICE, "host": "a"}]
    assert "STRANDED (1; claimed by a, which stopped" in team.as_user(BOB, "status").stdout
    assert "gpuq forget a" in team.as_user(ALICE, "show", "al").stdout
    assert team.py_as(ALICE, f"import os; os.unlink({str(team.root / 'jobs' / 'al.yaml')!r})").returncode == 0
    done = team.gpuq("forget", "a")
    assert "1 job(s) it had claimed but never started are back in the queue (al)" in done.stdout, done.stdout
    assert team.status()["stranded"] == []
    final = wait_until(lambda: team.finished("al"), timeout=60, what="b to run al")
    assert (final["state"], final["host"], final["attempt"]) == ("done", "b", 1), final
    assert team.log("al").splitlines().count(ALICE) == 1 and "bob got al" not in team.log("al")


def test_a_box_that_died_taking_over_a_job_does_not_keep_it_once_forgotten(team):
    """c runs alice's job and dies; a, taking it over, dies holding the claim for its next
    attempt (recovery:held). Every box then tried the takeover every pass and gave up on a's
    claim, for ever; forgetting a let it stand. Now forget lets a's claim go, and b takes the
    job over from the record (which holds the spec)."""
    team.write_config(lost_after_s=5, grace_s=1)
    team.start_worker("c", "1x80GiB")
    team.drop_as(ALICE, "t5.yaml", "command: sleep 300\ngpus: 1\nworkdir: /\n")
    wait_until(lambda: (team.record("t5") or {}).get("host") == "c", what="t5 to run on c")
    a = team.start_worker("a", "1x80GiB", env={CRASH_ENV: "recovery:held"})
    team.wait_passes("a")  # a has seen c's heartbeat change: it judges c by its own clock
    team.stop_worker("c", signal.SIGKILL)
    a.wait(timeout=60)
    assert a.returncode == -signal.SIGKILL
    assert [p.name.split("@")[1] for p in (team.root / "state" / "claims").iterdir()] == ["a"]
    team.start_worker("b", "1x80GiB")
    _dead(team, "a")
    done = wait_until(
        lambda: (r := team.gpuq("forget", "a", check=False)).returncode == 0 and r,
        timeout=60,
        what="forget of a to be accepted",
    )
    assert "a: forgotten" in done.stdout
    again = wait_until(lambda: (team.record("t5") or {}).get("attempt") == 2 and team.record("t5"), timeout=60)
    assert (again["state"], again["host"]) == ("running", "b"), again
    moves = [e for e in team.events() if e.get("job") == "t5" and "to" in e]
    assert [(e["from"], e["to"], e["attempt"]) for e in moves] == [
        ("pending", "running", 1),
        ("running", "pending", 1),  # lost with c, once: a's half-done takeover left no trace
        ("pending", "running", 2),
    ], moves
    assert "host c stopped" in moves[1]["reason"], moves[1]


def test_a_members_file_waiting_in_jobs_never_takes_the_id_of_a_job_put_back(team):
    """bob kept a file at jobs/prep.yml; alice's `gpuq release prep` linked her spec back as
    prep.yaml, which landed last, so hers was refused as the second file of the id and his
    (valid by then) ran as prep. The user a job is put back for keeps its id."""
    team.write_config(spec_settle_s=600)  # bob's garbage stays in jobs/, unsettled
    team.start_worker("a", "1x80GiB")
    assert team.as_user(ALICE, "submit", "--hold", "--id", "prep", "--", "id", "-un").returncode == 0
    wait_until(lambda: (team.root / "state" / "held" / "prep.yaml").exists(), what="prep held")
    team.drop_as(BOB, "prep.yml", "command: [never closed\n")
    team.wait_passes("a")
    released = team.as_user(ALICE, "release", "prep")
    assert released.returncode == 0, released.stderr
    final = wait_until(lambda: team.finished("prep"), timeout=60, what="alice's prep to run")
    assert final["state"] == "done" and final["user"] == ALICE, final
    assert team.log("prep").splitlines().count(ALICE) == 1
    error = wait_until(
        lambda: next((team.root / "state" / "rejected").glob("prep*.error"), None), what="bob's file refused"
    )
    text = error.read_text()  # refused as the id's second file, or at once as hers: whichever came first
    assert "prep.yml" in text and ("already has the id 'prep'" in text or f"belongs to {ALICE}'s job" in text), text


def test_a_members_unfinished_file_never_takes_the_name_of_a_held_job(team):
    """alice's job is held (here from its submission); bob's jobs/hq.yaml, kept unfinished so
    it never settled, sat on the name her release links the spec back to, and her first
    `gpuq release hq` was refused ("jobs/hq.yaml exists"). A held job's id is held for her:
    his file is refused at once, and her release works the first time."""
    team.write_config(spec_settle_s=600)  # bob's garbage would stay in jobs/, unsettled
    team.start_worker("a", "1x80GiB")
    assert team.as_user(ALICE, "submit", "--hold", "--id", "hq", "--", "id", "-un").returncode == 0
    wait_until(lambda: (team.root / "state" / "held" / "hq.yaml").exists(), what="hq held")
    team.drop_as(BOB, "hq.yaml", "command: [never closed\n")
    wait_until(lambda: f"job id 'hq' belongs to {ALICE}'s job" in team.refusals("hq"), what="bob's hq.yaml refused")
    released = team.as_user(ALICE, "release", "hq")
    assert released.returncode == 0, released.stderr
    final = wait_until(lambda: team.finished("hq"), timeout=60, what="alice's hq to run")
    assert (final["state"], final["user"]) == ("done", ALICE), final
    assert team.log("hq").splitlines().count(ALICE) == 1


def test_retry_of_a_job_whose_box_died_after_recording_its_end(team, tmp_path):
    """Box h recorded alice's job done and died before removing its claim; her `gpuq retry`
    said "back in the queue", then the new claim check refused her spec as "being started
    on h", and the job was nowhere. retry lets go of the ended attempt's claim."""
    fault_log = team.queue_file("faults")
    team.write_config(lost_after_s=5, grace_s=1)
    h = team.start_worker(
        "h", "1x80GiB", env={"GPUQ_TEST_PAUSE_AT": "supervisor:recorded", FAULT_LOG_ENV: str(fault_log)}
    )
    team.drop_as(ALICE, "hj.yaml", WHO_RAN)
    paused = wait_until(
        lambda: fault_log.exists() and [int(line.split()[-1]) for line in fault_log.read_text().splitlines()],
        what="h's supervisor to stop after recording the end",
    )
    team.stop_worker("h", signal.SIGKILL)
    os.kill(paused[0], signal.SIGKILL)
    h.wait(timeout=20)
    assert team.finished("hj")["state"] == "done"
    assert [p.name.split("@")[1] for p in (team.root / "state" / "claims").iterdir()] == ["h"]
    team.start_worker("b", "1x80GiB")
    _dead(team, "h")
    retried = team.as_user(ALICE, "retry", "hj")
    assert retried.returncode == 0 and "attempt 2" in retried.stdout, retried.stderr
    final = wait_until(lambda: (team.finished("hj") or {}).get("attempt") == 2 and team.finished("hj"), timeout=60)
    assert (final["state"], final["host"]) == ("done", "b"), final
    assert team.log("hj").splitlines().count(ALICE) == 2


def test_a_members_file_under_a_preempted_jobs_name_never_loses_it(team):
    """alice's opportunistic job yields to bob's; bob had a file waiting at jobs/low1.yaml, so
    the put-back's link failed and her spec went to rejected/ ("an earlier version of this spec
    was being started"): the job was nowhere, and `gpuq retry` said there was no such job. His
    file, unfinished so that it would never settle, is refused at once (the id is hers while
    her job holds its claim), and hers comes back and runs again."""
    team.write_config(spec_settle_s=600, grace_s=1, idle_after_s=1)
    team.start_worker("a", "1x80GiB")
    team.drop_as(ALICE, "low1.yaml", "command: sleep 5; id -un\ngpus: 1\npreemptible: true\nworkdir: /\n")
    wait_until(lambda: (team.record("low1") or {}).get("state") == "running", what="low1 to run")
    team.drop_as(BOB, "low1.yaml", "command: [never closed\n")
    said = wait_until(lambda: team.refusals("low1"), what="bob's low1.yaml refused")
    assert f"job id 'low1' belongs to {ALICE}'s job" in said, said
    team.drop_as(BOB, "urgent.yaml", "command: sleep 1\ngpus: 1\nworkdir: /\n")
    final = wait_until(lambda: team.finished("low1"), timeout=90, what="low1 to run again, to its end")
    assert (final["state"], final["attempt"], final["user"]) == ("done", 2, ALICE), final
    assert team.finished("urgent")["state"] == "done"


def test_a_put_back_refuses_a_file_another_user_put_under_the_name(tmp_path):
    """The race the test above no longer meets: another user's file lands in jobs/ in the
    instant before a put-back. It is refused, and the spec goes back (it went to rejected/)."""
    from gpuq.model.config import Config
    from gpuq.run.joblocal import Runtime
    from gpuq.spool.intake import Intake
    from gpuq.spool.layout import Layout
    from gpuq.worker.box import Box
    from gpuq.worker.returns import put_back

    layout = Layout(tmp_path)
    layout.ensure()
    claimed = layout.claims / "j@a@00000000@1@00@a1.yaml"
    claimed.write_text("command: hers\n")
    os.chown(claimed, 4242, 4242)
    (layout.jobs / "j.yaml").write_text("command: his\n")
    os.chown(layout.jobs / "j.yaml", 4343, 4343)
    rt = Runtime(layout, "a", "0" * 32, tmp_path / "local", 1.0, 5.0, {}, True)
    assert put_back(Box(Config(), rt, Intake(layout)), "j", claimed)
    assert (layout.jobs / "j.yaml").read_text() == "command: hers\n" and not claimed.exists()
    refused = [p for p in layout.rejected.iterdir() if p.suffix == ".yaml"]
    assert [p.read_text() for p in refused] == ["command: his\n"]
    (error,) = [p for p in layout.rejected.iterdir() if p.suffix == ".error"]
    assert "belongs to another user's job" in error.read_text()


@pytest.mark.parametrize("her_file_mode", [0o664, 0o644])
def test_a_hard_link_to_her_own_file_under_the_name_is_not_her_new_spec(tmp_path, her_file_mode):
    """bob hard-linked one of alice's files (group-writable, so the kernel lets him; any of hers
    where it does not protect hard links) to jobs/al.yaml while her claimed spec was on its way
    back: the put-back saw her uid there, took it for her own new spec, and sent her real spec
    to rejected/ ("an earlier version..."), never to run. Only a plain file of hers with one
    link, that no one else may have written, is her new spec; this one is refused instead."""
    from gpuq.model.config import Config
    from gpuq.run.joblocal import Runtime
    from gpuq.spool.intake import Intake
    from gpuq.spool.layout import Layout
    from gpuq.worker.box import Box
    from gpuq.worker.returns import put_back

    layout = Layout(tmp_path)
    layout.ensure()
    claimed = layout.claims / "al@a@00000000@1@00@a1.yaml"
    claimed.write_text("command: hers\n")
    os.chown(claimed, 4242, 4242)
    notes = tmp_path / "notes.txt"
    notes.write_text("her notes\n")
    os.chown(notes, 4242, 4242)
    os.chmod(notes, her_file_mode)
    os.link(notes, layout.jobs / "al.yaml")  # two links now: bob's doing, whatever its mode
    rt = Runtime(layout, "a", "0" * 32, tmp_path / "local", 1.0, 5.0, {}, True)
    assert put_back(Box(Config(), rt, Intake(layout)), "al", claimed)
    assert (layout.jobs / "al.yaml").read_text() == "command: hers\n" and not claimed.exists()
    assert notes.read_text() == "her notes\n"


def test_a_put_back_that_loses_every_race_to_another_users_file_parks_the_spec(tmp_path, monkeypatch):
    """bob re-created jobs/apre.yaml as fast as the put-back refused it; after three lost races
    the put-back sent alice's preempted spec to rejected/ ("an earlier version ... resubmit it
    under another name"): her job was gone. It now waits in claims/ for a later pass."""
    from gpuq.model.config import Config
    from gpuq.run.joblocal import Runtime
    from gpuq.spool.intake import Intake
    from gpuq.spool.layout import Layout
    from gpuq.worker import returns
    from gpuq.worker.box import Box
    from gpuq.worker.recovery import Recovery

    layout = Layout(tmp_path)
    layout.ensure()
    claimed = layout.claims / f"apre@a@{'0' * 8}@{os.getpid()}@00@a2.yaml"
    claimed.write_text("command: hers\n")
    os.chown(claimed, 4242, 4242)
    his = layout.jobs / "apre.yaml"

    def bobs_file() -> None:
        his.write_text("command: [\n")
        os.chown(his, 4343, 4343)

    def reject(box, job_id, path, message, forget=True, retry_mends=True):
        assert path == his, path  # never hers
        path.unlink()
        bobs_file()  # bob's loop wins the race again

    monkeypatch.setattr(returns, "reject", reject)
    bobs_file()
    rt = Runtime(layout, "a", "0" * 32, tmp_path / "local", 1.0, 5.0, {}, True)
    box = Box(Config(), rt, Intake(layout))
    recovery = Recovery(box)
    assert not returns.put_back(box, "apre", claimed)
    parked = list(layout.claims.iterdir())
    assert [p.name.split("@")[3] for p in parked] == ["0"] and parked[0].read_text() == "command: hers\n"
    his.unlink()  # bob gives up: the next pass puts hers back
    recovery.requeue_orphan_claims()
    assert his.read_text() == "command: hers\n" and os.lstat(his).st_uid == 4242 and not list(layout.claims.iterdir())


def test_submit_never_picks_an_id_held_for_a_job_on_its_way_back(tmp_path):
    """A place (or an attempt kept in requeued/) bob's deleted spec left held train-1 and
    train-2; alice's `gpuq submit --name train` picked train-1, and the worker refused it as
    bob's, telling her to use `gpuq submit`, which picks a free id."""
    from gpuq.spool.layout import Layout
    from gpuq.spool.submit import free_id

    layout = Layout(tmp_path)
    layout.ensure()
    layout.places.mkdir(exist_ok=True)
    (layout.places / "train-1.json").write_text('{"uid": 4343, "queued_at": 1.0}')
    (layout.requeued / "train-2.json").write_text('{"id": "train-2", "user": "bob"}')
    assert free_id(layout, None, "train") == "train-3"


def test_a_box_frozen_after_its_claim_never_overwrites_the_start_made_after_forget(team, tmp_path):
    """Box a froze (a paused VM) after claiming alice's job and checking its owner, just before
    writing its start record; it was forgotten, its claim went back, and b started the job.
    When a woke, it wrote its own start record over b's. A start now only creates a record:
    a's write fails, a starts nothing, and b's attempt runs on, once."""
    fault_log = team.queue_file("faults")
    team.write_config(lost_after_s=5, grace_s=1)
    a = team.start_worker("a", "1x80GiB", env={"GPUQ_TEST_PAUSE_AT": "worker:owned", FAULT_LOG_ENV: str(fault_log)})
    marker = team.root / "go"  # where alice can see it
    team.drop_as(
        ALICE, "fz.yaml", f"command: id -un; while [ ! -e {marker} ]; do sleep 0.2; done\ngpus: 1\nworkdir: /\n"
    )
    paused = wait_until(
        lambda: fault_log.exists() and [int(line.split()[-1]) for line in fault_log.read_text().splitlines()],
        what="a to stop right after its claim",
    )
    team.start_worker("b", "1x80GiB")
    _dead(team, "a")
    wait_until(lambda: team.gpuq("forget", "a", check=False).returncode == 0, timeout=60, what="a forgotten")
    wait_until(lambda: (team.record("fz") or {}).get("host") == "b", timeout=60, what="b to start fz")
    os.kill(paused[0], signal.SIGCONT)
    wait_until(lambda: team._beat_of("a", a.pid), timeout=60, what="a to beat again")
    team.wait_passes("a")
    running = team.record("fz")
    assert (running["host"], running["attempt"]) == ("b", 1), running
    assert not any(p.name.split("@")[1] == "a" for p in (team.root / "state" / "claims").iterdir())
    os.makedirs(marker)
    final = wait_until(lambda: team.finished("fz"), timeout=60, what="fz to finish")
    assert (final["state"], final["host"], final["attempt"]) == ("done", "b", 1), final
    assert team.log("fz").splitlines().count(ALICE) == 1
