"""The README's ``tidelog`` commands, run in the order a reader meets them, against a real broker.

Every ``sh`` block's lines that run ``.venv/bin/tidelog`` are run as written (through ``bash``, from the
repository root, so pipes and redirections are the reader's), with ``TIDELOG_BROKERS`` and ``NATS_URL`` pointing
at this test's broker instead of the default ports. Left out: lines with a placeholder (``<wire port>``), the
commands that run in the foreground until Ctrl-C (``serve``, ``dev-cluster``), and ``subscribe``, which waits for
new records until Ctrl-C: it is run with ``--stop-at-end`` added. Each must exit 0.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tidelog.local.serve_process import ServedBroker, clean_env, start_served_broker

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TIMEOUT = 60.0
PLACEHOLDER = re.compile(r"<[a-z][a-z ]*>")
FOREGROUND = (" serve", " dev-cluster")


def readme_commands(text: str) -> list[str]:
    """The runnable ``tidelog`` lines of the README's ``sh`` blocks, in order, without their comments."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL):
        for line in block.splitlines():
            command = re.sub(r"\s+#\s.*$", "", line).strip()
            if ".venv/bin/tidelog" not in command or PLACEHOLDER.search(command):
                continue
            if any(f"tidelog{word}" in command for word in FOREGROUND):
                continue
            if " subscribe " in command and "--stop-at-end" not in command:
                command += " --stop-at-end"
            commands.append(command)
    return commands


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def broker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServedBroker]:
    served = await start_served_broker(tmp_path_factory.mktemp("readme"))
    try:
        yield served
    finally:
        await served.stop()


async def test_the_readme_has_commands_to_run() -> None:
    commands = readme_commands(README.read_text())
    assert any("append" in c for c in commands) and any("stream create" in c for c in commands), commands


async def test_the_readme_commands_run_in_order(broker: ServedBroker) -> None:
    env = clean_env(TIDELOG_BROKERS=broker.wire_address, NATS_URL=broker.nats_url, COLUMNS="120")
    for command in readme_commands(README.read_text()):

        def run(command: str = command) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, env=env
            )

        result = await asyncio.to_thread(run)
        assert result.returncode == 0, f"{command}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
