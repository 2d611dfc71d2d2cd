"""The asyncio admin client: create, delete, list, describe, pause and set read-only streams; cluster metadata;
confirm the head of a suspended partition (fail to safety); store and read cursors (consumer positions); list,
describe and delete consumer groups and read their committed offsets (``tidelog group``).

::

    async with Admin("127.0.0.1:9293") as admin:
        await admin.create_stream("orders", "orders.>", partitions=3, config={"retention.max.bytes": 1 << 30})
        info = await admin.describe_stream("orders")     # partitions with leader, ISR, watermarks

Requests go to any broker; the broker forwards metadata changes to etcd and answers once it has applied them,
so the stream can be used as soon as :meth:`Admin.create_stream` returns. Watermarks are only known to a
partition's leader, so :meth:`Admin.describe_stream` asks each leader (LIST_OFFSETS) for its partition's
bounds, concurrently. Results are the wire protocol's own frozen structs (:class:`StreamInfo`,
:class:`PartitionInfo`, :class:`StreamSummary`, :class:`MetadataResponse`): offsets in them are *exclusive*
(``high_watermark`` and ``log_end`` are one past the last committed and the last written record).
"""

from __future__ import annotations

import asyncio
import ssl as ssl_
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

import msgspec

from tidelog.client.cluster import DEFAULT_BOOTSTRAP, Cluster
from tidelog.protocol.connection import Connection
from tidelog.protocol.cursor_messages import (
    FetchCursorRequest,
    FetchCursorResponse,
    ListCursorsRequest,
    ListCursorsResponse,
    SetCursorRequest,
)
from tidelog.protocol.cursors import CURSORS_STREAM, cursor_key, cursors_partition
from tidelog.protocol.errors import (
    NotLeaderError,
    PartitionSuspendedError,
    RequestTimeoutError,
    TidelogError,
    UnavailableError,
    UnknownGroupError,
    UnknownStreamError,
)
from tidelog.protocol.group_messages import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    GroupSummary,
    ListGroupsRequest,
    ListGroupsResponse,
)
from tidelog.protocol.messages import (
    CreateStreamRequest,
    DeleteStreamRequest,
    GroupContext,
    Header,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListStreamsRequest,
    ListStreamsResponse,
    MetadataResponse,
    PartitionInfo,
    ResetHeadRequest,
    ResetHeadResponse,
    SetStreamStateRequest,
    SkipDamagedRequest,
    SkipDamagedResponse,
    StreamInfo,
    StreamSummary,
)
from tidelog.protocol.reassign_messages import (
    DecommissionBrokerRequest,
    DecommissionBrokerResponse,
    ListReassignmentsRequest,
    ListReassignmentsResponse,
    PartitionReplicas,
    ReassignPartitionsRequest,
    ReassignPartitionsResponse,
)
from tidelog.protocol.reshape_messages import (
    RESET,
    AddPartitionsRequest,
    AddPartitionsResponse,
    AlterStreamRequest,
    AlterStreamResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
)

ConfigValue = str | int | bool
CURSOR_RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
"""Seconds between looks for a cursor's leader (a failover of a __cursors partition takes about a lease TTL)."""


