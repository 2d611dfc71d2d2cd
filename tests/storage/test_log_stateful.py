"""The log against an in-memory model (a list of stored batches), under random operation sequences.

Rules: append (one or several batches), follower append (possibly skipping offsets), read, read_range,
truncate, roll, close-and-reopen, crash-and-reopen, delete a prefix of segments, and compaction. After every
step the log's offsets match the model's; full reads are compared byte for byte.

Compaction is checked by its guarantees rather than re-implemented: afterwards every record is one the model
had (same offset, key, value, timestamp), the newest record of every key and every keyless record is still
there, nothing at or above the compaction bound changed, and the model then adopts the compacted batches.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidelog.protocol.records import NewRecord, Record, build_batch, iter_batches, records_of
from tidelog.storage.config import FlushPolicy, LogConfig
from tidelog.storage.log import Log

from .logutil import BASE_TS, crash, read_everything, stored

CONFIG = LogConfig(segment_max_bytes=1500, index_interval_bytes=128, flush_policy=FlushPolicy.NEVER)
KEYS = [None, b"a", b"b", b"c"]

batch_shape = st.tuples(st.integers(1, 4), st.integers(0, 150), st.sampled_from(KEYS))


def _split(data: bytes) -> list[bytes]:
    return [data[p : p + h.size] for p, h in iter_batches(data)]


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="tidelog-stateful-"))
        self.loop = asyncio.new_event_loop()
        self.log = Log.open(self.directory, CONFIG)
        self.batches: list[bytes] = []  # as stored, offset order
        self.start = 0
        self.end = 0
        self.stamp = BASE_TS

    # -------------------------------------------------------------------------------------- helpers

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    def _new_batch(self, count: int, size: int, key: bytes | None) -> bytes:
        self.stamp += 1000
        records = [NewRecord(bytes([65 + i % 26]) * size, key=key) for i in range(count)]
        return build_batch(records, timestamp=self.stamp)

    def _headers(self) -> list[tuple[int, int]]:
        return [(h.base_offset, h.last_offset) for b in self.batches for _, h in iter_batches(b)]

    def _expected_read(self, offset: int, max_bytes: int, max_offset: int | None) -> list[bytes]:
        limit = self.end if max_offset is None else min(max_offset, self.end)
        out: list[bytes] = []
        total = 0
        for batch, (_, last) in zip(self.batches, self._headers(), strict=True):
            if last < offset:
                continue
            if last >= limit or (out and total + len(batch) > max_bytes):
                break
            out.append(batch)
            total += len(batch)
        return out

    # -------------------------------------------------------------------------------------- rules

    @rule(shapes=st.lists(batch_shape, min_size=1, max_size=3), epoch=st.integers(0, 9))
    def append(self, shapes: list[tuple[int, int, bytes | None]], epoch: int) -> None:
        raw = [self._new_batch(*shape) for shape in shapes]
        result = self.run(self.log.append(b"".join(raw), epoch))
        assert result.base_offset == self.end
        for data, (count, _, _) in zip(raw, shapes, strict=True):
            self.batches.append(stored(data, self.end, epoch))
            self.end += count
        assert result.last_offset == self.end - 1

    @rule(shape=batch_shape, gap=st.integers(0, 4))
    def follower_append(self, shape: tuple[int, int, bytes | None], gap: int) -> None:
        data = stored(self._new_batch(*shape), self.end + gap, 3)
        self.run(self.log.append_as_follower(data))
        self.batches.append(data)
        self.end += gap + shape[0]

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        max_bytes = data.draw(st.integers(0, 3000))
        max_offset = data.draw(st.none() | st.integers(self.start, self.end + 2))
        got = _split(self.log.read(offset, max_bytes, max_offset))
        expected = self._expected_read(offset, max_bytes, max_offset)
        assert got == expected[: len(got)]  # a read stops at a segment's end, so it may return fewer
        assert bool(got) == bool(expected)

    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        max_bytes = data.draw(st.integers(0, 3000))
        file_range = self.log.read_range(offset, max_bytes)
        plain = self.log.read(offset, max_bytes)
        if file_range is None:
            assert plain == b""
            return
        with file_range:
            import os

            assert os.pread(file_range.fd, file_range.length, file_range.position) == plain

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end + 2))
        self.run(self.log.truncate_to(offset))
        if offset >= self.end:
            assert self.log.end_offset == self.end
            return
        keep = [b for b, (_, last) in zip(self.batches, self._headers(), strict=True) if last < offset]
        self.batches = keep
        floor = self._headers()[-1][1] + 1 if keep else self.start
        # the end is one past the last batch kept, or the base of the (now empty) segment it ends in
        assert floor <= self.log.end_offset <= max(floor, offset)
        self.end = self.log.end_offset

    @rule()
    def roll(self) -> None:
        self.run(self.log.roll())

    @rule()
    def close_and_reopen(self) -> None:
        self.run(self.log.close())
        self.log = Log.open(self.directory, CONFIG)
        assert self.log.recovery.clean_shutdown and not self.log.recovery.scanned

    @rule()
    def crash_and_reopen(self) -> None:
        self.run(crash(self.log))  # no close: no indexes written out, no clean marker
        self.log = Log.open(self.directory, CONFIG)
        assert not self.log.recovery.clean_shutdown and self.log.recovery.truncated_bytes == 0

    @precondition(lambda self: len(self.log.segments) > 1)
    @rule(data=st.data())
    def delete_prefix(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        self.run(self.log.delete_segments_before(offset))
        self.start = self.log.start_offset
        self.batches = [b for b, (base, _) in zip(self.batches, self._headers(), strict=True) if base >= self.start]

    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        upto = data.draw(st.integers(self.start, self.end))
        before = list(records_of(b"".join(self.batches)))
        self.run(self.log.compact(upto, now_ns=self.stamp))
        content = read_everything(self.log)
        after = list(records_of(content))
        by_offset = {r.offset: r for r in before}
        assert all(by_offset.get(r.offset) == r for r in after)
        newest: dict[bytes, Record] = {}
        for r in before:
            if r.key is not None:
                newest[r.key] = r
        kept = {r.offset for r in after}
        assert all(r.offset in kept for r in newest.values())
        assert all(r.offset in kept for r in before if r.key is None or r.offset >= upto)
        self.batches = _split(content)

    # -------------------------------------------------------------------------------------- checks

    @invariant()
    def offsets_match(self) -> None:
        assert (self.log.start_offset, self.log.end_offset) == (self.start, self.end)

    @invariant()
    def content_matches(self) -> None:
        assert read_everything(self.log) == b"".join(self.batches)

    def teardown(self) -> None:
        try:
            if not self.log.closed:
                self.run(self.log.close())
        finally:
            self.loop.close()
            shutil.rmtree(self.directory, ignore_errors=True)


LogMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLogMachine = LogMachine.TestCase
