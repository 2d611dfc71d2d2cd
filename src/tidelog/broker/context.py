"""What the protocol servers need from the broker, in one object.

The gRPC service and the wire server are thin: they translate requests and call into these domain types. Passing
one context rather than the whole broker keeps that dependency explicit and lets tests assemble a broker from
parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tidelog.broker.config import BrokerConfig
from tidelog.broker.manager import PartitionManager
from tidelog.broker.stream_reshape import StreamReshape
from tidelog.broker.streams import StreamAdmin
from tidelog.metadata.mirror import MetadataMirror

if TYPE_CHECKING:
    from tidelog.broker.controller_link import ControllerLink
    from tidelog.broker.cursors import CursorStore
    from tidelog.broker.groups.service import GroupService
    from tidelog.broker.partition_moves import PartitionMoves
    from tidelog.broker.partitions.followed import FollowedPartition
    from tidelog.broker.partitions.partition import Partition
    from tidelog.broker.pausing import Pauses
    from tidelog.broker.peers import Peers
    from tidelog.metadata.producer_ids import ProducerIdAllocator


@dataclass(frozen=True, slots=True)
class BrokerContext:
    broker_id: str
    config: BrokerConfig
    manager: PartitionManager
    admin: StreamAdmin
    mirror: MetadataMirror
    nc: Any  # tidelog.broker.ingest.nats_client.BrokerNats (or a stand-in with its publish, subscribe and flush)
    link: ControllerLink | None = None  # the way to the controller (None: a broker assembled without one)
    peers: Peers | None = None  # connections to the other brokers, for forwarding
    producer_ids: ProducerIdAllocator | None = None  # INIT_PRODUCER (None: a broker assembled without etcd)
    cursors: CursorStore | None = None  # SetCursor / FetchCursor (None: a broker assembled without them)
    groups: GroupService | None = None  # consumer groups (None: a broker assembled without etcd)
    pauses: Pauses | None = None  # resume and auto-pause (None: a broker assembled without them)
    reshape: StreamReshape | None = None  # add partitions, alter settings, elect leaders (None: not assembled)
    moves: PartitionMoves | None = None  # reassign partitions, decommission brokers (None: not assembled)

    @property
    def ack_timeout(self) -> float:
        """Seconds a publish waits for its ack policy when the request brings no deadline."""
        return self.config.default_ack_timeout_ms / 1000

    async def writable(self, stream: str, partition: int) -> Partition:
        """The partition this broker leads, for a write: resumed first when it is paused (a publish resumes it,
        :mod:`tidelog.broker.pausing`); the precise error otherwise."""
        if self.pauses is None:
            return self.manager.leader_of(stream, partition)
        return await self.pauses.leader(stream, partition)

    async def readable(
        self, stream: str, partition: int, *, isr_replica: bool = False
    ) -> Partition | FollowedPartition:
        """Where a reader that resumes reads (a subscribe with ``resume``, a wire fetch): resumed first when
        paused; the precise error otherwise."""
        if self.pauses is None:
            return self.manager.reader_of(stream, partition, isr_replica=isr_replica)
        return await self.pauses.reader(stream, partition, isr_replica=isr_replica)
