"""What the driver asks the brokers: which streams a query reads, their partitions, and where offsets lie.

The driver plans; it never reads records. A streaming query's planning runs in one long-lived Python process
(PySpark's stream reader runner) that asks once per trigger, so :class:`Topology` keeps one
:class:`~tidelog.client.Cluster` (connections and metadata) on a loop thread until the query stops; a batch
query opens one for its planning and closes it.

Bounds come from each partition's leader (LIST_OFFSETS: log start, high watermark, and the offset at a time),
asked concurrently. Unlike :meth:`tidelog.client.Admin.describe_stream`, which reports zeros for a leader it
cannot reach, a failure here fails the trigger: planning from made-up bounds would skip records or report them
lost. A leader change in progress (NOT_LEADER, a lost connection) is retried with fresh metadata.

With ``groupId``/``groupIdPrefix`` the driver also stores each committed micro-batch's end offsets as that
consumer group's committed offsets (:meth:`Topology.commit_group`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping

from tidelog.client import Admin, Cluster, LoopThread
from tidelog.protocol.errors import UnknownPartitionError, UnknownStreamError
from tidelog.protocol.messages import ListOffsetsRequest, ListOffsetsResponse, StreamInfo
from tidelog.spark.options import SourceOptionError, SourceOptions
from tidelog.spark.planning import Bounds, TopicPartition

GROUP_COMMIT_TIMEOUT = 30.0
"""Seconds the driver waits for a micro-batch's group offsets (each cursor write waits up to 5 s, with retries)."""


class Topology:
    """The brokers as the driver of one query sees them (see the module docstring). Not thread-safe."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._runner = LoopThread("tidelog-spark-planner")

        async def build() -> Cluster:
            return Cluster(list(options.brokers), ssl=options.ssl(), credentials=options.credentials)

        self._cluster = self._runner.run(build())

    def close(self) -> None:
        try:
            self._runner.run(self._cluster.close(), timeout=10)
        finally:
            self._runner.close()

    def streams(self) -> dict[str, StreamInfo]:
        """The streams the query reads, by name: those named (each must exist, or :class:`SourceOptionError`
        names ``streams``), or every stream the pattern matches now (maybe none)."""
        return self._runner.run(self._streams())

    async def _streams(self) -> dict[str, StreamInfo]:
        wanted = self.options.streams
        meta = await self._cluster.metadata(wanted or ())
        found = {info.name: info for info in meta.streams if info.error is None and self.options.matches(info.name)}
        missing = [name for name in wanted or () if name not in found]
        if missing:
            raise SourceOptionError("streams", f"no stream named {', '.join(map(repr, missing))} on {self._where()}")
        return dict(sorted(found.items()))

    def bounds(self, streams: Collection[StreamInfo]) -> dict[TopicPartition, Bounds]:
        """Every partition's log start and high watermark, from its leader."""
        found = self._runner.run(self._all(streams, -1))
        return {tp: Bounds(answer.log_start, answer.high_watermark) for tp, answer in found.items()}

    def offsets_at(self, streams: Collection[StreamInfo], timestamp_ns: int) -> dict[TopicPartition, int]:
        """Every partition's first offset whose record is at or after ``timestamp_ns`` (its high watermark when
        there is none)."""
        found = self._runner.run(self._all(streams, timestamp_ns))
        return {tp: answer.offset for tp, answer in found.items()}

    async def _all(
        self, streams: Collection[StreamInfo], timestamp_ns: int
    ) -> dict[TopicPartition, ListOffsetsResponse]:
        keys = [(info.name, p.id) for info in streams for p in info.partitions]
        answers = await asyncio.gather(*(self._list_offsets(stream, p, timestamp_ns) for stream, p in keys))
        return dict(zip(keys, answers, strict=True))

    async def _list_offsets(self, stream: str, partition: int, timestamp_ns: int) -> ListOffsetsResponse:
        request = ListOffsetsRequest(stream, partition, timestamp_ns)
        response = await self._cluster.leader_request(stream, partition, request)
        assert isinstance(response.header, ListOffsetsResponse)
        return response.header

    def commit_group(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Store ``offsets`` (next offsets to read) as consumer group ``group``'s committed offsets: its cursors,
        set without a member's context as ``tidelog group reset-offsets`` sets them, so ``tidelog group describe``
        shows the lag. Raises what the brokers refused (every cursor is tried)."""
        self._runner.run(self._commit_group(group, offsets), timeout=GROUP_COMMIT_TIMEOUT)

    async def _commit_group(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        admin = Admin(cluster=self._cluster)
        answers = await asyncio.gather(
            *(admin.set_cursor(stream, partition, group, offset) for (stream, partition), offset in offsets.items()),
            return_exceptions=True,
        )
        # A stream deleted since the micro-batch (under streamPattern) has nothing left to show.
        gone = (UnknownStreamError, UnknownPartitionError)
        failures = [a for a in answers if isinstance(a, BaseException) and not isinstance(a, gone)]
        if failures:
            raise failures[0]

    def _where(self) -> str:
        return ",".join(self.options.brokers)
