"""The sync facade: the asyncio client driven from plain threads, for scripts, notebooks and the CLI.

One event loop runs in a daemon thread (:class:`LoopThread`); every blocking method submits a coroutine to it
and waits for the result. :class:`TidelogClient` owns one loop thread and one
:class:`~tidelog.client.cluster.Cluster` and hands out producers, consumers and an admin that share them::

    with TidelogClient("127.0.0.1:9293") as client:
        client.admin.create_stream("orders", partitions=3)
        with client.producer() as producer:
            producer.send("orders", b"hello").result()   # a concurrent.futures.Future
        with client.consumer("orders", stop_at_end=True) as consumer:
            for record in consumer:
                print(record.offset, record.value)
        with client.group_consumer("orders", group_id="billing") as member:   # shares partitions, commits
            for record in member:
                ...

Each :class:`SyncProducer`, :class:`SyncConsumer`, :class:`SyncGroupConsumer` and :class:`SyncAdmin` may also be
built on its own (it then starts its own loop thread). A call into the loop thread costs tens of microseconds, so
per-record ``send()`` from a thread is for convenience; :meth:`SyncProducer.send_many` sends a whole list in one call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

from tidelog.client.accumulator import RecordMetadata
from tidelog.client.admin import Admin, ConfigValue
from tidelog.client.cluster import DEFAULT_BOOTSTRAP, Cluster
from tidelog.client.consumer import Consumer
from tidelog.client.group_consumer import GroupConsumer
from tidelog.client.group_membership import StreamPartition
from tidelog.client.producer import Headers, Producer
from tidelog.client.records import FetchedBatch
from tidelog.protocol.group_messages import DescribeGroupResponse, GroupSummary
from tidelog.protocol.messages import MetadataResponse, ResetHeadResponse, StreamInfo, StreamSummary
from tidelog.protocol.records.rows import ConsumerRecord

T = TypeVar("T")


class LoopThread:
    """An event loop (uvloop when installed) running in a daemon thread until :meth:`close`."""

    def __init__(self, name: str = "tidelog-client") -> None:
        try:
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency
            self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (its exception is raised here)."""
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class _Facade:
    """Owns (or borrows) a loop thread; a context manager that closes what it owns."""

    def __init__(self, runner: LoopThread | None) -> None:
        self._owns_runner = runner is None
        self._runner = LoopThread() if runner is None else runner

    def _close_runner(self) -> None:
        if self._owns_runner:
            self._runner.close()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncProducer(_Facade):
    """:class:`~tidelog.client.producer.Producer` for threads. Options are the producer's keywords."""

    def __init__(
        self, bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, *, runner: LoopThread | None = None, **options: Any
    ) -> None:
        super().__init__(runner)

        async def build() -> Producer:
            producer = Producer(bootstrap, **options)
            await producer.start()
            return producer

        self._producer = self._runner.run(build())

    def send(
        self,
        stream: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        """Queue one record; the returned future resolves once it is acknowledged."""
        return self._runner.submit(self._send_one(stream, value, key, headers, partition, timestamp))

    async def _send_one(
        self,
        stream: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        partition: int | None,
        timestamp: int | None,
    ) -> RecordMetadata:
        return await (await self._producer.send(stream, value, key, headers, partition, timestamp))

    def send_many(
        self, stream: str, values: Iterable[bytes | None], *, key: bytes | None = None, timeout: float | None = None
    ) -> list[RecordMetadata]:
        """Send every value (one loop-thread call for all of them) and wait until each is acknowledged."""
        items = list(values)

        async def go() -> list[RecordMetadata]:
            futures = [await self._producer.send(stream, value, key) for value in items]
            await self._producer.flush()
            return [await future for future in futures]

        return self._runner.run(go(), timeout)

    def send_and_wait(self, stream: str, value: bytes | None, key: bytes | None = None, **kw: Any) -> RecordMetadata:
        return self._runner.run(self._producer.send_and_wait(stream, value, key, **kw))

    def flush(self, timeout: float | None = None) -> None:
        self._runner.run(self._producer.flush(), timeout)

    def close(self) -> None:
        try:
            if not self._runner.loop.is_closed():
                self._runner.run(self._producer.close())
        finally:
            self._close_runner()


class SyncConsumer(_Facade):
    """:class:`~tidelog.client.consumer.Consumer` for threads: iterate it for records."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        stream: str = "",
        *,
        runner: LoopThread | None = None,
        **options: Any,
    ) -> None:
        super().__init__(runner)

        async def build() -> Consumer:
            consumer = Consumer(bootstrap, stream, **options)
            await consumer.start()
            return consumer

        self._consumer = self._runner.run(build())

    @property
    def consumer(self) -> Consumer:
        """The asyncio consumer underneath (use it only from the loop thread)."""
        return self._consumer

    def poll(self, timeout: float | None = None) -> list[FetchedBatch] | None:
        """The batches of the next fetch responses; None once finished (``stop_at_end``)."""
        return self._runner.run(self._consumer.poll(), timeout)

    def fetch_batches(self) -> Iterator[FetchedBatch]:
        while (batches := self.poll()) is not None:
            yield from batches

    def __iter__(self) -> Iterator[ConsumerRecord]:
        for batch in self.fetch_batches():
            yield from batch.records()

    def position(self, partition: int) -> int:
        return self._consumer.position(partition)

    def close(self) -> None:
        try:
            if not self._runner.loop.is_closed():
                self._runner.run(self._consumer.close())
        finally:
            self._close_runner()


class SyncGroupConsumer(_Facade):
    """:class:`~tidelog.client.group_consumer.GroupConsumer` for threads: iterate it for records. Options are the
    group consumer's keywords (``group_id`` among them); rebalance callbacks run in the loop thread."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        streams: str | Sequence[str] = (),
        *,
        runner: LoopThread | None = None,
        **options: Any,
    ) -> None:
        super().__init__(runner)

        async def build() -> GroupConsumer:
            consumer = GroupConsumer(bootstrap, streams, **options)
            await consumer.start()
            return consumer

        self._consumer = self._runner.run(build())

    @property
    def consumer(self) -> GroupConsumer:
        """The asyncio group consumer underneath (use it only from the loop thread)."""
        return self._consumer

    def poll(self, timeout: float | None = None) -> ConsumerRecord | None:
        """The next record, or None when none came within ``timeout`` seconds."""
        return self._runner.run(self._consumer.getone(timeout))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        while (record := self._runner.run(self._consumer.getone())) is not None:
            yield record

    def assignment(self) -> frozenset[StreamPartition]:
        return self._runner.run(_value(self._consumer.assignment))

    def position(self, tp: StreamPartition) -> int:
        return self._runner.run(_value(lambda: self._consumer.position(tp)))

    def seek(self, tp: StreamPartition, offset: int) -> None:
        self._runner.run(_value(lambda: self._consumer.seek(tp, offset)))

    def committed(self, tp: StreamPartition) -> int | None:
        return self._runner.run(self._consumer.committed(tp))

    def commit(self, offsets: Mapping[StreamPartition, int] | None = None) -> None:
        self._runner.run(self._consumer.commit(offsets))

    def close(self) -> None:
        try:
            if not self._runner.loop.is_closed():
                self._runner.run(self._consumer.close())
        finally:
            self._close_runner()


