"""Frame headers of the operations that reshape a running cluster: adding partitions to a stream, changing a
stream's settings, and electing the preferred leaders now.

Clients send these to any broker, which forwards them to the controller (``forwarded`` marks a request sent on
that way, so that it never travels further). They share the base :class:`~tidelog.protocol.messages.Header`,
the field types and the evolution rules of :mod:`tidelog.protocol.messages`; their routes are in
:mod:`tidelog.protocol.message_codec`.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from tidelog.protocol.messages import INT32_MAX, Header, Millis, Name

PartitionCount = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]

RESET = "default"
"""The value that takes a stream setting back to the broker default (``--set retention_max_bytes=default``)."""


class AddPartitionsRequest(Header, frozen=True):
    """Grow stream ``name`` to ``partitions`` partitions (never fewer than it has); partition ``i`` listens on
    ``subject.i``, Liftbridge's rule. Asking for the count it has already is a success that changes nothing."""

    name: Name
    partitions: PartitionCount
    timeout_ms: Millis = 10_000
    forwarded: bool = False


class AddPartitionsResponse(Header, frozen=True):
    before: PartitionCount  # the stream's partitions before this request
    after: PartitionCount  # and now


class AlterStreamRequest(Header, frozen=True):
    """Change per-stream settings of stream ``name``: ``settings`` by name (as in ``CreateStreamRequest.config``),
    strings, :data:`RESET` for the broker default. A setting that cannot change at run time is refused by name
    and nothing changes."""

    name: Name
    settings: dict[str, str]
    timeout_ms: Millis = 10_000
    forwarded: bool = False


class SettingChange(Header, frozen=True):
    """One setting as it was and as it is (``""``: the broker default)."""

    name: str
    before: str
    after: str


class AlterStreamResponse(Header, frozen=True):
    changes: tuple[SettingChange, ...]  # the settings whose value changed (asking for the value it has is none)


class ElectLeadersRequest(Header, frozen=True):
    """Move every partition's leadership to its preferred replica (its first), where that replica is alive and
    in the ISR (Kafka's preferred-leader election; the controller also does it every ``balance_interval``)."""

    timeout_ms: Millis = 10_000
    forwarded: bool = False


class ElectLeadersResponse(Header, frozen=True):
    moved: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]  # leaderships moved
    not_preferred: Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)] = 0  # still led by another replica after it
