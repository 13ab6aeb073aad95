"""Every change of a job's state is one checked `StateChange`, from the state the spool showed;
why a running job was stopped is a typed cause, not a reason's prefix (model/stops.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuq.host.owners import Actor
from gpuq.model.record import Record
from gpuq.model.states import State, TransitionError
from gpuq.model.stops import Stop, StopCause, cause_in_words, cause_of
from gpuq.spool.cancel import cancel_one
from gpuq.spool.holds import HoldError, hold, release, retry
from gpuq.spool.layout import Layout
from gpuq.spool.store import StateChange, append_note, read_record, spec_state, transition, write_record

ME = Actor(os.geteuid(), "me", True)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    lay = Layout(tmp_path)
    lay.ensure()
    return lay


def _events(layout: Layout) -> list[dict]:
    path = layout.events / "a.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _files(layout: Layout) -> dict[str, bytes]:
    return {str(p.relative_to(layout.root)): p.read_bytes() for p in layout.root.rglob("*") if p.is_file()}


def test_a_change_the_table_forbids_is_refused_before_any_effect(layout):
    done = Record(id="j", state=State.DONE, spec={}, host="a")
    write_record(layout, done)
    before = _files(layout)
    with pytest.raises(TransitionError, match="job j cannot go from done to running"):
        StateChange(layout, done, State.RUNNING, "a")
    assert _files(layout) == before and _events(layout) == []


def test_cancelling_a_held_job_is_recorded_from_held_and_leaves_no_held_record(layout):
    (layout.jobs / "j.yaml").write_text("command: echo hi\ngpus: 0\n")
    hold(layout, "j", "a", ME)
    assert (layout.held / "j.json").exists()
    ok, _ = cancel_one(layout, "j", "a", ME)
    assert ok
    assert [(e["from"], e["to"]) for e in _events(layout)] == [("pending", "held"), ("held", "cancelled")]
    assert not (layout.held / "j.json").exists() and not (layout.held / "j.yaml").exists()
    assert read_record(layout.finished / "j.json").state is State.CANCELLED


def test_hold_release_and_retry_log_full_events_through_one_shape(layout):
    (layout.jobs / "j.yaml").write_text("command: echo hi\ngpus: 0\n")
    hold(layout, "j", "a", ME)
    release(layout, "j", "a", ME)
    assert (layout.jobs / "j.yaml").exists() and not (layout.held / "j.json").exists()
    (layout.jobs / "j.yaml").unlink()  # as if claimed and run to its end
    ended = Record(id="j", state=State.FAILED, spec={}, spec_text="command: echo hi\ngpus: 0\n", uid=os.geteuid())
    write_record(layout, ended)
    retry(layout, "j", "a", ME)
    events = _events(layout)
    assert [(e["from"], e["to"]) for e in events] == [("pending", "held"), ("held", "pending"), ("failed", "pending")]
    keys = set(events[0])
    assert all(set(e) == keys for e in events)  # user, attempt, queued_at, cause... every time
    assert read_record(layout.requeued / "j.json").state is State.FAILED  # the ended attempt, kept


def test_a_release_whose_spec_cannot_go_back_keeps_the_held_record(layout):
    (layout.jobs / "j.yaml").write_text("command: echo hi\ngpus: 0\n")
    hold(layout, "j", "a", ME)
    (layout.jobs / "j.yaml").write_text("command: someone else's\n")  # a new file took the name
    with pytest.raises(Exception, match="the held spec stays held"):
        release(layout, "j", "a", ME)
    assert (layout.held / "j.json").exists() and (layout.held / "j.yaml").exists()
    assert [(e["from"], e["to"]) for e in _events(layout)] == [("pending", "held")]


def test_a_requeue_keeps_the_attempt_with_its_cause(layout):
    running = Record(id="j", state=State.RUNNING, spec={}, host="a", attempt=2)
    write_record(layout, running)
    transition(layout, running, State.PENDING, "a", reason="preempted: job x needs it", cause=StopCause.PREEMPT)
    kept = read_record(layout.requeued / "j.json")
    assert kept.attempt == 2 and kept.cause is StopCause.PREEMPT and not (layout.running / "j.json").exists()
    assert _events(layout)[0]["cause"] == "preempted"


def test_spec_state_is_where_the_spec_was_found(layout):
    assert spec_state(layout, layout.jobs / "j.yaml") is State.PENDING
    assert spec_state(layout, layout.claims / "j@h@b@1@x") is State.PENDING
    assert spec_state(layout, layout.held / "j.yaml") is State.HELD
    assert spec_state(layout, layout.rejected / "j.yaml") is State.REJECTED
    with pytest.raises(ValueError):
        spec_state(layout, layout.root / "j.yaml")


def test_a_stop_order_round_trips_and_an_older_supervisor_reads_it_the_same():
    for stop in (Stop.preempt("job x needs its GPU memory"), Stop.limit("host memory 3GiB"), Stop.cancel("bob")):
        assert Stop.decode(stop.encode()) == stop
        # a supervisor from before causes were typed read the one line, and decided by its start
        old_reading = stop.encode().decode().strip()
        assert "\n" not in old_reading and old_reading == stop.reason
        assert old_reading.startswith("preempted") == (stop.cause is StopCause.PREEMPT)
        assert old_reading.startswith("limit") == (stop.cause is StopCause.LIMIT)


def test_an_order_is_a_cancel_a_preemption_or_a_limit_and_anything_else_a_cancel():
    assert Stop.decode(b"preempted: job x needs it") == Stop(StopCause.PREEMPT, "preempted: job x needs it")
    assert Stop.decode(b"limit: host memory").cause is StopCause.LIMIT
    assert Stop.decode(b"") == Stop(StopCause.CANCEL, "cancelled")
    assert Stop.decode(b"\xff\xfe garbage").cause is StopCause.CANCEL
    for never_ordered in (b"fenced: lease 90 s old", b"timeout", b"time limit 1s reached"):
        assert Stop.decode(never_ordered).cause is StopCause.CANCEL


def test_a_cause_decides_even_where_the_words_would_mislead():
    # a typed record is never read by its words: a cancel whose reason happens to begin "limit"
    assert cause_of({"cause": "cancelled", "reason": "limit reached, said bob"}) is StopCause.CANCEL
    assert cause_of({"cause": None, "reason": "preempted by hand"}) is None
    assert cause_of({"cause": "from-a-newer-gpuq", "reason": "x"}) is None
    assert cause_of({"reason": "preempted: old record"}) is StopCause.PREEMPT  # written before the field
    assert cause_in_words(None) is None
    assert StopCause.LIMIT.ends_as is State.FAILED and StopCause.PREEMPT.ends_as is None


def test_append_note_writes_a_note_not_a_transition(layout):
    append_note(layout, "a", "j", "preempting", "job x needs it")
    (event,) = _events(layout)
    assert event["note"] == "preempting" and "from" not in event and "to" not in event


def test_retry_refuses_a_job_whose_requeue_waits_in_a_claim(layout):
    """A requeue that crashed after keeping its attempt (recovery:recorded) leaves the running
    attempt in requeued/ and the spec in a claim: the job is pending, not ended, and a retry
    must not put a second copy of its spec in jobs/."""
    kept = Record(id="j", state=State.RUNNING, spec={}, spec_text="command: x\n", uid=os.geteuid(), attempt=1)
    write_record(layout, kept)
    transition(layout, kept, State.PENDING, "a", reason="preempted: x; requeued as attempt 2", cause=StopCause.PREEMPT)
    (layout.claims / "j@a@bootboot@123@1a2b.yaml").write_text("command: x\n")
    before = _files(layout)
    with pytest.raises(Exception, match="j: has not ended yet"):
        retry(layout, "j", "a", ME)
    assert _files(layout) == before and not (layout.jobs / "j.yaml").exists()


def test_a_pending_job_cancelled_after_a_requeue_is_logged_at_the_attempt_it_waited_for(layout):
    kept = Record(id="j", state=State.RUNNING, spec={}, host="a", attempt=2)
    write_record(layout, kept)
    transition(layout, kept, State.PENDING, "a", reason="preempted: x", cause=StopCause.PREEMPT)
    (layout.jobs / "j.yaml").write_text("command: echo hi\ngpus: 0\n")
    ok, _ = cancel_one(layout, "j", "a", ME)
    assert ok and _events(layout)[-1]["attempt"] == 3 == read_record(layout.finished / "j.json").attempt


def test_a_write_that_cannot_finish_undoes_itself(layout, monkeypatch):
    running = Record(id="j", state=State.RUNNING, spec={}, host="a")
    write_record(layout, running)
    before = _files(layout)

    real_unlink = Path.unlink

    def refuse(self, missing_ok=False):  # the old record's removal fails; the rest works
        if self.parent == layout.running:
            raise PermissionError(13, "refused", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    with pytest.raises(PermissionError):
        transition(layout, running, State.DONE, "a", exit_code=0)
    monkeypatch.undo()
    assert _files(layout) == before and _events(layout) == []


@pytest.mark.parametrize("verb", [hold, retry], ids=["hold", "retry"])
def test_hold_or_retry_of_a_job_whose_record_is_damaged_says_so(layout, verb):
    """Whose job it is comes from its record; a torn one was taken as root's ("belongs to
    root") and refused its own owner with a wrong reason."""
    (layout.running / "torn.json").write_text('{"id": "torn')
    mine = Actor(4242, "someone", False)
    with pytest.raises(HoldError, match="torn: its record is damaged; an admin should look at state/"):
        verb(layout, "torn", "a", mine)


