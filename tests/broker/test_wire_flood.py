"""Pipelined floods against a real ``tidelog serve``: other clients and the broker's etcd lease keep their turn.

Four connections each pipeline thousands of METADATA requests at once, while a fifth (the probe) asks one
question. The broker admits a bounded number of requests per connection and per turn of its event loop, so the
probe is answered while the floods are still being served, rather than after every request they sent; and the
broker's lease in etcd lives on, so its partitions stay led by it.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import grpc
import pytest

from tests.helpers import BOUND
from tidelog.local.serve_process import start_served_broker
from tidelog.protocol._gen import api_pb2, api_pb2_grpc
from tidelog.protocol.frames import FrameDecoder, Kind
from tidelog.protocol.message_codec import encode_message
from tidelog.protocol.messages import MetadataRequest

from .helpers import bounded, create_stream, partition_metadata

pytestmark = pytest.mark.slow

FLOODS = 4
PIPELINED = 20_000  # per flooding connection, sent at once


def request_bytes(first_cid: int, count: int) -> bytes:
    return b"".join(b"".join(encode_message(cid, MetadataRequest())) for cid in range(first_cid, first_cid + count))


class Flood(threading.Thread):
    """One connection that pipelines every request it has, then reads their replies, counting them."""

    def __init__(self, port: int, sent: threading.Barrier) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND * 3)
        self.sent = sent
        self.replies = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            reader = threading.Thread(target=self._read, daemon=True)
            reader.start()
            self.sock.sendall(request_bytes(1, PIPELINED))
            self.sent.wait(BOUND)
            reader.join(BOUND * 3)
        except BaseException as exc:
            self.failure = exc
        finally:
            self.sock.close()

    def _read(self) -> None:
        decoder = FrameDecoder()
        while self.replies < PIPELINED:
            data = self.sock.recv(1 << 16)
            if not data:
                return
            self.replies += sum(1 for frame in decoder.feed(data) if frame.kind is Kind.RESPONSE)


def probe(port: int) -> None:
    """One METADATA request on a connection of its own, answered or a timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as sock:
        sock.sendall(request_bytes(1, 1))
        decoder = FrameDecoder()
        while True:
            data = sock.recv(1 << 16)
            assert data, "the broker closed the probe's connection"
            frames = decoder.feed(data)
            if frames:
                assert frames[0].kind is Kind.RESPONSE
                return


async def test_a_probe_is_answered_while_four_connections_flood_pipelined_requests(tmp_path: Path) -> None:
    served = await start_served_broker(tmp_path, BROKER_LEASE_TTL_MS="2000")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await create_stream(stub, "kept", partitions=1)
            before = await partition_metadata(stub, "kept")
            assert before.leader

            sent = threading.Barrier(FLOODS + 1)
            floods = [Flood(served.wire_port, sent) for _ in range(FLOODS)]
            for flood in floods:
                flood.start()
            sent.wait(BOUND)  # every flood has its requests on the wire
            probe(served.wire_port)
            answered_before_probe = sum(flood.replies for flood in floods)
            for flood in floods:
                flood.join(BOUND * 3)
                assert flood.failure is None
            assert [flood.replies for flood in floods] == [PIPELINED] * FLOODS  # every flood was answered...
            assert answered_before_probe < FLOODS * PIPELINED  # ...but the probe did not wait for them all

            after = await partition_metadata(stub, "kept")
            assert after.leader == before.leader  # the lease held: the partition was never taken offline
            assert list(after.isr) == list(before.isr)
            metadata = await bounded(stub.FetchMetadata(api_pb2.FetchMetadataRequest()))
            assert [b.id for b in metadata.brokers] == [before.leader]
        log = (tmp_path / "serve.log").read_text(errors="replace")
        assert "broker lease expired" not in log
        assert "is gone" not in log  # the controller's own lease session
    finally:
        await served.stop()
