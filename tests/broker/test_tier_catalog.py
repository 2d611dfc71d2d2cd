"""The tier catalog keeps each partition's newest remote segment list: a list the watch delivers after this broker
already learned a newer one (its own write) is not taken, because local retention may already have deleted what
only the newer list holds, and a reader would then find those offsets nowhere."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from tidelog.broker.tier_catalog import TierCatalog
from tidelog.metadata.records import Keys
from tidelog.metadata.remote_segments import RemoteSegmentList, remote_key
from tidelog.storage.remote_segment import RemoteSegment
from tidelog.storage.tiered_store import TieredStore

CREATED = 1_000
KEYS = Keys("/t")


def segment(base: int, end: int) -> RemoteSegment:
    return RemoteSegment(f"p/{base:020d}-{end:020d}-x", base, end, 10, "x" * 64, ((0, base),), -1)


def catalog() -> TierCatalog:
    return TierCatalog(None, KEYS, TieredStore(None, "", "test"), lambda _stream: CREATED)


def put_event(segments: RemoteSegmentList) -> SimpleNamespace:
    kv = SimpleNamespace(key=remote_key(KEYS, "s", 0), value=msgspec.msgpack.encode(segments))
    return SimpleNamespace(kind="PUT", kv=kv)


OLDER = RemoteSegmentList((segment(0, 145),), CREATED, 145)
NEWER = RemoteSegmentList((segment(0, 145), segment(145, 174)), CREATED, 174)
RETAINED = RemoteSegmentList((segment(145, 174),), CREATED, 174)


@pytest.mark.asyncio
async def test_a_late_watch_event_does_not_replace_a_newer_list() -> None:
    known = catalog()
    known.learn("s", 0, NEWER)
    await known._apply(put_event(OLDER))
    assert known.remote_end("s", 0) == 174


@pytest.mark.asyncio
async def test_uploads_retention_and_a_new_stream_move_the_list_forward() -> None:
    known = catalog()
    await known._apply(put_event(OLDER))
    await known._apply(put_event(NEWER))
    assert known.remote_end("s", 0) == 174
    known.learn("s", 0, RETAINED)  # retention: the start moves, the end stays
    assert known.remote_start("s", 0) == 145
    await known._apply(put_event(NEWER))  # the watch's copy of the list before retention
    assert known.remote_start("s", 0) == 145
    recreated = RemoteSegmentList((), CREATED + 1, 0)
    known.learn("s", 0, recreated)  # a stream of the same name created later: its (empty) list wins
    assert known._lists[("s", 0)] == recreated
