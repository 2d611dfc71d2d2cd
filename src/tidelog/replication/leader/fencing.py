"""Fencing a follower's request to this leadership: who may fetch, list or copy from a leader, and at which epoch.

Every request of the replication family (REPLICA_FETCH, SEGMENT_LIST, SEGMENT_FETCH, and EPOCH_END_OFFSET when
the follower names the leadership it believes in) carries the follower's id and the leader epoch it follows. The
leader answers only a follower of its own leadership, so that a follower never copies from, nor truncates on
the word of, a leader that was deposed:

- an older epoch than the leader's: FENCED_LEADER_EPOCH (the follower's metadata is stale);
- a newer one: NOT_LEADER (this leader is the stale one: a successor was elected and it has not heard yet);
- a broker that is no replica of the partition: NOT_LEADER (Kafka's NOT_LEADER_OR_FOLLOWER: the two views of
  the assignment disagree, and the one to refresh is whichever is older).

A fenced request acknowledges nothing: the caller records a fetch's offset only when this returns None.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidelog.protocol.errors import FencedLeaderEpochError, NotLeaderError, TidelogError
from tidelog.replication.leader.follower_progress import FollowerProgress


def fence_follower(
    name: str,
    epoch: int,
    replicas: Sequence[str],
    progress: FollowerProgress,
    replica_id: str,
    follower_epoch: int,
) -> TidelogError | None:
    """Why ``replica_id``, following at ``follower_epoch``, may not be served by the leader of ``name`` at
    ``epoch``; None when it may."""
    if follower_epoch < epoch:
        return FencedLeaderEpochError(
            f"replica {replica_id} follows {name} at leader epoch {follower_epoch}; it is {epoch} now"
        )
    if follower_epoch > epoch:
        return NotLeaderError(
            f"replica {replica_id} follows {name} at leader epoch {follower_epoch}, "
            f"newer than this leader's {epoch}: this broker's leadership is stale"
        )
    if progress.state(replica_id) is None:
        return NotLeaderError(
            f"broker {replica_id} is not a follower of {name} at leader epoch {epoch} "
            f"(replicas {','.join(replicas)}): refresh metadata"
        )
    return None
