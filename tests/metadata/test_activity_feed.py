"""The activity feed over a real etcd: a new controller term resumes after the revision the last one recorded
(changes committed while no feed ran are published, those already published are not), and a resume point etcd
has compacted away is skipped with an error instead of stopping the feed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.broker.embedded import EmbeddedEtcd
from tidelog.metadata.activity import ACTIVITY_STREAM, revision_of
from tidelog.metadata.activity_feed import ActivityFeed, published_key
from tidelog.metadata.etcd_client import open_etcd
from tidelog.metadata.fenced_writer import ControllerTerm, FencedWriter
from tidelog.metadata.mirror import MetadataMirror
from tidelog.metadata.records import (
    ControllerRecord,
    Keys,
    StreamRecord,
    decode_counter,
    encode,
    encode_controller,
    encode_controller_epoch,
)
from tidelog.protocol._gen import api_pb2 as pb

KEYS = Keys("/feed")


@pytest_asyncio.fixture
async def client(tmp_path: Path) -> AsyncIterator[Any]:
    async with EmbeddedEtcd(tmp_path / "etcd") as etcd:
        host, port = etcd.endpoints[0].removeprefix("http://").rsplit(":", 1)
        connected = open_etcd([(host, int(port))], timeout=10)
        await connected.connect()
        try:
            yield connected
        finally:
            await connected.close()


async def elect(client: Any, epoch: int) -> FencedWriter:
    """Make ``n`` the controller of ``epoch`` (the two keys every fenced write compares)."""
    await client.put(KEYS.controller_epoch(), encode_controller_epoch(epoch))
    await client.put(KEYS.controller(), encode_controller(ControllerRecord("n", epoch)))
    return FencedWriter(client, KEYS, ControllerTerm("n", epoch))


async def create(client: Any, name: str) -> int:
    """Write a stream record; its revision."""
    response = await client.put(KEYS.stream(name), encode(StreamRecord(name, name, "", 1, 1, 0)))
    return int(response.header.revision)


class Collected:
    """A ``publish`` that keeps what it is given."""

    def __init__(self) -> None:
        self.events: list[pb.ActivityStreamEvent] = []
        self.changed = asyncio.Event()

    async def __call__(self, events: Sequence[pb.ActivityStreamEvent]) -> None:
        self.events.extend(events)
        self.changed.set()

    def created(self) -> list[str]:
        return [e.createStreamOp.stream for e in self.events if e.op == pb.CREATE_STREAM]

    async def until_created(self, name: str) -> None:
        async with asyncio.timeout(BOUND):
            while name not in self.created():
                self.changed.clear()
                await self.changed.wait()


async def recorded(client: Any) -> int:
    got = await client.get(published_key(KEYS))
    return decode_counter(bytes(got.value)) if got is not None else 0


async def run_term(client: Any, mirror: MetadataMirror, epoch: int, until: str) -> Collected:
    """A controller term's feed, run until ``until``'s creation is published and recorded."""
    collected = Collected()
    feed = ActivityFeed(client, KEYS, mirror, collected)
    task = asyncio.ensure_future(feed.run(await elect(client, epoch)))
    try:
        await collected.until_created(until)
        async with asyncio.timeout(BOUND):
            while True:  # the record follows the publication, with nothing to wait on but etcd
                if await recorded(client) >= revision_of(collected.events[-1].id):
                    break
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return collected


async def test_a_new_term_resumes_after_the_recorded_revision(client: Any) -> None:
    mirror = MetadataMirror(client, KEYS)
    await mirror.start()
    try:
        await create(client, ACTIVITY_STREAM)
        await create(client, "s1")
        first = await run_term(client, mirror, 1, "s1")
        assert first.created() == [ACTIVITY_STREAM, "s1"]

        revisions = [await create(client, "s2"), await create(client, "s3")]  # while no controller publishes
        second = await run_term(client, mirror, 2, "s3")
        assert second.created() == ["s2", "s3"]
        assert [revision_of(e.id) for e in second.events] == revisions
    finally:
        await mirror.stop()


async def test_a_compacted_resume_point_is_skipped_with_an_error(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    mirror = MetadataMirror(client, KEYS)
    await mirror.start()
    try:
        await create(client, ACTIVITY_STREAM)
        await run_term(client, mirror, 1, ACTIVITY_STREAM)
        await create(client, "lost")
        compacted = await create(client, "lost-too")
        await client.compact(compacted)
        with caplog.at_level(logging.ERROR, logger="tidelog.metadata.activity_feed"):
            await create(client, "after")
            later = await run_term(client, mirror, 2, "after")
        assert later.created() == ["lost-too", "after"]  # from the oldest revision etcd still holds
        assert any("compacted" in r.getMessage() for r in caplog.records)
    finally:
        await mirror.stop()
