"""The Dockerfile and compose.yaml, checked without a container engine (none on the test machine): the broker
settings they give are ones a broker accepts, and the image's health check command answers as it should against
a real broker."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from tests.helpers import LONG_BOUND
from tidelog.broker.config import load_config
from tidelog.local.serve_process import clean_env, start_served_broker

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
_COMPOSE_SETTING = re.compile(r"^\s+(TIDELOG_[A-Z_]+): (\S+)$", re.MULTILINE)
_IMAGE_SETTING = re.compile(r"\b(TIDELOG_[A-Z_]+)=(\S+)")


def health_check_argv() -> list[str]:
    line = next(line for line in DOCKERFILE.read_text().splitlines() if line.startswith("HEALTHCHECK "))
    argv: list[str] = json.loads(line.split(" CMD ", 1)[1])
    return argv


@pytest.mark.parametrize(
    ("name", "value"),
    _COMPOSE_SETTING.findall(COMPOSE.read_text()) + _IMAGE_SETTING.findall(DOCKERFILE.read_text()),
)
def test_every_setting_the_container_files_give_is_accepted(name: str, value: str) -> None:
    load_config(env={name: value})


def test_health_check_runs_the_image_python() -> None:
    assert health_check_argv()[0] == "python"


async def check_health(port: int) -> int:
    argv = health_check_argv()
    child = await asyncio.create_subprocess_exec(sys.executable, *argv[1:], env=clean_env(TIDELOG_PORT=str(port)))
    try:
        return await asyncio.wait_for(child.wait(), LONG_BOUND)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise


@pytest.mark.slow
async def test_health_check_passes_on_a_serving_broker_and_fails_once_it_stopped(tmp_path: Path) -> None:
    served = await start_served_broker(tmp_path)
    try:
        assert await check_health(served.port) == 0
    finally:
        assert await served.stop() == 0
    assert await check_health(served.port) != 0
