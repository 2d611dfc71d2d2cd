"""Reshaping a running stream on a real broker over the wire protocol: adding partitions (Liftbridge's subject
rule, never shrinking), changing settings live (applied to the open logs) or refusing them by name, and
electing preferred leaders."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broker.helpers import until
from tidelog.broker.config import BrokerConfig
from tidelog.broker.config_values import ConfigError
from tidelog.client import Admin
from tidelog.protocol.errors import InvalidArgumentError, UnknownStreamError
from tidelog.server import Broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture
def address(broker: Broker) -> str:
    assert broker.wire is not None
    return f"127.0.0.1:{broker.wire.port}"


async def test_added_partitions_listen_on_subject_dot_id(
    broker: Broker, address: str, nc: object, stream_name: str
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, f"{stream_name}.in", partitions=2)
        answer = await admin.add_partitions(stream_name, 4)
        assert (answer.before, answer.after) == (2, 4)
        info = await admin.describe_stream(stream_name)
        assert [p.id for p in info.partitions] == [0, 1, 2, 3]

        assert broker.manager.leader_of(stream_name, 3).subject == f"{stream_name}.in.3"
        assert broker.manager.leader_of(stream_name, 0).subject == f"{stream_name}.in"  # old ones keep theirs
        await until(lambda: broker.manager.ingesting(stream_name, 3), "the new partition to subscribe")
        await nc.publish(f"{stream_name}.in.3", b"to the new partition")  # type: ignore[attr-defined]
        await until(lambda: broker.manager.leader_of(stream_name, 3).log_end == 1, "the message to be stored")

        again = await admin.add_partitions(stream_name, 4)  # the count it has: nothing changes
        assert (again.before, again.after) == (4, 4)


async def test_a_stream_never_shrinks(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, partitions=3)
        with pytest.raises(InvalidArgumentError, match="cannot shrink to 2"):
            await admin.add_partitions(stream_name, 2)
        with pytest.raises(UnknownStreamError):
            await admin.add_partitions(f"{stream_name}-none", 2)
        with pytest.raises(InvalidArgumentError, match="reserved"):
            await admin.add_partitions("__cursors", 100)
        assert len((await admin.describe_stream(stream_name)).partitions) == 3


async def test_a_subject_that_cannot_take_more_partitions_is_refused(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, f"{stream_name}.>")
        with pytest.raises(InvalidArgumentError, match="partition 1 would listen on"):
            await admin.add_partitions(stream_name, 2)


async def test_settings_change_live_on_the_open_logs(broker: Broker, address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, partitions=2)
        answer = await admin.alter_stream(
            stream_name, {"retention.max.age.ms": 60_000, "retentionMaxMessages": 10, "segment_max_bytes": 1 << 30}
        )
        assert {c.name: (c.before, c.after) for c in answer.changes} == {
            "retention_max_age_ms": ("", "60000"),
            "retention_max_messages": ("", "10"),
            "segment_max_bytes": ("", str(1 << 30)),
        }
        for pid in (0, 1):
            config = broker.manager.leader_of(stream_name, pid).log.config
            assert (config.retention_max_age_ms, config.retention_max_messages) == (60_000, 10)
            assert config.segment_max_bytes == 1 << 30

        back = await admin.alter_stream(stream_name, {"retention_max_messages": None})  # the broker default
        assert [(c.name, c.after) for c in back.changes] == [("retention_max_messages", "")]
        assert broker.manager.leader_of(stream_name, 0).log.config.retention_max_messages is None
        assert (await admin.alter_stream(stream_name, {"retention_max_age_ms": 60_000})).changes == ()


async def test_min_isr_and_auto_pause_reach_the_running_leader(broker: Broker, address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
        await admin.alter_stream(stream_name, {"min_isr": 1, "auto_pause_time_ms": 5000})
    leader = broker.manager.leader_of(stream_name, 0)
    assert leader.min_isr == 1
    assert leader.stream.config.auto_pause_time_ms == 5000


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"encryption": True}, "encryption cannot change at run time"),
        ({"flush_policy": "never", "tiered": True}, "flush_policy, tiered cannot change at run time"),
        ({"segment_max_bytes": 2048}, "segment_max_bytes can grow but not shrink"),
        ({"min_isr": 2}, "above stream .* replication factor 1"),
        ({"retention_max_bytes": -1}, "must not be negative"),
        ({"compact_max_goroutines": "many"}, "bad stream setting"),
        ({"no_such_setting": 1}, "unknown stream setting"),
    ],
)
async def test_settings_that_cannot_change_are_refused_by_name(
    broker: Broker, address: str, stream_name: str, settings: dict[str, object], refusal: str
) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
        with pytest.raises(InvalidArgumentError, match=refusal):
            await admin.alter_stream(stream_name, settings)  # type: ignore[arg-type]
    record = broker.mirror.snapshot.stream(stream_name)
    assert record is not None and record.config.segment_max_bytes is None  # nothing changed


async def test_asking_for_the_value_a_fixed_setting_has_is_no_change(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name, config={"flush.policy": "always"})
        assert (await admin.alter_stream(stream_name, {"flush_policy": "always"})).changes == ()


async def test_preferred_leaders_on_one_broker_move_nothing(address: str, stream_name: str) -> None:
    async with Admin(address) as admin:
        await admin.create_stream(stream_name)
        answer = await admin.elect_leaders()
    assert (answer.moved, answer.not_preferred) == (0, 0)


@pytest.fixture(scope="module")
def broker_settings() -> dict[str, object]:
    return {"rack": "rack-1"}


async def test_the_broker_registers_its_rack(broker: Broker) -> None:
    assert broker.mirror is not None
    assert broker.mirror.snapshot.brokers[broker.id].rack == "rack-1"


async def test_a_bad_rack_is_refused_naming_what_is_allowed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"rack.*up to 64 letters"):
        BrokerConfig(data_dir=tmp_path, rack="rack 1/2")
