"""The encoder's side of API publishes' copies and JetStream expectations, without a server."""

from __future__ import annotations

import pytest

from tidelog.broker.ingest.copies import COPY_HEADER, copy_command, copy_tag
from tidelog.broker.ingest.encoder import Decoded, IngestEncoder
from tidelog.broker.ingest.expectations import Check, Unmet, check_of
from tidelog.broker.ingest.natsproto import Msg, Parser

SUBJECT = "orders"
T0 = 1_700_000_000_000_000_000


def encoder(tag: str | None = "orders/0") -> IngestEncoder:
    return IngestEncoder(SUBJECT, max_batch_bytes=1 << 20, max_batch_records=100, copy_tag=tag, stream="orders")


def parsed(command: bytes) -> Msg:
    """The command as the ingest's reader hands it over, once the server delivers it (HPUB becomes HMSG)."""
    out: list[object] = []
    Parser(lambda op, arg: None).feed(command.replace(b"HPUB orders ", b"HMSG orders 1 "), out)  # type: ignore[arg-type]
    (message,) = out
    assert isinstance(message, Msg)
    return message


def test_copy_tags_name_the_partition_or_the_group() -> None:
    assert copy_tag("s", 2, None) == "s/2"
    assert copy_tag("s", 2, "ns.g") == "group ns.g"


def test_own_copies_are_left_out_and_others_kept() -> None:
    own = parsed(copy_command(SUBJECT, "orders/0", b"value"))
    other = parsed(copy_command(SUBJECT, "orders/1", b"value"))
    via_nats_py = Decoded(SUBJECT, "", b"v", [(COPY_HEADER, b"orders/0")])
    plain = memoryview(b"plain")
    encoded = encoder().encode([own, plain, other, via_nats_py], T0)
    assert (encoded.copies, encoded.records) == (2, 2)
    kept = encoder(None).encode([own, plain], T0)  # an ingest without a tag (none given) keeps everything
    assert (kept.copies, kept.records) == (0, 2)


def headers(**values: str) -> list[tuple[str, bytes]]:
    return [(name.replace("_", "-"), value.encode()) for name, value in values.items()]


def test_check_of() -> None:
    assert check_of(headers(Other="x"), "r", "orders") is None
    assert check_of(headers(**{"Nats-Expected-Stream": "orders"}), "r", "orders") == Check("r", None, None)
    assert check_of(headers(**{"Nats-Expected-Last-Sequence": " 7 "}), "r", "orders") == Check("r", 7, None)
    assert check_of(headers(**{"Nats-Expected-Last-Msg-Id": "a"}), "", "orders") == Check("", None, b"a")
    with pytest.raises(Unmet) as refused:
        check_of(headers(**{"Nats-Expected-Stream": "other"}), "r", "orders")
    assert refused.value.err_code == 10060
    with pytest.raises(Unmet) as refused:
        check_of(headers(**{"Nats-Expected-Last-Sequence": "-1"}), "r", "orders")
    assert refused.value.err_code == 10071


def test_a_message_with_log_expectations_stops_the_encoding_before_it() -> None:
    checked = Decoded(SUBJECT, "reply", b"c", [("Nats-Expected-Last-Sequence", b"1")])
    wrong_stream = Decoded(SUBJECT, "reply2", b"w", [("Nats-Expected-Stream", b"elsewhere")])
    encoded = encoder().encode([memoryview(b"a"), wrong_stream, checked, memoryview(b"b")], T0)
    assert encoded.records == 1 and encoded.stopped_at is checked
    assert [(reply, exc.err_code) for reply, exc in encoded.unmet] == [("reply2", 10060)]
    alone = encoder().encode([checked], T0, single=True)
    assert alone.records == 1 and alone.stopped_at is None and alone.check == Check("reply", 1, None)
