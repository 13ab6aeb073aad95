"""The marker in a job's lock file (model/markers.py): its phases, their one transition table,
and the file's format, which running supervisors of the code before it also write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuq.model.markers import NEXT, OVER, Marker, MarkerError, Phase, check_marker, parse_marker
from gpuq.run import supervise

CLAIM = "j@a@boot0000@123@0a1b2c3d@a1.yaml"


def _written(marker: Marker) -> bytes:
    """A marker as a supervisor writes it: its pid, start ticks and the time, then its own keys."""
    return json.dumps({"supervisor_pid": 4321, "ticks": 99, "t": 1.5, **marker.fields()}).encode()


@pytest.mark.parametrize(
    "marker",
    [
        Marker(Phase.STARTED, CLAIM),
        Marker(Phase.RUNNING, CLAIM, keeper_pid=77, keeper_ticks=12),
        Marker(Phase.ENDED, CLAIM),
        Marker(Phase.PREEMPTED, CLAIM, why="job real needs its GPU memory; exit 143"),
        Marker(Phase.FENCED, CLAIM, why="fenced: this host's heartbeat is 200 s old"),
        Marker(Phase.UNRECORDED, CLAIM, why="[Errno 28] No space left", result={"state": "done", "exit_code": 0}),
    ],
)
def test_each_phase_reads_back_as_written_with_its_writer(marker: Marker) -> None:
    assert parse_marker(_written(marker), CLAIM) == Marker(
        marker.phase,
        CLAIM,
        why=marker.why,
        keeper_pid=marker.keeper_pid,
        keeper_ticks=marker.keeper_ticks,
        result=marker.result,
        supervisor_pid=4321,
        ticks=99,
    )


def test_the_files_the_code_before_the_phases_wrote_read_as_their_phases() -> None:
    """A worker upgraded while supervisors of the old code run reads their markers."""
    old = {
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0, "claim": "%s"}': Phase.STARTED,
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0, "claim": "%s", "keeper_pid": 8, "keeper_ticks": 9}': Phase.RUNNING,
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0, "claim": "%s", "ended": true}': Phase.ENDED,
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0, "claim": "%s", "preempted": "why"}  ': Phase.PREEMPTED,
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0, "claim": "%s", "fenced": "why"}': Phase.FENCED,
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0, "claim": "%s", "result": {"state": "done"}, "unrecorded": "x"}': (
            Phase.UNRECORDED
        ),
        '{"supervisor_pid": 5, "ticks": 6, "t": 1.0}': Phase.UNSTARTED,
    }
    for text, phase in old.items():
        assert parse_marker((text.replace("%s", CLAIM)).encode(), CLAIM).phase is phase, text


@pytest.mark.parametrize(
    "data",
    [b"", None, b"{", b"[]", b'"claim"', json.dumps({"claim": "j@a@boot0000@123@ffffffff@a0.yaml", "ended": True})],
)
def test_no_marker_of_this_attempt_is_unstarted(data: bytes | None) -> None:
    """Empty, torn, not an object, or an earlier attempt's: this attempt never ran."""
    assert parse_marker(data if not isinstance(data, str) else data.encode(), CLAIM).phase is Phase.UNSTARTED


def test_the_table_allows_each_life_an_attempt_has_and_nothing_after_its_end() -> None:
    lives = [
        [Phase.STARTED, Phase.RUNNING, Phase.ENDED],  # ran and recorded (the files go, lock file with them)
        [Phase.STARTED, Phase.RUNNING, Phase.RUNNING, Phase.ENDED, Phase.PREEMPTED],  # a service restarted, preempted
        [Phase.STARTED, Phase.ENDED, Phase.UNRECORDED],  # could not start; the disk refused the record
        [Phase.STARTED, Phase.RUNNING, Phase.ENDED, Phase.FENCED],
        [Phase.STARTED, Phase.UNSTARTED],  # handed back before anything ran
    ]
    for life in lives:
        phase = Phase.UNSTARTED
        for new in life:
            check_marker(phase, new)
            phase = new
    for wrong in [(Phase.UNSTARTED, Phase.RUNNING), (Phase.RUNNING, Phase.PREEMPTED), (Phase.ENDED, Phase.RUNNING)]:
        with pytest.raises(MarkerError):
            check_marker(*wrong)
    assert all(not NEXT[phase] for phase in OVER - {Phase.ENDED})  # the last word of a supervisor


def test_the_supervisor_refuses_a_marker_out_of_order_and_writes_nothing(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "j.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        supervise._mark(fd, Marker(Phase.STARTED, CLAIM))
        before = (tmp_path / "j.lock").read_bytes()
        with pytest.raises(MarkerError):
            supervise._mark(fd, Marker(Phase.PREEMPTED, CLAIM, why="not ended yet"))
        assert (tmp_path / "j.lock").read_bytes() == before
        supervise._mark(fd, Marker(Phase.RUNNING, CLAIM, keeper_pid=os.getpid(), keeper_ticks=1))
        supervise._mark(fd, Marker(Phase.ENDED, CLAIM))  # shorter than the one before: padded, still whole
        marker = parse_marker((tmp_path / "j.lock").read_bytes(), CLAIM)
        assert (marker.phase, marker.supervisor_pid) == (Phase.ENDED, os.getpid())
    finally:
        os.close(fd)
