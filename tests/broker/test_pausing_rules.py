"""Which auto-pause rule applies to a stream (:meth:`Pauses.auto_pause_of`): its own settings over the broker's,
and ``__cursors`` by its own broker setting, never while read (Liftbridge's rule)."""

from __future__ import annotations

from typing import Any, cast

from tidelog.broker.pausing import Pauses
from tidelog.metadata.records import StreamConfig, StreamRecord
from tidelog.protocol.cursors import CURSORS_STREAM


def pauses() -> Pauses:
    nothing = cast(Any, None)  # the rule reads only the settings
    return Pauses(nothing, nothing, nothing, auto_pause_ms=5000, disable_if_subscribers=False, cursors_auto_pause_ms=60)


def stream(name: str = "s", **config: Any) -> StreamRecord:
    return StreamRecord(name, name, "", 1, 1, 0, StreamConfig(**config))


def test_the_broker_defaults_apply_to_a_stream_without_its_own() -> None:
    assert pauses().auto_pause_of(stream()) == (5000, False)


def test_a_stream_overrides_both_and_zero_means_never() -> None:
    rule = pauses().auto_pause_of(stream(auto_pause_time_ms=0, auto_pause_disable_if_subscribers=True))
    assert rule == (0, True)
    assert pauses().auto_pause_of(stream(auto_pause_time_ms=250)) == (250, False)


def test_cursors_follow_their_own_setting_and_never_pause_while_read() -> None:
    assert pauses().auto_pause_of(stream(CURSORS_STREAM, auto_pause_time_ms=1)) == (60, True)
