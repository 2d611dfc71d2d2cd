"""An in-memory broker for producer tests: every partition's leader, deduplicating with the real producer state.

The producer's sender talks to it through :class:`FakeConnection` (``send``, ``request``, ``closed``: what the
sender and the producer identity use of a :class:`~tidelog.protocol.connection.Connection`) and
:class:`FakeCluster` (a :class:`~tidelog.client.cluster.Cluster` whose connections are fake). A request is
handled when it is sent — so batches are written in send order, as a real leader starts appends — and answered
one loop turn later, in order. :attr:`FakeBroker.faults` scripts what goes wrong with the n-th produce request
(counted from 0 over the broker's life); :attr:`FakeBroker.requests` records every produce request received, so
tests assert the exact bytes the broker saw.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import cast

from tidelog.client.cluster import Cluster
from tidelog.protocol.connection import Connection, ConnectionClosedError, Response
from tidelog.protocol.errors import (
    DuplicateInFlightError,
    ErrorCode,
    InvalidArgumentError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TidelogError,
    UnknownProducerError,
    make_error,
)
from tidelog.protocol.messages import (
    ErrorBody,
    Header,
    InitProducerRequest,
    InitProducerResponse,
    PartitionInfo,
    ProduceRequest,
    ProduceResponse,
    StreamInfo,
)
from tidelog.protocol.records import BatchHeader, assign_offsets, check_batch, records_of
from tidelog.replication.idempotence.producer_state import (
    Duplicate,
    Fenced,
    InFlight,
    New,
    OutOfOrder,
    ProducerStateTable,
    UnknownProducer,
)


class Fault(enum.Enum):
    DROP = "drop"  # written; the connection dies before the answer (every unanswered request fails)
    DROP_UNWRITTEN = "drop-unwritten"  # not written; the connection dies
    TIMEOUT = "timeout"  # written; answered with TIMEOUT (not committed in time)


@dataclass
class Received:
    """One produce request as the broker saw it."""

    stream: str
    partition: int
    header: BatchHeader
    payload: bytes


@dataclass
class FakePartition:
    table: ProducerStateTable = field(default_factory=ProducerStateTable)
    log: list[bytes] = field(default_factory=list)  # stored batches, offsets assigned
    next_offset: int = 0

    def values(self) -> list[bytes | None]:
        return [record.value for batch in self.log for record in records_of(batch)]


class FakeBroker:
    def __init__(self, partitions: int = 1) -> None:
        self.partition_count = partitions
        self.partitions: dict[tuple[str, int], FakePartition] = {}
        self.faults: dict[int, Fault | ErrorCode] = {}
        self.requests: list[Received] = []
        self.inits: list[str] = []  # the name of every INIT_PRODUCER ("" anonymous)
        self.most_in_flight = 0  # the most produce requests unanswered at once on one connection
        self.connections: list[FakeConnection] = []
        self._next_id = 1000
        self._names: dict[str, tuple[int, int]] = {}

    def partition(self, stream: str, partition: int = 0) -> FakePartition:
        return self.partitions.setdefault((stream, partition), FakePartition())

    def init_producer(self, name: str) -> InitProducerResponse:
        self.inits.append(name)
        if name and name in self._names:
            producer_id, epoch = self._names[name]
            self._names[name] = (producer_id, epoch + 1)
        else:
            self._next_id += 1
            if name:
                self._names[name] = (self._next_id, 0)
            producer_id, epoch = self._next_id, -1
        return InitProducerResponse(producer_id, epoch + 1)

    def produce(self, request: ProduceRequest, payload: bytes) -> tuple[Fault | None, ProduceResponse | TidelogError]:
        """Handle one produce request: the fault scripted for it (if any) and the answer."""
        index = len(self.requests)
        header = check_batch(payload)  # the CRC too: a restamped batch must still verify
        self.requests.append(Received(request.stream, request.partition, header, payload))
        fault = self.faults.get(index)
        if isinstance(fault, ErrorCode):
            return None, make_error(fault)
        if fault is Fault.DROP_UNWRITTEN:
            return fault, ConnectionClosedError("dropped")
        part = self.partition(request.stream, request.partition)
        verdict = part.table.check(header)
        if isinstance(verdict, Duplicate):
            answer: ProduceResponse | TidelogError = ProduceResponse(verdict.base_offset, verdict.last_offset)
        elif isinstance(verdict, New):
            stored = bytearray(payload)
            assign_offsets(stored, 0, part.next_offset, 0)
            part.log.append(bytes(stored))
            part.table.record(header._replace(base_offset=part.next_offset))
            base = part.next_offset
            part.next_offset += header.last_offset_delta + 1
            answer = ProduceResponse(base, part.next_offset - 1)
        elif isinstance(verdict, OutOfOrder):
            answer = OutOfOrderSequenceError(f"expected sequence {verdict.expected_sequence}")
        elif isinstance(verdict, Fenced):
            answer = ProducerFencedError(f"epoch {verdict.current_epoch} is newer")
        elif isinstance(verdict, UnknownProducer):
            answer = UnknownProducerError()
        elif isinstance(verdict, InFlight):
            answer = DuplicateInFlightError()
        else:
            answer = InvalidArgumentError(str(verdict))
        if fault is Fault.TIMEOUT and isinstance(answer, ProduceResponse):
            body = ErrorBody(code=int(ErrorCode.TIMEOUT), message="not committed in time", retriable=True)
            answer = ProduceResponse(answer.base_offset, answer.last_offset, error=body)
        return fault, answer

    def received(self, stream: str, partition: int = 0) -> list[Received]:
        return [r for r in self.requests if (r.stream, r.partition) == (stream, partition)]


class FakeConnection:
    """What the producer uses of a connection, talking to a :class:`FakeBroker`."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.closed = False
        self.address = "fake:0"
        self._pending: list[asyncio.Future[Response]] = []
        self._loop = asyncio.get_running_loop()

    def send(self, header: Header, payload: bytes | Sequence[bytes] = b"") -> asyncio.Future[Response]:
        if self.closed:
            raise ConnectionClosedError("connection to fake:0 is closed")
        future: asyncio.Future[Response] = self._loop.create_future()
        self._pending.append(future)
        self.broker.most_in_flight = max(self.broker.most_in_flight, len(self._pending))
        assert isinstance(header, ProduceRequest) and isinstance(payload, bytes)
        fault, answer = self.broker.produce(header, payload)
        self._loop.call_soon(self._answer, future, fault, answer)
        return future

    async def request(self, header: Header, payload: bytes = b"", *, timeout: float | None = None) -> Response:
        assert isinstance(header, InitProducerRequest)
        await asyncio.sleep(0)
        return Response(self.broker.init_producer(header.name), memoryview(b""))

    def _answer(
        self, future: asyncio.Future[Response], fault: Fault | None, answer: ProduceResponse | TidelogError
    ) -> None:
        if future.done():
            return
        if fault in (Fault.DROP, Fault.DROP_UNWRITTEN):
            self.kill()
            return
        self._pending.remove(future)
        if isinstance(answer, TidelogError):
            future.set_exception(answer)
        else:
            future.set_result(Response(answer, memoryview(b"")))

    def kill(self) -> None:
        """The connection breaks: every request not yet answered fails (those written stay written)."""
        self.closed = True
        pending, self._pending = self._pending, []
        for future in pending:
            if not future.done():
                future.set_exception(ConnectionClosedError("connection to fake:0 was lost"))