def _setting(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Admin:
    """Stream administration and metadata over the wire protocol."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        cluster: Cluster | None = None,
        ssl: ssl_.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        """``cluster`` shares connections and metadata with other client objects (``close`` leaves it open)."""
        self._owns_cluster = cluster is None
        self._cluster = Cluster(bootstrap, ssl=ssl, credentials=credentials) if cluster is None else cluster

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    async def create_stream(
        self,
        name: str,
        subject: str | None = None,
        *,
        partitions: int = 1,
        replication_factor: int = 1,
        group: str = "",
        config: Mapping[str, ConfigValue] | None = None,
        timeout_ms: int = 10_000,
    ) -> None:
        """Create a stream on NATS subject ``subject`` (the stream's name when omitted).

        ``replication_factor`` -1 means every broker. ``config`` overrides per-stream settings by name, e.g.
        ``{"retention.max.bytes": 1 << 30, "flush.policy": "never", "compact.enabled": True}``. Creating the
        same stream again (same subject, partitions, replication factor, group and settings) succeeds and changes
        nothing; ``StreamExistsError`` when the name is taken by a stream that differs (the message names what),
        ``InvalidArgumentError`` for a bad name, subject or setting.
        """
        request = CreateStreamRequest(
            name,
            subject or name,
            partitions,
            replication_factor,
            group,
            {key: _setting(value) for key, value in (config or {}).items()},
            timeout_ms,
        )
        connection = await self._cluster.any_connection()
        await connection.request(request, timeout=timeout_ms / 1000 + self._cluster.request_timeout)
        self._cluster.forget(name)

    async def delete_stream(self, name: str, *, timeout_ms: int = 10_000) -> None:
        """Delete a stream and its data on every broker; ``UnknownStreamError`` if there is none."""
        connection = await self._cluster.any_connection()
        await connection.request(
            DeleteStreamRequest(name, timeout_ms), timeout=timeout_ms / 1000 + self._cluster.request_timeout
        )
        self._cluster.forget(name)

    async def set_stream_state(
        self,
        name: str,
        partitions: Sequence[int] = (),
        *,
        paused: bool | None = None,
        readonly: bool | None = None,
        timeout_ms: int = 10_000,
    ) -> None:
        """Pause or resume (``paused``) and set or clear read-only (``readonly``) on ``partitions`` of a stream,
        all of them when none are given; a flag left ``None`` is not changed. A paused partition resumes on its
        next write (Liftbridge's rule); a read-only one refuses writes with ``ReadonlyError``."""
        request = SetStreamStateRequest(name, tuple(partitions), paused, readonly, timeout_ms)
        connection = await self._cluster.any_connection()
        await connection.request(request, timeout=timeout_ms / 1000 + self._cluster.request_timeout)
        self._cluster.forget(name)

    async def rotate_key(self, name: str, *, timeout_ms: int = 10_000) -> None:
        """Give every partition of encrypted stream ``name`` a new data key: data written from now on is sealed
        with it; the old keys stay to read older data. ``InvalidArgumentError`` for a stream that is not
        encrypted."""
        request = SetStreamStateRequest(name, (), timeout_ms=timeout_ms, rotate_key=True)
        connection = await self._cluster.any_connection()
        await connection.request(request, timeout=timeout_ms / 1000 + self._cluster.request_timeout)

    async def add_partitions(self, name: str, partitions: int, *, timeout_ms: int = 30_000) -> AddPartitionsResponse:
        """Grow stream ``name`` to ``partitions`` partitions; partition ``i`` listens on ``subject.i``
        (Liftbridge's rule). ``InvalidArgumentError`` for fewer than it has; the same count changes nothing."""
        request = AddPartitionsRequest(name, partitions, timeout_ms)
        connection = await self._cluster.any_connection()
        response = await connection.request(request, timeout=timeout_ms / 1000 + self._cluster.request_timeout)
        self._cluster.forget(name)
        answer = response.header
        assert isinstance(answer, AddPartitionsResponse)
        return answer

    async def alter_stream(
        self, name: str, settings: Mapping[str, ConfigValue | None], *, timeout_ms: int = 10_000
    ) -> AlterStreamResponse:
        """Change stream settings at run time, by name as in :meth:`create_stream`'s ``config``; None takes a
        setting back to the broker default. A setting that cannot change at run time is refused by name
        (``InvalidArgumentError``) and nothing changes. Returns the settings whose value changed."""
        values = {key: RESET if value is None else _setting(value) for key, value in settings.items()}
        connection = await self._cluster.any_connection()
        response = await connection.request(
            AlterStreamRequest(name, values, timeout_ms), timeout=timeout_ms / 1000 + self._cluster.request_timeout
        )
        answer = response.header
        assert isinstance(answer, AlterStreamResponse)
        return answer

    async def elect_leaders(self, *, timeout_ms: int = 30_000) -> ElectLeadersResponse:
        """Move every partition's leadership to its preferred replica where it is alive and in the ISR."""
        connection = await self._cluster.any_connection()
        response = await connection.request(
            ElectLeadersRequest(timeout_ms), timeout=timeout_ms / 1000 + self._cluster.request_timeout
        )
        answer = response.header
        assert isinstance(answer, ElectLeadersResponse)
        return answer

    async def reassign_partitions(
        self,
        plan: Sequence[PartitionReplicas] = (),
        *,
        throttle_bps: int = 0,
        cancel: bool = False,
        generate_for: Sequence[str] = (),
        streams: Sequence[str] = (),
        timeout_ms: int = 30_000,
    ) -> ReassignPartitionsResponse:
        """Start reassigning each partition of ``plan`` to its replicas (or, with ``cancel``, undo their
        reassignments); with ``generate_for`` (broker ids), propose a plan keeping ``streams``' replicas (all
        streams' when empty) on those brokers, and change nothing. ``throttle_bps`` caps the bytes per second a
        leader sends each replica being added. Each move gives the replicas before and after."""
        request = ReassignPartitionsRequest(
            tuple(plan), throttle_bps, cancel, bool(generate_for), tuple(generate_for), tuple(streams), timeout_ms
        )
        connection = await self._cluster.any_connection()
        response = await connection.request(request, timeout=timeout_ms / 1000 + self._cluster.request_timeout)
        answer = response.header
        assert isinstance(answer, ReassignPartitionsResponse)
        return answer

    async def list_reassignments(
        self, plan: Sequence[PartitionReplicas] = (), *, broker_id: str = ""
    ) -> ListReassignmentsResponse:
        """How far the reassignment of each partition of ``plan`` to its replicas is (every reassignment in
        progress when empty; with ``broker_id``, every partition holding a replica there)."""
        connection = await self._cluster.any_connection()
        response = await connection.request(ListReassignmentsRequest(tuple(plan), broker_id))
        answer = response.header
        assert isinstance(answer, ListReassignmentsResponse)
        return answer

    async def decommission_broker(
        self, broker_id: str, *, throttle_bps: int = 0, timeout_ms: int = 30_000
    ) -> DecommissionBrokerResponse:
        """Start moving every replica off ``broker_id``; the moves (a ``note`` says why one cannot move now)."""
        connection = await self._cluster.any_connection()
        response = await connection.request(
            DecommissionBrokerRequest(broker_id, throttle_bps, timeout_ms),
            timeout=timeout_ms / 1000 + self._cluster.request_timeout,
        )
        answer = response.header
        assert isinstance(answer, DecommissionBrokerResponse)
        return answer

    async def reset_head(
        self, stream: str, partition: int, *, offset: int | None = None, timeout_ms: int = 10_000
    ) -> ResetHeadResponse:
        """Confirm the head of a suspended partition (fail to safety): appends resume there.

        ``offset`` None confirms the leader's log end; otherwise it must lie between the leader's high watermark
        and its log end, and the leader cuts its uncommitted tail down to it. Returns once the leader has
        resumed, with ``head`` where its log then ends (a cut falls on a batch boundary at or below ``offset``)
        and ``log_end`` where it ended before. Raises ``InvalidArgumentError`` for a partition that is not
        suspended or an offset out of those bounds, ``PartitionSuspendedError`` when the leader suspended again
        (its message says why), ``UnavailableError`` when the partition has no live leader.
        """
        request = ResetHeadRequest(stream, partition, -1 if offset is None else offset, timeout_ms)
        deadline = time.monotonic() + timeout_ms / 1000 + self._cluster.request_timeout
        connection = await self._cluster.any_connection()
        response = await connection.request(request, timeout=timeout_ms / 1000 + self._cluster.request_timeout)
        confirmed = response.header
        assert isinstance(confirmed, ResetHeadResponse)
        self._cluster.forget(stream)
        bounds = await self._resumed(stream, partition, confirmed.leader_epoch, deadline)
        return msgspec.structs.replace(confirmed, head=bounds.log_end)

    async def skip_damaged(
        self, stream: str, partition: int, first: int | None = None, last: int | None = None
    ) -> SkipDamagedResponse:
        """The offset ranges of a partition its leader found damaged on disk; with ``first`` and ``last`` (a
        range exactly as listed) confirm skipping it first: readers then pass over it silently. Raises
        ``InvalidArgumentError`` naming the known ranges for a range that is not one of them."""
        if (first is None) != (last is None):
            raise ValueError("give both first and last, or neither")
        request = SkipDamagedRequest(stream, partition, -1 if first is None else first, -1 if last is None else last)
        connection = await self._cluster.leader_connection(stream, partition)
        response = await connection.request(request, timeout=self._cluster.request_timeout)
        answer = response.header
        assert isinstance(answer, SkipDamagedResponse)
        return answer

    async def _resumed(self, stream: str, partition: int, epoch: int, deadline: float) -> ListOffsetsResponse:
        """Wait until the leader answers for leader epoch ``epoch`` (it has applied the confirmed head), asking
        it again with a growing pause: there is no notice to wait on, and it takes milliseconds."""
        delay = 0.01
        while True:
            try:
                connection = await self._cluster.leader_connection(stream, partition)
                response = await connection.request(
                    ListOffsetsRequest(stream, partition), timeout=self._cluster.request_timeout
                )
                bounds = response.header
                assert isinstance(bounds, ListOffsetsResponse)
                if bounds.leader_epoch >= epoch:
                    if bounds.suspended:
                        raise PartitionSuspendedError(f"{stream}/{partition}: suspended again: {bounds.suspended}")
                    return bounds
            except TidelogError as exc:
                if not exc.retriable:
                    raise
                self._cluster.forget(stream)  # NOT_LEADER while the leadership restarts: ask the metadata again
            if time.monotonic() + delay > deadline:
                raise RequestTimeoutError(f"the leader of {stream}/{partition} did not resume at epoch {epoch} in time")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def list_streams(self, prefix: str = "") -> list[StreamSummary]:
        """Every stream whose name starts with ``prefix``, by name."""
        connection = await self._cluster.any_connection()
        response = await connection.request(ListStreamsRequest(prefix), timeout=self._cluster.request_timeout)
        assert isinstance(response.header, ListStreamsResponse)
        return list(response.header.streams)

    async def metadata(self, streams: Sequence[str] = ()) -> MetadataResponse:
        """Brokers and streams as the answering broker sees them (watermarks only for partitions it leads)."""
        return await self._cluster.metadata(streams)

    async def describe_stream(self, name: str) -> StreamInfo:
        """The stream with every partition's leader, replicas, ISR and bounds as its leader reports them.

        A partition whose leader cannot be reached keeps the bounds the metadata broker gave (zeros when it
        does not lead it); ``UnknownStreamError`` if the stream does not exist.
        """
        info = await self._cluster.stream(name, refresh=True)
        partitions = await asyncio.gather(*(self._with_bounds(name, p) for p in info.partitions))
        return msgspec.structs.replace(info, partitions=tuple(partitions))

    async def _with_bounds(self, stream: str, partition: PartitionInfo) -> PartitionInfo:
        if partition.leader is None:
            return partition
        try:
            connection = await self._cluster.leader_connection(stream, partition.id)
            response = await connection.request(
                ListOffsetsRequest(stream, partition.id), timeout=self._cluster.request_timeout
            )
        except Exception:
            return partition
        bounds = response.header
        assert isinstance(bounds, ListOffsetsResponse)
        return msgspec.structs.replace(
            partition,
            high_watermark=bounds.high_watermark,
            log_end=bounds.log_end,
            log_start=bounds.log_start,
            suspended=bounds.suspended or partition.suspended,
            local_log_start=bounds.local_log_start,
            remote_start=bounds.remote_start,
            remote_end=bounds.remote_end,  # the leader's own finding may not be recorded yet
        )

    # -- cursors: a consumer's position, stored on the leader of its __cursors partition ------------------------

    async def set_cursor(
        self,
        stream: str,
        partition: int,
        cursor_id: str,
        offset: int,
        *,
        timeout_ms: int = 5_000,
        group: GroupContext | None = None,
    ) -> None:
        """Store ``offset`` as cursor ``cursor_id``'s position in ``stream``/``partition`` (-1: nothing consumed);
        returns once it is committed to the ``__cursors`` partition's in-sync replicas. ``InvalidArgumentError``
        for an empty or over-long id or an offset below -1, ``UnknownStreamError`` / ``UnknownPartitionError``
        for a stream or partition that does not exist. ``group``: commit as that consumer group member, fenced by
        its group epoch (``StaleGroupEpochError``, nothing stored, when it no longer owns the partition)."""
        await self._cursor_request(SetCursorRequest(stream, partition, cursor_id, offset, timeout_ms, group))

    async def fetch_cursor(
        self, stream: str, partition: int, cursor_id: str, *, timeout_ms: int = 5_000, group: GroupContext | None = None
    ) -> int:
        """Cursor ``cursor_id``'s stored position in ``stream``/``partition``; -1 when it was never set.
        ``group``: read as that member at its epoch (no older than any commit the broker accepted before it)."""
        response = await self._cursor_request(FetchCursorRequest(stream, partition, cursor_id, timeout_ms, group))
        assert isinstance(response, FetchCursorResponse)
        return response.offset

    async def _cursor_request(self, request: SetCursorRequest | FetchCursorRequest) -> Header:
        """Send a cursor request to the leader of its ``__cursors`` partition, looking the leader up again after
        NOT_LEADER or UNAVAILABLE (a failover, or ``__cursors`` still being created) a few times."""
        key = cursor_key(request.cursor_id, request.stream, request.partition)
        timeout = request.timeout_ms / 1000 + self._cluster.request_timeout
        failure: TidelogError | None = None
        for attempt, delay in enumerate((*CURSOR_RETRY_DELAYS, None)):
            try:
                connection = await self._cursor_leader(key, refresh=attempt > 0)
                response = await connection.request(request, timeout=timeout)
                return response.header
            except (NotLeaderError, UnavailableError) as exc:  # a failover: look the leader up again
                failure = exc
            self._cluster.forget(CURSORS_STREAM)
            if delay is None:
                break
            await asyncio.sleep(delay)
        assert failure is not None
        raise failure

    async def _cursor_leader(self, key: bytes, *, refresh: bool) -> Connection:
        """The leader of the key's ``__cursors`` partition; any broker while the client knows no ``__cursors``
        (that broker checks the request and says why it cannot serve it: disabled, not created yet)."""
        try:
            info = await self._cluster.stream(CURSORS_STREAM, refresh=refresh)
        except UnknownStreamError:
            return await self._cluster.any_connection()
        return await self._cluster.leader_connection(CURSORS_STREAM, cursors_partition(key, len(info.partitions)))

    # -- consumer groups, as kafka-consumer-groups shows them (tidelog group ...) ----------------------------------

    async def list_groups(self) -> list[GroupSummary]:
        """Every consumer group (a group exists while it has members), by id: coordinator, epoch, member count."""
        connection = await self._cluster.any_connection()
        response = await connection.request(ListGroupsRequest(), timeout=self._cluster.request_timeout)
        assert isinstance(response.header, ListGroupsResponse)
        return list(response.header.groups)

    async def describe_group(self, group_id: str) -> DescribeGroupResponse:
        """A group's coordinator, epoch, members and their assignments; ``UnknownGroupError`` when it has no
        members (its committed offsets may remain: :meth:`group_offsets`)."""
        connection = await self._cluster.any_connection()
        response = await connection.request(DescribeGroupRequest(group_id), timeout=self._cluster.request_timeout)
        assert isinstance(response.header, DescribeGroupResponse)
        return response.header

    async def group_offsets(self, group_id: str, *, timeout_ms: int = 5_000) -> dict[tuple[str, int], int]:
        """The group's committed offsets (its cursors: the next offset to read) by ``(stream, partition)``, asking
        the leader of every ``__cursors`` partition; empty when cursors are not set up yet."""
        found: dict[tuple[str, int], int] = {}
        for answer in await self._each_cursors_partition(lambda p: ListCursorsRequest(group_id, p, timeout_ms)):
            assert isinstance(answer, ListCursorsResponse)
            found.update({(c.stream, c.partition): c.offset for c in answer.cursors})
        return dict(sorted(found.items()))

    async def delete_group(self, group_id: str, *, timeout_ms: int = 10_000) -> int:
        """Delete a group's committed offsets (tombstones for its cursors, acks ALL); how many there were.

        ``GroupRefusedError`` while the group has members (nothing is deleted), ``UnknownGroupError`` when it
        has neither members nor committed offsets."""
        answers = await self._each_cursors_partition(lambda p: DeleteGroupRequest(group_id, p, timeout_ms))
        deleted = 0
        for answer in answers:
            assert isinstance(answer, DeleteGroupResponse)
            deleted += answer.deleted
        if not deleted:
            raise UnknownGroupError(f"no such consumer group {group_id}: it has no members and no committed offsets")
        return deleted

    async def offset_at(self, stream: str, partition: int, timestamp_ns: int) -> int:
        """The first committed offset of ``stream``/``partition`` whose timestamp is at or after ``timestamp_ns``
        (the high watermark when there is none)."""
        response = await self._cluster.leader_request(
            stream, partition, ListOffsetsRequest(stream, partition, timestamp_ns)
        )
        assert isinstance(response.header, ListOffsetsResponse)
        return response.header.offset

    async def _each_cursors_partition(self, request: Callable[[int], Header]) -> list[Header]:
        """``request(p)`` sent to the leader of each ``__cursors`` partition ``p``, concurrently; their answers.
        none when ``__cursors`` does not exist (cursors disabled, or not created yet)."""
        try:
            info = await self._cluster.stream(CURSORS_STREAM, refresh=True)
        except UnknownStreamError:
            return []
        responses = await asyncio.gather(
            *(self._cluster.leader_request(CURSORS_STREAM, p.id, request(p.id)) for p in info.partitions)
        )
        return [r.header for r in responses]

    async def close(self) -> None:
        if self._owns_cluster:
            await self._cluster.close()

    async def __aenter__(self) -> Admin:
        await self._cluster.any_connection()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
