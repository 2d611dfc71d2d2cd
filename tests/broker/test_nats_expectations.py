"""JetStream's publish expectations on NATS ingest (issue 18, item 8), with a real nats-server and broker.

``Nats-Expected-Stream``, ``Nats-Expected-Last-Sequence`` (sequence = offset + 1) and ``Nats-Expected-Last-Msg-Id``:
each accepted case is stored and answered with JetStream's publish ack, each refused one answered with
JetStream's error and stores nothing (a plain ``end`` published after it is the next record).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers import BOUND

from .helpers import Stub, create_stream, read_until_stop, receive, values

pytestmark = pytest.mark.asyncio(loop_scope="module")

SEQ = "Nats-Expected-Last-Sequence"
STREAM = "Nats-Expected-Stream"
LAST_ID = "Nats-Expected-Last-Msg-Id"
ID = "Nats-Msg-Id"


async def request(nc: Any, subject: str, payload: bytes, **headers: str) -> dict[str, Any]:
    reply = await nc.request(subject, payload, timeout=BOUND, headers=headers)
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


def refusal(err_code: int, description: str) -> dict[str, Any]:
    return {"error": {"code": 400, "err_code": err_code, "description": description}}


async def stored(stub: Stub, nc: Any, stream: str) -> list[bytes]:
    """Everything the stream holds, once a plain ``end`` published last is stored."""
    await nc.publish(stream, b"end")
    await receive(stub, stream, 1)
    got = values(await read_until_stop(stub, stream))
    while got[-1] != b"end":  # the end may still be on its way to the high watermark (bounded by receive above)
        got = values(await read_until_stop(stub, stream))
    return got


async def test_expected_last_sequence(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    assert await request(nc, stream_name, b"first", **{SEQ: "0"}) == {"stream": stream_name, "seq": 1}
    assert await request(nc, stream_name, b"stale", **{SEQ: "0"}) == refusal(10071, "wrong last sequence: 1")
    assert await request(nc, stream_name, b"ahead", **{SEQ: "5"}) == refusal(10071, "wrong last sequence: 1")
    assert await request(nc, stream_name, b"second", **{SEQ: "1"}) == {"stream": stream_name, "seq": 2}
    bad = await request(nc, stream_name, b"bad", **{SEQ: "one"})
    assert bad["error"]["err_code"] == 10071 and "not a sequence" in bad["error"]["description"]
    assert await stored(stub, nc, stream_name) == [b"first", b"second", b"end"]


async def test_expected_stream(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    assert await request(nc, stream_name, b"mine", **{STREAM: stream_name}) == {"stream": stream_name, "seq": 1}
    answer = await request(nc, stream_name, b"theirs", **{STREAM: f"{stream_name}-other"})
    assert answer == refusal(10060, "expected stream does not match")
    assert await stored(stub, nc, stream_name) == [b"mine", b"end"]


async def test_expected_last_msg_id(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await nc.publish(stream_name, b"a", headers={ID: "a"})
    assert await request(nc, stream_name, b"b", **{LAST_ID: "a", ID: "b"}) == {"stream": stream_name, "seq": 2}
    assert await request(nc, stream_name, b"again", **{LAST_ID: "a"}) == refusal(10070, "wrong last msg ID: b")
    assert await stored(stub, nc, stream_name) == [b"a", b"b", b"end"]


async def test_expected_last_msg_id_of_a_record_without_one(stub: Stub, nc: Any, stream_name: str) -> None:
    await create_stream(stub, stream_name)
    await nc.publish(stream_name, b"plain")
    assert await request(nc, stream_name, b"x", **{LAST_ID: "a"}) == refusal(10070, "wrong last msg ID: ")
    assert await stored(stub, nc, stream_name) == [b"plain", b"end"]


async def test_expectations_in_a_burst_keep_their_place(stub: Stub, nc: Any, stream_name: str) -> None:
    """Published back to back (most likely one socket read for the ingest): the checked message is appended on
    its own, after what came before it, and what comes after follows it; a refused one leaves its neighbours."""
    await create_stream(stub, stream_name)
    replies = nc.new_inbox()
    answers: list[dict[str, Any]] = []
    sub = await nc.subscribe(replies, max_msgs=2)
    await nc.publish(stream_name, b"x")
    await nc.publish(stream_name, b"checked", reply=replies, headers={SEQ: "1"})
    await nc.publish(stream_name, b"refused", reply=replies, headers={SEQ: "1"})
    await nc.publish(stream_name, b"y")
    for _ in range(2):
        answers.append(json.loads((await sub.next_msg(timeout=BOUND)).data))
    assert answers == [{"stream": stream_name, "seq": 2}, refusal(10071, "wrong last sequence: 2")]
    assert await stored(stub, nc, stream_name) == [b"x", b"checked", b"y", b"end"]
