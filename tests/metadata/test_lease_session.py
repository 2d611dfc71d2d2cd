"""When a lease is refreshed: a third of its TTL after etcd last confirmed it, and soon again after a failure."""

from __future__ import annotations

from tidelog.metadata.lease_session import RETRY_SECONDS, RenewalSchedule


def test_a_refresh_is_due_a_third_of_the_ttl_after_the_last_confirmed_one() -> None:
    schedule = RenewalSchedule(9.0, now=100.0)
    assert schedule.delay(100.0) == 3.0
    schedule.confirmed(103.0)
    assert schedule.delay(104.0) == 2.0


def test_a_failed_refresh_is_retried_soon_not_a_third_of_the_ttl_later() -> None:
    schedule = RenewalSchedule(9.0, now=100.0)
    schedule.failed()
    assert schedule.delay(103.0) == RETRY_SECONDS
    schedule.confirmed(103.5)
    assert schedule.delay(103.5) == 3.0


def test_a_late_refresh_goes_at_once_and_says_how_late_it_is() -> None:
    schedule = RenewalSchedule(9.0, now=100.0)
    assert schedule.delay(105.0) == 0.0  # the loop was busy past the due time: no further wait
    assert schedule.late_by(105.0) == 2.0