def test_show_gives_a_preemptions_told_time_beside_its_requeue(tmp_path):
    """A member: `show` stamped a preemption when the job was back in the queue, a grace
    after its worker told it to yield; both are shown now."""
    import json as jsonlib
    import time

    from gpuq.views.show import requeues, show_text

    layout = Layout(tmp_path / "root")
    layout.ensure()
    lines = [
        {"t": 1000.0, "by": "a", "job": "lo", "note": "preempting", "reason": "job hi needs its GPU memory"},
        {
            "t": 1060.0,
            "by": "a",
            "job": "lo",
            "from": "running",
            "to": "pending",
            "cause": "preempted",
            "reason": "preempted: job hi needs its GPU memory; requeued as attempt 2",
        },
    ]
    (layout.events / "a.jsonl").write_text("".join(jsonlib.dumps(e, separators=(",", ":")) + "\n" for e in lines))
    found = requeues(layout, "lo")
    assert found == {"preemptions": [{**{k: lines[1][k] for k in ("t", "reason")}, "told": 1000.0}]}
    text = show_text({"id": "lo", "state": "pending", **found})
    stamped = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1000.0))
    back = time.strftime("%H:%M:%S", time.localtime(1060.0))
    assert f"{stamped} told, {back} back in the queue:  preempted: job hi" in text, text


def test_a_plain_cancel_after_cancel_now_keeps_the_kill_at_once(layout):
    """A review: `cancel --now` then `cancel` before the worker read the order: the second
    replaced the first, and the job took its whole grace."""
    write_record(layout, Record(id="j", state=State.RUNNING, spec={}, host="a", uid=os.geteuid(), attempt=2))
    assert cancel_one(layout, "j", "a", ME, now=True)[0]
    assert cancel_one(layout, "j", "a", ME)[0]
    order = json.loads((layout.host_control("a") / "j.json").read_text())
    assert order["now"] is True and order["attempt"] == 2
    (layout.host_control("a") / "j.json").write_text(json.dumps({**order, "attempt": 1}))  # an earlier attempt's
    assert cancel_one(layout, "j", "a", ME)[0]
    assert json.loads((layout.host_control("a") / "j.json").read_text())["now"] is False
