"""The internal stream ``__activity``: Liftbridge's activity stream, one event per committed metadata change.

Setting ``activity_stream_enabled`` (on by default). The controller creates the stream (one partition, replicas
per ``activity_stream_replication_factor``) with the keeper that creates ``__cursors``
(:class:`~tidelog.broker.cursor_stream.CursorStreamKeeper`), and publishes to it with the
:class:`~tidelog.metadata.activity_feed.ActivityFeed`, a task of every controller term: the events of each
committed change (:mod:`tidelog.metadata.activity`), in commit order, each record's value one serialized
``ActivityStreamEvent`` whose id never repeats. This module is the feed's way into the stream:
:class:`ActivityPublisher` appends a batch of events to partition 0 with acks ALL, on this broker when it leads
the partition, else through the leader's wire protocol (as a forwarded Publish is).

Clients read ``__activity`` like any stream (gRPC ``Subscribe``, the native consumer, ``tidelog activity``) but
cannot create or delete it (:data:`~tidelog.broker.streams.RESERVED_STREAMS`); the feed
publishes at least once, so a reader drops an id it has already seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

from tidelog.broker.manager import PartitionManager
from tidelog.broker.peers import Peers
from tidelog.metadata.activity import ACTIVITY_STREAM
from tidelog.metadata.records import StreamConfig
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.protocol._gen import api_pb2 as pb
from tidelog.protocol.errors import NotLeaderError, UnavailableError, from_error_body
from tidelog.protocol.messages import Acks, ProduceRequest, ProduceResponse
from tidelog.protocol.records import NewRecord, build_batch

ACTIVITY_CONFIG: Final = StreamConfig(auto_pause_time_ms=0)
"""The broker's stream defaults (retention included), as Liftbridge's activity stream has; never auto-paused, since
the controller appends to it directly rather than through a publish that would resume it."""
PUBLISH_TIMEOUT: Final = 5.0
"""Seconds one batch may take to commit; a batch that fails is published again (the feed resumes from etcd)."""


class ActivityPublisher:
    """Appends events to ``__activity`` partition 0 wherever its leader is."""

    def __init__(
        self, broker_id: str, manager: PartitionManager, peers: Peers, snapshot: Callable[[], MetadataSnapshot]
    ) -> None:
        self._broker_id = broker_id
        self._manager = manager
        self._peers = peers
        self._snapshot = snapshot

    async def __call__(self, events: Sequence[pb.ActivityStreamEvent]) -> None:
        now = time.time_ns()
        batch = build_batch([NewRecord(event.SerializeToString()) for event in events], timestamp=now)
        try:
            partition = self._manager.leader_of(ACTIVITY_STREAM, 0)
        except NotLeaderError:
            meta = self._snapshot().partition(ACTIVITY_STREAM, 0)
            if meta is None or not meta.leader or meta.leader == self._broker_id:
                raise UnavailableError(f"{ACTIVITY_STREAM}/0 has no leader right now") from None
            request = ProduceRequest(ACTIVITY_STREAM, 0, Acks.ALL, int(PUBLISH_TIMEOUT * 1000))
            response = await self._peers.request(meta.leader, request, batch, timeout=PUBLISH_TIMEOUT)
            header = response.header
            assert isinstance(header, ProduceResponse)
            if header.error is not None:
                raise from_error_body(header.error) from None
            return
        await partition.append(batch, Acks.ALL, PUBLISH_TIMEOUT)