class FakeCluster(Cluster):
    """A :class:`Cluster` whose every leader is ``broker``, reached over :class:`FakeConnection`\\ s."""

    def __init__(self, broker: FakeBroker) -> None:
        super().__init__("fake:0")
        self.fake = broker
        self.forgotten: list[str] = []
        self._live: FakeConnection | None = None

    def _current(self) -> Connection:
        if self._live is None or self._live.closed:
            self._live = FakeConnection(self.fake)
            self.fake.connections.append(self._live)
        return cast(Connection, self._live)

    async def any_connection(self, avoid: Collection[tuple[str, int]] = ()) -> Connection:
        return self._current()  # one broker: nothing to avoid it for

    def address_of(self, connection: Connection) -> tuple[str, int] | None:
        return None

    async def leader_connection(self, stream: str, partition: int, *, dedicated: bool = False) -> Connection:
        await asyncio.sleep(0)
        return self._current()

    async def stream(self, name: str, *, refresh: bool = False) -> StreamInfo:
        parts = tuple(PartitionInfo(i, "b1", ("b1",), ("b1",), 0, 0, 0) for i in range(self.fake.partition_count))
        return StreamInfo(name, name, parts)

    def forget(self, stream: str) -> None:
        self.forgotten.append(stream)

    async def close(self) -> None:
        pass
