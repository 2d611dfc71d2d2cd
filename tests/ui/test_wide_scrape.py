"""A scrape of a broker leading a thousand partitions answers with every partition's series (the benchmark
``metrics_scrape_1000`` times the same scrape)."""

from __future__ import annotations

import pytest

from tests.broker.conftest import broker, broker_settings, stub
from tests.broker.helpers import Stub, create_stream, publish, until
from tests.ui.helpers import scrape, value
from tidelog.server import Broker

__all__ = ["broker", "broker_settings", "stub"]  # fixtures

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

PARTITIONS = 1000


async def test_a_scrape_of_a_thousand_partitions_has_each_of_them(broker: Broker, stub: Stub) -> None:
    await create_stream(stub, "wide", partitions=PARTITIONS)
    assert broker.manager is not None and broker.http is not None
    manager = broker.manager
    await until(lambda: sum(p.stream.name == "wide" for p in manager.partitions()) == PARTITIONS, "every partition led")
    assert (await publish(stub, "wide", b"last", partition=PARTITIONS - 1)).ack.offset == 0

    samples = await scrape(f"http://127.0.0.1:{broker.http.port}")
    ends = {
        dict(labels)["partition"]: v
        for labels, v in samples["tidelog_partition_log_end_offset"].items()
        if ("stream", "wide") in labels
    }
    assert sorted(ends, key=int) == [str(i) for i in range(PARTITIONS)]
    assert ends[str(PARTITIONS - 1)] == 1 and sum(ends.values()) == 1
    leaders = [labels for labels, v in samples["tidelog_partition_leader"].items() if ("stream", "wide") in labels]
    assert len(leaders) == PARTITIONS
    assert (value(samples, "tidelog_broker_partitions_led") or 0) >= PARTITIONS
