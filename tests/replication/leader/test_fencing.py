"""Fencing a follower's request to the leadership it names: older epochs are fenced, newer ones and strangers
are told this broker is not their leader, and a follower of this very leadership passes."""

from __future__ import annotations

from tidelog.protocol.errors import ErrorCode
from tidelog.replication.leader.fencing import fence_follower
from tidelog.replication.leader.follower_progress import FollowerProgress

REPLICAS = ("a", "b", "c")


def _progress() -> FollowerProgress:
    return FollowerProgress("a", REPLICAS, now_ns=0)


def test_a_follower_of_this_leadership_is_served() -> None:
    assert fence_follower("s/0", 4, REPLICAS, _progress(), "b", 4) is None


def test_a_follower_of_an_older_leadership_is_fenced() -> None:
    refusal = fence_follower("s/0", 4, REPLICAS, _progress(), "b", 3)
    assert refusal is not None and refusal.code == ErrorCode.FENCED_LEADER_EPOCH
    assert "leader epoch 3; it is 4 now" in refusal.message


def test_a_follower_of_a_newer_leadership_finds_this_leader_stale() -> None:
    refusal = fence_follower("s/0", 4, REPLICAS, _progress(), "b", 5)
    assert refusal is not None and refusal.code == ErrorCode.NOT_LEADER
    assert "leadership is stale" in refusal.message


def test_a_broker_that_is_no_follower_is_told_to_refresh_its_metadata() -> None:
    for stranger in ("d", "a"):  # another broker, and the leader itself
        refusal = fence_follower("s/0", 4, REPLICAS, _progress(), stranger, 4)
        assert refusal is not None and refusal.code == ErrorCode.NOT_LEADER
        assert "refresh metadata" in refusal.message and "replicas a,b,c" in refusal.message