async def _value(read: Callable[[], T]) -> T:
    """Run a plain method of a loop-thread object in the loop thread (it reads state the loop changes)."""
    return read()


class SyncAdmin(_Facade):
    """:class:`~tidelog.client.admin.Admin` for threads."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        runner: LoopThread | None = None,
        cluster: Cluster | None = None,
    ) -> None:
        super().__init__(runner)

        async def build() -> Admin:
            return Admin(bootstrap, cluster=cluster)

        self._admin = self._runner.run(build())

    def create_stream(
        self, name: str, subject: str | None = None, *, config: dict[str, ConfigValue] | None = None, **kw: Any
    ) -> None:
        self._runner.run(self._admin.create_stream(name, subject, config=config, **kw))

    def delete_stream(self, name: str) -> None:
        self._runner.run(self._admin.delete_stream(name))

    def set_stream_state(self, name: str, partitions: Sequence[int] = (), **flags: Any) -> None:
        self._runner.run(self._admin.set_stream_state(name, partitions, **flags))

    def reset_head(
        self, stream: str, partition: int, *, offset: int | None = None, timeout_ms: int = 10_000
    ) -> ResetHeadResponse:
        return self._runner.run(self._admin.reset_head(stream, partition, offset=offset, timeout_ms=timeout_ms))

    def list_streams(self, prefix: str = "") -> list[StreamSummary]:
        return self._runner.run(self._admin.list_streams(prefix))

    def describe_stream(self, name: str) -> StreamInfo:
        return self._runner.run(self._admin.describe_stream(name))

    def metadata(self, streams: Sequence[str] = ()) -> MetadataResponse:
        return self._runner.run(self._admin.metadata(streams))

    def set_cursor(self, stream: str, partition: int, cursor_id: str, offset: int, **kw: Any) -> None:
        self._runner.run(self._admin.set_cursor(stream, partition, cursor_id, offset, **kw))

    def fetch_cursor(self, stream: str, partition: int, cursor_id: str, **kw: Any) -> int:
        return self._runner.run(self._admin.fetch_cursor(stream, partition, cursor_id, **kw))

    def list_groups(self) -> list[GroupSummary]:
        return self._runner.run(self._admin.list_groups())

    def describe_group(self, group_id: str) -> DescribeGroupResponse:
        return self._runner.run(self._admin.describe_group(group_id))

    def group_offsets(self, group_id: str, **kw: Any) -> dict[tuple[str, int], int]:
        return self._runner.run(self._admin.group_offsets(group_id, **kw))

    def delete_group(self, group_id: str, **kw: Any) -> int:
        return self._runner.run(self._admin.delete_group(group_id, **kw))

    def close(self) -> None:
        try:
            if not self._runner.loop.is_closed():
                self._runner.run(self._admin.close())
        finally:
            self._close_runner()


class TidelogClient(_Facade):
    """One loop thread and one cluster view, shared by the producers, consumers and admin it creates."""

    def __init__(self, bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, **cluster_options: Any) -> None:
        super().__init__(None)

        async def build() -> Cluster:
            return Cluster(bootstrap, **cluster_options)

        self._cluster = self._runner.run(build())
        self._children: list[_Facade] = []
        self.admin = SyncAdmin(runner=self._runner, cluster=self._cluster)

    def producer(self, **options: Any) -> SyncProducer:
        """A producer sharing this client's connections (options as for :class:`Producer`)."""
        producer = SyncProducer(runner=self._runner, cluster=self._cluster, **options)
        self._children.append(producer)
        return producer

    def consumer(self, stream: str, **options: Any) -> SyncConsumer:
        """A consumer of ``stream`` (options as for :class:`Consumer`); it opens its own fetch connections."""
        consumer = SyncConsumer(stream=stream, runner=self._runner, cluster=self._cluster, **options)
        self._children.append(consumer)
        return consumer

    def group_consumer(self, streams: str | Sequence[str], *, group_id: str, **options: Any) -> SyncGroupConsumer:
        """A member of consumer group ``group_id`` consuming ``streams`` (options as for :class:`GroupConsumer`)."""
        consumer = SyncGroupConsumer(
            streams=streams, runner=self._runner, cluster=self._cluster, group_id=group_id, **options
        )
        self._children.append(consumer)
        return consumer

    def close(self) -> None:
        try:
            for child in self._children:
                child.close()
            self.admin.close()
            self._runner.run(self._cluster.close())
        finally:
            self._close_runner()
