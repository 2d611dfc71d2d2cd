"""``tidelog subscribe --group G`` against a real broker process: a member that prints, commits and leaves, so the
next member of the group resumes after the last record printed, whether the command ended by ``--max-messages``
or by SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.helpers import BOUND
from tidelog.local.serve_process import TIDELOG, ServedBroker, clean_env, start_served_broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServedBroker]:
    served = await start_served_broker(tmp_path_factory.mktemp("cli-group"))
    try:
        yield served
    finally:
        await served.stop()


def _env(broker: ServedBroker) -> dict[str, str]:
    return clean_env(TIDELOG_BROKERS=broker.wire_address, COLUMNS="200")


async def tidelog(broker: ServedBroker, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one ``tidelog`` command (off the event loop) pointed at ``broker``."""

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TIDELOG), *args], capture_output=True, text=True, timeout=3 * BOUND, env=_env(broker)
        )

    return await asyncio.to_thread(run)


async def test_members_resume_after_the_last_record_printed(broker: ServedBroker) -> None:
    stream, group = "cli-group-orders", "cli-billing"
    assert (await tidelog(broker, "stream", "create", stream)).returncode == 0
    published = await tidelog(broker, "publish", stream, *(f"v{i}" for i in range(10)))
    assert published.returncode == 0, published.stderr

    first = await tidelog(broker, "subscribe", stream, "--group", group, "--earliest", "-n", "4", "--format", "value")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == ["v0", "v1", "v2", "v3"]
    assert f"group {group}: assigned {stream}/0" in first.stderr

    # --latest (the default) only applies where the group has no committed offset: it has one here
    second = await tidelog(broker, "subscribe", stream, "--group", group, "-n", "3", "--format", "value")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == ["v4", "v5", "v6"]

    # a member that runs until SIGTERM commits what it printed before leaving
    process = await asyncio.create_subprocess_exec(
        str(TIDELOG),
        "subscribe",
        stream,
        "--group",
        group,
        "--format",
        "value",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(broker),
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        lines = [(await asyncio.wait_for(process.stdout.readline(), BOUND)).decode().strip() for _ in range(3)]
        assert lines == ["v7", "v8", "v9"]
        process.send_signal(signal.SIGTERM)
        status = await asyncio.wait_for(process.wait(), BOUND)
        errors = (await process.stderr.read()).decode()
        assert status == 0, errors
        assert f"SIGTERM: committing and leaving group {group}" in errors and "Traceback" not in errors
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()

    assert (await tidelog(broker, "publish", stream, "v10")).returncode == 0
    last = await tidelog(broker, "subscribe", stream, "--group", group, "-n", "1", "--format", "value")
    assert last.returncode == 0, last.stderr
    assert last.stdout.splitlines() == ["v10"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--group", "g", "--partition", "0"), "--partition cannot be used with --group"),
        (("--group", "g", "--offset", "3"), "--offset cannot be used with --group"),
        (("--group", "g", "--since", "5m"), "--since cannot be used with --group"),
        (("--group", "g", "--stop-at-end"), "--stop-at-end cannot be used with --group"),
        (("--consumer-id", "c"), "--consumer-id is for a group member"),
    ],
)
async def test_options_that_do_not_fit_a_group_member_are_refused(
    broker: ServedBroker, args: tuple[str, ...], named: str
) -> None:
    result = await tidelog(broker, "subscribe", "cli-group-any", *args)
    assert result.returncode == 2
    assert named in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_a_bad_group_id_is_one_line(broker: ServedBroker) -> None:
    assert (await tidelog(broker, "stream", "create", "cli-group-bad")).returncode == 0
    result = await tidelog(broker, "subscribe", "cli-group-bad", "--group", "a/b", "-n", "1")
    assert result.returncode == 1
    assert "may not contain '/'" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
