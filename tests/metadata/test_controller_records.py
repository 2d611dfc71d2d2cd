"""The controller's keys and stored values: what the election's and the fence's byte comparisons rely on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.metadata.fenced_writer import ControllerTerm
from tidelog.metadata.records import (
    ControllerRecord,
    Keys,
    decode_controller,
    decode_controller_epoch,
    encode_controller,
    encode_controller_epoch,
)


def test_controller_keys() -> None:
    keys = Keys("/tidelog/")
    assert keys.controller() == b"/tidelog/controller"
    assert keys.controller_epoch() == b"/tidelog/controller-epoch"
    # Outside the prefixes the mirror decodes, so brokers that predate the controller ignore both keys.
    for key in (keys.controller(), keys.controller_epoch()):
        assert not key.decode().startswith((keys.brokers, keys.streams, keys.partitions))


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_an_epoch_has_exactly_one_encoding(epoch: int) -> None:
    data = encode_controller_epoch(epoch)
    assert decode_controller_epoch(data) == epoch
    assert encode_controller_epoch(decode_controller_epoch(data)) == data


@given(st.text(min_size=1, max_size=40), st.integers(min_value=1, max_value=2**63 - 1))
def test_a_term_is_named_by_its_record_bytes(broker_id: str, epoch: int) -> None:
    term = ControllerTerm(broker_id, epoch)
    assert decode_controller(term.record_bytes) == ControllerRecord(broker_id, epoch)
    assert term.record_bytes == encode_controller(ControllerRecord(broker_id, epoch))
    assert term.record_bytes != ControllerTerm(broker_id, epoch + 1).record_bytes
    assert term.record_bytes != ControllerTerm(broker_id + "x", epoch).record_bytes
    assert term.epoch_bytes == encode_controller_epoch(epoch)
