"""Large streams against a real etcd: created in several transactions, seen whole or not at all, and a creation
that fails midway leaves nothing behind (undone at once, or by the next controller).

etcd refuses a transaction of more than 128 operations by default; a stream may have 10,000 partitions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from tests.helpers import LONG_BOUND
from tidelog.metadata.records import StreamConfig, StreamRecord
from tidelog.metadata.snapshot import MetadataSnapshot
from tidelog.metadata.store import CreateOutcome, MetadataStore
from tidelog.metadata.stream_creation import differences

from . import helpers as harness
from .helpers import Cluster, part

etcd = harness.etcd  # the fixtures of the same harness: one etcd for this module, a fresh prefix per test
cluster = harness.cluster

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


def stream_of(name: str, count: int, broker: str = "a") -> tuple[StreamRecord, list[Any]]:
    record = StreamRecord(name, name, "", count, 1, 0)
    return record, [part(name, [broker], broker, [broker], pid=i) for i in range(count)]


async def keys_under(cluster: Cluster, prefix: bytes) -> list[bytes]:
    return [kv.key for kv in await cluster.admin.get_prefix(prefix)]


async def leftovers(cluster: Cluster, name: str) -> list[bytes]:
    """Every key a creation of ``name`` may have written: its stream, partitions and creation marker."""
    keys = cluster.keys
    found = await keys_under(cluster, keys.partitions_of(name))
    for key in (keys.stream(name), keys.creation(name)):
        if await cluster.admin.get(key) is not None:
            found.append(key)
    return found


async def deleted(cluster: Cluster, key: bytes, after_revision: int) -> None:
    """Return once etcd deletes ``key`` (at a revision after ``after_revision``)."""
    watch = await cluster.admin.watch_prefix(key, start_revision=after_revision + 1)
    try:
        async with asyncio.timeout(LONG_BOUND):
            async for event in watch:
                if event.kind == "DELETE" and event.kv.key == key:
                    return
    finally:
        await watch.cancel()


def failing_after(client: Any, calls: int) -> Callable[[bool], None]:
    """Make ``client``'s transactions fail from the ``calls``-th on (counted while armed); returns ``arm``."""
    real = client.transaction
    state = {"armed": False, "count": 0}

    async def transaction(*args: Any, **kwargs: Any) -> Any:
        if state["armed"]:
            state["count"] += 1
            if state["count"] > calls:
                raise ConnectionError("injected: etcd unreachable")
        return await real(*args, **kwargs)

    client.transaction = transaction

    def arm(on: bool) -> None:
        state["armed"] = on

    return arm


async def test_a_stream_of_a_thousand_partitions_is_created_and_deleted(cluster: Cluster) -> None:
    await cluster.up("a")
    ctl = await (await cluster.node("x")).active()
    stream, parts = stream_of("big", 1000)
    assert await ctl.create_stream(stream, parts) is CreateOutcome.CREATED
    snap = await cluster.wait(lambda s: "big" in s.streams)
    assert snap.partitions_of("big") == parts  # every partition, with its leader
    assert await cluster.admin.get(cluster.keys.creation("big")) is None
    assert await ctl.create_stream(stream, parts) is CreateOutcome.SAME_EXISTS

    assert await ctl.delete_stream("big")
    await cluster.wait(lambda s: "big" not in s.streams and not s.partitions_of("big"))
    assert await leftovers(cluster, "big") == []


async def test_the_plain_store_creates_large_streams_too(cluster: Cluster) -> None:
    store = MetadataStore(cluster.admin, cluster.keys)
    stream, parts = stream_of("plain", 300)
    assert await store.create_stream(stream, parts) is CreateOutcome.CREATED
    snap = await cluster.wait(lambda s: "plain" in s.streams)
    assert len(snap.partitions_of("plain")) == 300


