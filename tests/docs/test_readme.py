"""The README's quick start, run as written: a ``tidelog serve`` as ``make run`` starts it (its data in
``./tidelog-data``), then each command of the quick start from the same directory, with no flags added."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import LONG_BOUND
from tidelog.launch.ports import free_ports
from tidelog.launch.process import ManagedProcess
from tidelog.local.serve_process import START_WITHIN, TIDELOG, clean_env, serving

README = Path(__file__).resolve().parents[2] / "README.md"
_QUICK_START = re.compile(r"<!-- quick-start: [^>]*-->\n```sh\n(?P<body>.*?)```", re.DOTALL)
VENV_TIDELOG = ".venv/bin/tidelog"


def quick_start_commands() -> list[str]:
    match = _QUICK_START.search(README.read_text())
    assert match is not None, "the README's quick start block is no longer marked"
    return [line for line in match["body"].splitlines() if line.strip()]


def test_quick_start_uses_only_the_tidelog_command() -> None:
    for command in quick_start_commands():
        assert command.startswith(f"{VENV_TIDELOG} "), f"a tool the README does not install: {command}"


def _missing_features() -> list[str]:
    """What the quick start needs that this tree's CLI lacks (it is built in parts, issue 19)."""
    publish_help = subprocess.run(
        [str(TIDELOG), "publish", "--help"], capture_output=True, text=True, timeout=LONG_BOUND, env=clean_env()
    ).stdout
    return [] if "--nats" in publish_help else ["tidelog publish --nats"]


async def run(command: str, cwd: Path) -> tuple[int, str, str]:
    local = command.replace(VENV_TIDELOG, str(TIDELOG), 1)
    child = await asyncio.create_subprocess_exec(
        "bash", "-c", local, cwd=cwd, env=clean_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(child.communicate(), LONG_BOUND)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_quick_start_runs_as_written(tmp_path: Path) -> None:
    missing = _missing_features()
    if missing:
        pytest.skip(f"this tree's CLI lacks {', '.join(missing)} (issue 19)")
    port, wire_port, nats_port = free_ports(3)
    # make run's broker, on free ports instead of the defaults; the commands find it through its data directory.
    broker = ManagedProcess(
        [str(TIDELOG), "serve", "--port", str(port), "--wire-port", str(wire_port)],
        log_path=tmp_path / "serve.log",
        env=clean_env(TIDELOG_EMBEDDED_NATS_PORT=str(nats_port)),
        cwd=tmp_path,
    )
    await broker.start(serving(port), ready_within=START_WITHIN)
    try:
        if not (tmp_path / "tidelog-data" / "endpoints.json").exists():
            pytest.skip("this tree's broker writes no endpoints file for the CLI to find it by (issue 19)")
        outputs = []
        for command in quick_start_commands():
            code, out, err = await run(command, tmp_path)
            assert code == 0, f"{command}\n{err}"
            outputs.append(out)
        assert "first" in outputs[-1] and "second" in outputs[-1]
    finally:
        assert await broker.stop(grace=LONG_BOUND) == 0
