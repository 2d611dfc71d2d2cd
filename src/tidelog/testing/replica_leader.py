"""A partition leader serving the replication protocol on a real wire server, for replication tests.

:func:`start_leader` makes broker ``a`` the leader of ``s/0`` (replicas ``a`` and ``b``) over a real
:class:`~tidelog.broker.partitions.partition.Partition` and :class:`~tidelog.storage.log.Log`, served by a
:class:`~tidelog.api.wire.server.WireServer` whose manager (:class:`~tidelog.testing.fakes.StubManager`) leads
that partition alone. Followers under test fetch from it as from a real broker; the test writes through
:meth:`Leader.append` and may stop and restart serving on the same port.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from tidelog.api.wire.server import WireServer
from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import BrokerContext
from tidelog.broker.partitions.partition import Partition
from tidelog.metadata.records import PartitionRecord, StreamRecord
from tidelog.protocol.messages import Acks
from tidelog.protocol.records import NewRecord, build_batch
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log
from tidelog.testing.fakes import StubManager

NOW = 1_700_000_000_000_000_000
"""The timestamp of every batch :func:`batch` builds (ns)."""

APPEND_TIMEOUT = 20.0
"""Seconds :meth:`Leader.append` waits for an append (an upper bound: it fails a test, never paces one)."""


def batch(*values: bytes) -> bytes:
    """One batch of records with these values, stamped :data:`NOW`."""
    return build_batch([NewRecord(v) for v in values], timestamp=NOW)


def open_log(path: Path, flush: FlushPolicy = FlushPolicy.NEVER) -> Log:
    """A log at ``path`` with default settings but the flush policy."""
    return Log.open(path, LogConfig(flush_policy=flush))


@dataclass
class Leader:
    """Broker ``a`` leading ``s/0`` (replicas a, b) and serving it on a wire server; restartable."""

    partition: Partition
    ctx: BrokerContext
    zero_copy: bool
    server: WireServer | None = None
    port: int = 0
    others: list[Partition] = field(default_factory=list)  # s/1, s/2…: see lead_also()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> Log:
        return self.partition.log

    async def serve(self) -> None:
        """Start (or restart, on the same port) the wire server."""
        server = WireServer(self.ctx, "127.0.0.1", self.port, zero_copy=self.zero_copy)
        await server.start()
        self.server, self.port = server, server.port

    async def stop_serving(self) -> None:
        if self.server is not None:
            await self.server.stop(grace=1.0)
            self.server = None

    async def append(self, *values: bytes, acks: Acks = Acks.LEADER) -> int:
        """Append one batch; its last offset."""
        return (await self.partition.append(batch(*values), acks, APPEND_TIMEOUT)).last_offset

    def lead_also(self, log: Log) -> Partition:
        """Lead the next partition of ``s`` too (``s/1``, then ``s/2``…), same replicas and epoch, over ``log``,
        served by the same server: for fetch sessions, which carry many partitions."""
        record = msgspec.structs.replace(self.partition.record, id=len(self.others) + 1)
        partition = Partition(self.partition.stream, record, log, "a", min_isr=1)
        self.others.append(partition)
        manager = self.ctx.manager
        assert isinstance(manager, StubManager)
        manager.partitions[("s", record.id)] = partition
        return partition

    async def close(self) -> None:
        await self.stop_serving()
        await self.partition.close()
        for other in self.others:
            await other.close()


async def start_leader(
    log: Log, *, epoch: int = 0, isr: tuple[str, ...] = ("a", "b"), zero_copy: bool = True
) -> Leader:
    """Serve ``log`` as partition ``s/0`` led by broker ``a`` at ``epoch``, on a free loopback port."""
    stream = StreamRecord("s", "s", "", 1, 2, NOW)
    record = PartitionRecord("s", 0, ("a", "b"), "a", isr, leader_epoch=epoch)
    partition = Partition(stream, record, log, "a", min_isr=1)
    config = BrokerConfig(data_dir=log.directory.parent, port=0, wire_port=0)
    manager = StubManager({("s", 0): partition})
    ctx = BrokerContext("a", config, manager, admin=None, mirror=None, nc=None)  # type: ignore[arg-type]
    leader = Leader(partition, ctx, zero_copy)
    await leader.serve()
    return leader
