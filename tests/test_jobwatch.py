"""The supervisor's wait, driven with plain numbers for `now` (run/jobwatch.py)."""

from __future__ import annotations

from gpuq.model.stops import Stop
from gpuq.run.jobwatch import NEVER, JobWatch


def test_fencing_is_checked_every_tenth_of_the_lease_at_most_every_five_seconds():
    assert JobWatch.starting(100.0, lost_after_s=20).check_every == 2.0
    watch = JobWatch.starting(100.0, lost_after_s=300)
    assert watch.check_every == 5.0 and watch.wake_at(limits_at=NEVER) == 105.0
    assert not watch.fence_check_due(104.9)
    assert watch.fence_check_due(105.2) and watch.next_check == 110.2
    assert not watch.fence_check_due(105.3)  # once per period


def test_a_stop_sends_term_once_and_kill_after_its_grace():
    watch = JobWatch.starting(0.0, lost_after_s=60)
    assert watch.stopping(Stop.cancel("bob"), grace_s=10, now=3.0)
    assert not watch.stopping(Stop.preempt("job x"), grace_s=1, now=4.0)  # the first stop stands
    assert watch.stop == Stop.cancel("bob") and watch.kill_at == 13.0
    assert not watch.kill_due(12.99)
    assert watch.kill_due(13.0)
    assert not watch.kill_due(20.0)  # KILL once
    assert watch.wake_at(limits_at=14.0) == NEVER  # then only its exit


def test_once_stopped_only_the_kill_is_waited_for():
    # The wait used to wake at the fencing check it no longer made: past it, every wake-up was
    # due at once, and the supervisor spun on the CPU for the rest of the grace.
    watch = JobWatch.starting(0.0, lost_after_s=60)  # fencing checked every 5 s
    watch.stopping(Stop.cancel("alice"), grace_s=30, now=1.0)
    assert watch.wake_at(limits_at=2.0) == 31.0
    assert not watch.fence_check_due(20.0) and not watch.limits_due(20.0, limits_at=2.0)
    assert watch.wake_at(limits_at=2.0, lookup_at=8.0) == 8.0  # a container's lookup still is


def test_limits_are_due_at_their_sample_time_until_a_stop():
    watch = JobWatch.starting(0.0, lost_after_s=60)
    assert watch.wake_at(limits_at=1.0) == 1.0
    assert not watch.limits_due(0.5, limits_at=1.0) and watch.limits_due(1.0, limits_at=1.0)


def test_cancel_now_kills_at_once_and_cuts_a_grace_under_way_short():
    """A member cancelled a job with a day's grace that ignored SIGTERM and could do nothing
    more but `kill -9` as root. `gpuq cancel --now` kills at once, or ends a grace under way."""
    from gpuq.run.jobwatch import AT_ONCE_LOOK_S

    watch = JobWatch.starting(0.0, lost_after_s=60)
    assert watch.stopping(Stop.cancel("bob", at_once=True), grace_s=86400, now=3.0)
    assert watch.kill_at == NEVER and not watch.in_grace  # the KILL goes with the order, alone
    assert watch.wake_at(limits_at=4.0) == NEVER  # then only its exit
    graced = JobWatch.starting(0.0, lost_after_s=60)
    graced.stopping(Stop.cancel("ana"), grace_s=86400, now=3.0)
    assert graced.in_grace and graced.look_within(None) == AT_ONCE_LOOK_S and graced.look_within(0.2) == 0.2
    graced.kill_now(now=7.0)
    assert graced.stop == Stop.cancel("ana") and graced.kill_due(7.0)  # the first cancel's words
    assert not graced.in_grace and graced.look_within(None) is None  # killed: its exit is all that is left
    graced.kill_now(now=8.0)
    assert not graced.kill_due(9.0)  # KILL once
    assert Stop.decode(Stop.cancel("root", at_once=True).encode()).at_once
    assert not Stop.decode(b"cancelled by root").at_once