async def test_a_watcher_sees_the_stream_only_with_all_its_partitions(cluster: Cluster) -> None:
    await cluster.up("a")
    ctl = await (await cluster.node("x", create_chunk=30)).active()
    assert cluster.observer is not None
    seen: list[int] = []

    async def watch(_old: MetadataSnapshot, new: MetadataSnapshot) -> None:
        if "whole" in new.streams:
            seen.append(len(new.partitions_of("whole")))
        seen.extend(-1 for key in new.partitions if key[0] == "whole" and "whole" not in new.streams)

    cluster.observer.add_listener(watch)
    stream, parts = stream_of("whole", 100)
    assert await ctl.create_stream(stream, parts) is CreateOutcome.CREATED
    await cluster.wait(lambda s: "whole" in s.streams)
    assert seen and set(seen) == {100}  # never the stream without all its partitions, nor a partition alone


async def test_a_creation_that_fails_midway_leaves_nothing(cluster: Cluster) -> None:
    await cluster.up("a")
    node = await cluster.node("x", create_chunk=30)
    ctl = await node.active()
    arm = failing_after(node.client, 3)  # begin and two chunks land, the third chunk fails
    stream, parts = stream_of("broken", 200)
    arm(True)
    with pytest.raises(ConnectionError):
        await ctl.create_stream(stream, parts)
    arm(False)
    # The undo failed too (etcd still "unreachable"): the creation's partitions and marker are left...
    assert len(await leftovers(cluster, "broken")) == 60 + 1
    revision = (await cluster.admin.get_prefix(cluster.keys.creation("broken"))).header.revision
    assert cluster.observer is not None
    assert "broken" not in cluster.observer.snapshot.streams
    assert not cluster.observer.snapshot.partitions_of("broken")
    assert not [k for k in cluster.observer.snapshot.partitions if k[0] == "broken"]
    # ...until the next controller, elected after this one, removes them.
    await node.election.stop()
    await node.controller.stop()
    await (await cluster.node("y")).active()
    await deleted(cluster, cluster.keys.creation("broken"), revision)
    assert await leftovers(cluster, "broken") == []
    assert "broken" not in cluster.observer.snapshot.streams


async def test_a_failed_creation_undoes_itself_and_the_name_can_be_created_again(cluster: Cluster) -> None:
    await cluster.up("a")
    node = await cluster.node("x", create_chunk=30)
    ctl = await node.active()
    real = node.client.transaction
    calls = 0

    async def fail_third_chunk(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 4:  # begin, two chunks, then the third chunk fails once; the undo gets through
            raise ConnectionError("injected: one lost request")
        return await real(*args, **kwargs)

    node.client.transaction = fail_third_chunk
    stream, parts = stream_of("retried", 200)
    with pytest.raises(ConnectionError):
        await ctl.create_stream(stream, parts)
    assert await leftovers(cluster, "retried") == []
    assert await ctl.create_stream(stream, parts) is CreateOutcome.CREATED
    snap = await cluster.wait(lambda s: "retried" in s.streams)
    assert len(snap.partitions_of("retried")) == 200


async def test_creating_an_existing_stream_with_other_settings_is_a_conflict(cluster: Cluster) -> None:
    """Idempotent creation means the same stream: another partition count, replication factor or setting is a
    conflict, and nothing is written."""
    store = MetadataStore(cluster.admin, cluster.keys)
    stream, parts = stream_of("same", 3)
    assert await store.create_stream(stream, parts) is CreateOutcome.CREATED
    assert await store.create_stream(stream, parts) is CreateOutcome.SAME_EXISTS
    more, more_parts = stream_of("same", 5)
    assert await store.create_stream(more, more_parts) is CreateOutcome.CONFLICT
    tuned = msgspec.structs.replace(stream, config=StreamConfig(retention_max_bytes=1000))
    assert await store.create_stream(tuned, parts) is CreateOutcome.CONFLICT
    snap = await cluster.wait(lambda s: "same" in s.streams)
    assert snap.streams["same"].partitions == 3 and len(snap.partitions_of("same")) == 3


async def test_differences_name_each_setting_that_differs() -> None:
    stream = StreamRecord("s", "subj", "", 3, 1, 0)
    assert differences(stream, msgspec.structs.replace(stream, created_ns=99)) == []
    other = msgspec.structs.replace(
        stream, partitions=5, replication_factor=3, config=StreamConfig(retention_max_bytes=1000)
    )
    assert differences(stream, other) == [
        "partitions 3 (asked for 5)",
        "replication_factor 1 (asked for 3)",
        "retention.max.bytes the broker default (asked for 1000)",
    ]
