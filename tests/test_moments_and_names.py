"""The core's reading of what people type: moments (`--since yesterday`, `--begin now+1hour`,
model/moments.py, read by submit's --begin and the extras' windows) and job names and name
patterns (model/names.py, read by status and the -n filters)."""

from __future__ import annotations

import time

import pytest

from gpuq.model.moments import parse_moment
from gpuq.model.names import name_of, named

NOW = time.mktime((2026, 12, 6, 15, 30, 0, 0, 0, -1))  # a Sunday afternoon, local time


def _local(*day_time: int) -> float:
    return time.mktime((*day_time, 0, 0, 0, -1)[:9])


def test_moments_read_as_slurm_and_people_write_them():
    day = (2026, 12, 6)
    assert parse_moment("now", NOW) == NOW
    assert parse_moment("today", NOW) == _local(*day, 0, 0, 0)
    assert parse_moment("yesterday", NOW) == _local(2026, 12, 5, 0, 0, 0)
    assert parse_moment("tomorrow", NOW) == _local(2026, 12, 7, 0, 0, 0)
    assert parse_moment("now+1hour", NOW) == NOW + 3600
    assert parse_moment("now-30min", NOW) == NOW - 1800
    assert parse_moment("now+90", NOW) == NOW + 90  # a bare count is seconds, as sbatch --begin reads it
    assert parse_moment("7d", NOW) == NOW - 7 * 86400  # a window's edge: back from now
    assert parse_moment("2h", NOW, ahead=True) == NOW + 7200  # a start: ahead
    assert parse_moment("2026-11-01", NOW) == _local(2026, 11, 1, 0, 0, 0)
    assert parse_moment("2026-11-01 14:05", NOW) == _local(2026, 11, 1, 14, 5, 0)
    assert parse_moment("2026-11-01T14:05:09", NOW) == _local(2026, 11, 1, 14, 5, 9)
    assert parse_moment("16:00", NOW) == _local(*day, 16, 0, 0)
    assert parse_moment("09:00", NOW) == _local(*day, 9, 0, 0)  # a window's edge: today's, though past
    assert parse_moment("09:00", NOW, ahead=True) == _local(2026, 12, 7, 9, 0, 0)  # sbatch: passed -> tomorrow
    for bad in ("soon", "25:00", "now+1fortnight", "2026-13-01", ""):
        with pytest.raises(ValueError, match="write it like"):
            parse_moment(bad, NOW)


def test_a_jobs_name_from_its_id_and_name_patterns_over_names_and_ids():
    """A Slurm user's session: `history -n exp` (now the history extra's) found no member of sweep exp-1 (its members
    were named exp-1_lr1e), and `cancel -n 'beg-*'`, as the help's examples read, matched nothing."""
    assert [name_of(i) for i in ("train-12", "arr-1_3", "exp-1_lr1e-3", "hp-1_lr1e-3-seed1", "my_job-3", "sw_3")] == [
        "train", "arr", "exp", "hp", "my_job", "sw",
    ]  # fmt: skip
    assert named(("beg-*",), "beg", "beg-2") and named(("beg",), "beg", "beg-2") and named(None, "x", "y")
    assert not named(("train-*",), "beg", "beg-2")


def test_a_moment_within_the_hour_is_given_to_the_second_and_later_ones_to_the_minute():
    """A member read START BY "22:16" for a start 30 s away: rounded up to the minute, a
    short wait read as twice as long."""
    from gpuq.model.windows import moment

    now = _local(2026, 12, 7, 22, 15, 1)
    assert moment(now + 30.2, now) == "22:15:32"  # rounded up: a latest moment
    assert moment(now + 7200 + 1, now) == "00:16"  # the minute after 00:15:02
    assert moment(now + 30 * 3600, now) == "Dec 09 04:16"
