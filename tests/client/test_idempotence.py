"""The idempotent producer against an in-memory broker (:mod:`tidelog.testing.fake_broker`): stamps, retries, fencing.

Deterministic: requests are handled when sent and answered a loop turn later, faults are scripted per request,
the retry backoff is 0, and the broker deduplicates with the real ``ProducerStateTable``.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import BOUND
from tidelog.client import Acks, Codec, ConnectionClosedError, Producer, RecordMetadata
from tidelog.client.idempotence import MAX_IN_FLIGHT, ProducerStamp, add_sequence, stamp_batch
from tidelog.protocol.errors import (
    ErrorCode,
    MessageTooLargeError,
    NotEnoughReplicasError,
    ProducerFencedError,
    UnknownProducerError,
)
from tidelog.protocol.records import BatchBuilder, check_batch, records_of
from tidelog.protocol.records.producers import MAX_SEQUENCE
from tidelog.testing.fake_broker import FakeBroker, FakeCluster, Fault

S = "orders"


def producer(broker: FakeBroker, **options: object) -> Producer:
    settings: dict[str, object] = {"max_records": 2, "retry_backoff_ms": 0, "compression": Codec.NONE}
    settings.update(options)
    return Producer(cluster=FakeCluster(broker), **settings)  # type: ignore[arg-type]


async def send_all(
    p: Producer, values: list[bytes], partition: int = 0, stream: str = S
) -> list[asyncio.Future[RecordMetadata]]:
    futures = [await p.send(stream, v, partition=partition) for v in values]
    await p.flush()
    return futures


async def offsets(futures: list[asyncio.Future[RecordMetadata]]) -> list[int]:
    async with asyncio.timeout(BOUND):
        return [(await f).offset for f in futures]


def values(n: int, prefix: bytes = b"v") -> list[bytes]:
    return [prefix + b"%d" % i for i in range(n)]


def test_stamp_batch_rewrites_producer_fields_and_crc() -> None:
    builder = BatchBuilder(1)
    builder.append(b"x")
    builder.append(b"y")
    built = builder.build(producer_id=7, producer_epoch=1, base_sequence=3)
    restamped = stamp_batch(built, ProducerStamp(9, 2), MAX_SEQUENCE)
    header = check_batch(restamped)  # the CRC covers the new fields
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 2, MAX_SEQUENCE)
    assert [r.value for r in records_of(restamped)] == [b"x", b"y"]
    assert restamped[61:] == built[61:]
    assert add_sequence(MAX_SEQUENCE, 2) == 1 and add_sequence(1, -2) == MAX_SEQUENCE


async def test_batches_carry_the_stamp_and_consecutive_sequences_per_partition() -> None:
    broker = FakeBroker(partitions=2)
    async with producer(broker) as p:
        assert broker.inits == [""]
        stamp = p.stamp
        assert stamp is not None and stamp.epoch == 0
        first = await send_all(p, values(5), partition=0)
        second = await send_all(p, values(3), partition=1)
        assert await offsets(first) == [0, 1, 2, 3, 4]
        assert await offsets(second) == [0, 1, 2]
    for partition, expected in ((0, [0, 2, 4]), (1, [0, 2])):
        headers = [r.header for r in broker.received(S, partition)]
        assert [h.base_sequence for h in headers] == expected
        assert {(h.producer_id, h.producer_epoch) for h in headers} == {tuple(stamp)}


async def test_not_idempotent_stamps_nothing_and_fails_a_lost_write() -> None:
    broker = FakeBroker()
    broker.faults[0] = Fault.DROP
    async with producer(broker, idempotent=False) as p:
        assert p.stamp is None and not p.idempotent
        futures = await send_all(p, values(2))
        with pytest.raises(ConnectionClosedError):
            await futures[0]
    assert broker.inits == []
    assert broker.requests[0].header.producer_id == -1 and broker.requests[0].header.base_sequence == -1


async def test_acks_none_is_never_idempotent() -> None:
    assert not producer(FakeBroker(), acks=Acks.NONE).idempotent
    with pytest.raises(ValueError):
        producer(FakeBroker(), acks=Acks.NONE, producer_name="x")
    with pytest.raises(ValueError):
        producer(FakeBroker(), idempotent=False, producer_name="x")


@pytest.mark.parametrize("fault", [Fault.DROP, Fault.TIMEOUT])
async def test_a_write_whose_answer_is_lost_is_stored_once(fault: Fault) -> None:
    """The first batch is written but its answer lost (with the whole pipeline, for DROP): everything is
    resent, the same bytes, and the broker answers the duplicates with their original offsets."""
    broker = FakeBroker()
    broker.faults[0] = fault
    async with producer(broker) as p:
        futures = await send_all(p, values(10))
        assert await offsets(futures) == list(range(10))
    assert broker.partition(S).values() == values(10)
    by_sequence: dict[int, set[bytes]] = {}
    for received in broker.received(S):
        by_sequence.setdefault(received.header.base_sequence, set()).add(received.payload)
    assert all(len(payloads) == 1 for payloads in by_sequence.values())  # a retry is the same bytes
    assert len(broker.requests) > 5  # something was resent


async def test_a_refusal_mid_pipeline_resends_everything_after_it_in_order() -> None:
    """NOT_ENOUGH_REPLICAS for the second batch while three more are in flight: they are refused for the gap
    (OUT_OF_ORDER_SEQUENCE), and all four go again in order, without re-initializing the producer."""
    broker = FakeBroker()
    broker.faults[1] = ErrorCode.NOT_ENOUGH_REPLICAS
    async with producer(broker, retries=1) as p:  # the refusals for the gap cost no attempt
        futures = await send_all(p, values(10))
        assert await offsets(futures) == list(range(10))
    assert broker.partition(S).values() == values(10)
    assert broker.inits == [""]
    sent = [r.header.base_sequence for r in broker.requests]
    assert sent == [0, 2, 4, 6, 8, 2, 4, 6, 8]


async def test_not_leader_refreshes_metadata_and_resends() -> None:
    broker = FakeBroker()
    broker.faults[0] = ErrorCode.NOT_LEADER
    async with producer(broker) as p:
        assert await offsets(await send_all(p, values(4))) == [0, 1, 2, 3]
        assert S in p.cluster.forgotten  # type: ignore[attr-defined]
    assert broker.partition(S).values() == values(4)


async def test_retries_are_bounded() -> None:
    broker = FakeBroker()
    broker.faults.update({i: ErrorCode.NOT_ENOUGH_REPLICAS for i in range(3)})
    async with producer(broker, retries=2) as p:
        (future,) = await send_all(p, [b"only"])
        with pytest.raises(NotEnoughReplicasError):
            await future
        # the given-up batch was never stored: the next one takes its sequence, no re-initialization
        assert await offsets(await send_all(p, [b"next"])) == [0]
    assert [r.header.base_sequence for r in broker.requests] == [0, 0, 0, 0]
    assert broker.inits == [""]


async def test_a_batch_given_up_after_a_lost_answer_says_it_may_be_written() -> None:
    """A refusal on the last retry must not claim that nothing was stored when an earlier attempt may have been."""
    broker = FakeBroker()
    broker.faults.update({0: Fault.DROP_UNWRITTEN, 1: ErrorCode.NOT_ENOUGH_REPLICAS, 2: ErrorCode.NOT_ENOUGH_REPLICAS})
    async with producer(broker, retries=2) as p:
        (future,) = await send_all(p, [b"only"])
        with pytest.raises(ConnectionClosedError, match="may be written"):
            await future


async def test_in_flight_is_capped_at_the_broker_window() -> None:
    broker = FakeBroker()
    async with producer(broker, max_in_flight=50, max_records=1) as p:
        futures = [await p.send(S, v, partition=0) for v in values(20)]
        assert await offsets(futures) == list(range(20))
    assert broker.most_in_flight == MAX_IN_FLIGHT


async def test_a_batch_refused_for_good_leaves_no_gap() -> None:
    """MESSAGE_TOO_LARGE for the second batch: it fails alone; the batches behind it take over its sequences."""
    broker = FakeBroker()
    broker.faults[1] = ErrorCode.MESSAGE_TOO_LARGE
    async with producer(broker) as p:
        futures = await send_all(p, values(8))
        async with asyncio.timeout(BOUND):
            results = await asyncio.gather(*futures, return_exceptions=True)
    assert [type(r) for r in results[2:4]] == [MessageTooLargeError] * 2
    kept = values(8)[:2] + values(8)[4:]
    assert [r.offset for r in results if isinstance(r, RecordMetadata)] == list(range(6))
    assert broker.partition(S).values() == kept
    assert broker.inits == [""]


async def test_a_forgotten_anonymous_producer_reinitializes_and_resends() -> None:
    broker = FakeBroker()
    async with producer(broker) as p:
        assert await offsets(await send_all(p, values(4))) == [0, 1, 2, 3]
        before = p.stamp
        broker.partitions[(S, 0)].table = type(broker.partition(S).table)()  # the broker forgot the producer
        assert await offsets(await send_all(p, values(4, b"w"))) == [4, 5, 6, 7]
        assert p.stamp != before
    assert broker.inits == ["", ""]
    assert broker.partition(S).values() == values(4) + values(4, b"w")


async def test_a_batch_in_doubt_is_not_resent_under_a_new_identity() -> None:
    """Partition 1 forgot the producer, so it re-initializes, while partition 0's batch was written and its answer
    lost. That batch must be resolved under the stamp it was written with (the broker still knows it there and
    answers the retry as a duplicate), not resent under the new one, which would store it twice."""
    broker = FakeBroker(partitions=2)
    async with producer(broker) as p:
        await offsets(await send_all(p, values(2), partition=0))
        await offsets(await send_all(p, values(2), partition=1))
        before = p.stamp
        broker.partitions[(S, 1)].table = type(broker.partition(S, 1).table)()
        broker.faults[3] = Fault.DROP  # the next batch for partition 0 is written, its answer lost
        one = [await p.send(S, v, partition=1) for v in values(2, b"w")]
        zero = [await p.send(S, v, partition=0) for v in values(2, b"x")]
        await p.flush()
        assert await offsets(zero) == [2, 3]
        assert await offsets(one) == [2, 3]
        assert p.stamp != before
    assert broker.partition(S, 0).values() == values(2) + values(2, b"x")
    assert [r.partition for r in broker.requests[2:4]] == [1, 0]  # the refusal came first, then the lost answer


async def test_a_named_producer_is_fenced_by_its_next_instance() -> None:
    broker = FakeBroker()
    old = producer(broker, producer_name="billing", linger_ms=60_000)
    await old.start()
    assert await offsets(await send_all(old, [b"a"])) == [0]
    pending = await old.send(S, b"queued", partition=0)  # lingers until flushed
    async with producer(broker, producer_name="billing") as new:
        new_stamp, old_stamp = new.stamp, old.stamp
        assert new_stamp is not None and old_stamp is not None
        assert new_stamp.producer_id == old_stamp.producer_id and new_stamp.epoch == old_stamp.epoch + 1
        assert await offsets(await send_all(new, [b"b"])) == [1]
    await old.flush()
    with pytest.raises(ProducerFencedError):
        await pending
    with pytest.raises(ProducerFencedError):
        await old.send(S, b"late", partition=0)
    await old.close()
    assert broker.partition(S).values() == [b"a", b"b"]


async def test_fencing_fails_every_pending_record_of_every_partition() -> None:
    broker = FakeBroker(partitions=2)
    old = producer(broker, producer_name="n", linger_ms=60_000)
    await old.start()
    await send_all(old, [b"a"], partition=0)
    async with producer(broker, producer_name="n") as new:
        await send_all(new, [b"b"], partition=0)
    lingering = await old.send(S, b"lingers", partition=1)  # an open batch, for a partition not fenced yet
    with pytest.raises(ProducerFencedError):
        await old.send_and_wait(S, b"fenced", partition=0)
    assert lingering.done()
    with pytest.raises(ProducerFencedError):
        await lingering
    await old.close()
    assert broker.received(S, 1) == []


async def test_a_named_producer_fails_on_a_sequence_disagreement() -> None:
    """Re-initializing would take the name's next epoch and fence a newer instance: a named producer stops."""
    broker = FakeBroker()
    async with producer(broker, producer_name="n") as p:
        await send_all(p, values(2))
        broker.partitions[(S, 0)].table = type(broker.partition(S).table)()  # the broker forgot the producer
        (future,) = await send_all(p, [b"x"])
        with pytest.raises(UnknownProducerError):
            await future
        with pytest.raises(UnknownProducerError):
            await p.send(S, b"y", partition=0)
    assert broker.inits == ["n"]
