"""What every client command shares: where the brokers are, running a coroutine, and one-line errors.

A command fails with one clear line on stderr and a non-zero exit (1 for a refused request, 2 for bad usage,
as click does), never with a traceback: the traceback is for ``--debug``.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import click

from tidelog.protocol.connection import ConnectionClosedError
from tidelog.protocol.errors import TidelogError

P = ParamSpec("P")
T = TypeVar("T")

BROKERS_ENV = "TIDELOG_BROKERS"
DEFAULT_BROKERS = "127.0.0.1:9293"

brokers_option = click.option(
    "--brokers",
    "-b",
    default=lambda: os.environ.get(BROKERS_ENV, DEFAULT_BROKERS),
    show_default=f"${BROKERS_ENV} or {DEFAULT_BROKERS}",
    help="Comma-separated host:port of brokers' wire protocol.",
)


def bootstrap(brokers: str) -> list[str]:
    return [b.strip() for b in brokers.split(",") if b.strip()]


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine, turning failures into one-line errors."""
    try:
        return asyncio.run(coro)
    except TidelogError as exc:
        raise click.ClickException(f"{exc.code.name.lower().replace('_', ' ')}: {exc.message}") from None
    except (ConnectionClosedError, ConnectionError, OSError) as exc:
        raise click.ClickException(f"cannot reach the broker: {exc}") from None
    except TimeoutError:
        raise click.ClickException("the broker did not answer in time") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def async_command(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Let a click command be ``async def``."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return run(func(*args, **kwargs))

    return wrapper


def parse_headers(pairs: tuple[str, ...]) -> list[tuple[str, bytes]]:
    """``--header NAME=VALUE`` options as record headers (the value UTF-8 encoded); a bad one names the option."""
    headers = []
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--header")
        headers.append((name, value.encode()))
    return headers
