"""Encryption at rest from the command line: ``stream create --encryption``, ``stream rotate-key``, the master key
from a file, and the one-line refusals (a bad key never repeated, a key-less broker, a plain stream)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from tidelog.local.serve_process import TIDELOG, ServedBroker, clean_env, start_served_broker

pytestmark = [pytest.mark.slow]

TIMEOUT = 60.0


async def tidelog(broker: ServedBroker, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(TIDELOG_BROKERS=broker.wire_address, COLUMNS="200")
    run = subprocess.run
    return await asyncio.to_thread(
        lambda: run([str(TIDELOG), *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


async def test_create_publish_rotate_and_read_back_with_a_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "master.key"
    key_file.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    broker = await start_served_broker(tmp_path / "keyed", encryption_key_file=str(key_file))
    try:
        assert (await tidelog(broker, "stream", "create", "cli-sealed", "--encryption")).returncode == 0
        assert (await tidelog(broker, "publish", "cli-sealed", "secret-one")).returncode == 0
        rotated = await tidelog(broker, "stream", "rotate-key", "cli-sealed")
        assert rotated.returncode == 0, rotated.stderr
        assert (await tidelog(broker, "publish", "cli-sealed", "secret-two")).returncode == 0
        read = await tidelog(broker, "subscribe", "cli-sealed", "--earliest", "--stop-at-end", "--format", "json")
        assert [json.loads(line)["value"] for line in read.stdout.splitlines()] == ["secret-one", "secret-two"]
        assert (await tidelog(broker, "stream", "create", "cli-plain")).returncode == 0
        assert "not encrypted" in one_line(await tidelog(broker, "stream", "rotate-key", "cli-plain"))
    finally:
        await broker.stop()
    on_disk = b"".join(p.read_bytes() for p in (broker.data_dir / "streams").glob("cli-sealed*/**/*.log"))
    assert b"secret-" not in on_disk


async def test_a_broker_without_the_key_refuses_an_encrypted_stream(tmp_path: Path) -> None:
    broker = await start_served_broker(tmp_path / "keyless")
    try:
        line = one_line(await tidelog(broker, "stream", "create", "cli-sealed", "--encryption"))
        assert "master key" in line
    finally:
        await broker.stop()


def test_serve_refuses_a_bad_master_key_without_repeating_it(tmp_path: Path) -> None:
    bad = "not-a-key-" + "x" * 20
    env = clean_env(TIDELOG_ENCRYPTION_KEY=bad)
    result = subprocess.run(
        [str(TIDELOG), "serve", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )
    assert result.returncode != 0
    assert "encryption_key" in result.stderr and bad not in result.stderr
    assert "Traceback" not in result.stderr
