"""What every client command shares: where the brokers are, running a coroutine, and one-line errors.

A command fails with one clear line on stderr and a non-zero exit (1 for a refused request, 2 for bad usage,
as click does), never with a traceback: the traceback is for ``--debug``.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click

from tidelog.launch.endpoints import DEFAULT_DATA_DIR, ENDPOINTS_FILE, Endpoints, read_endpoints
from tidelog.protocol.connection import ConnectionClosedError
from tidelog.protocol.errors import TidelogError

P = ParamSpec("P")
T = TypeVar("T")

BROKERS_ENV = "TIDELOG_BROKERS"
DEFAULT_BROKERS = "127.0.0.1:9293"

DATA_DIR_ENV = "TIDELOG_DATA_DIR"


def _remember_data_dir(ctx: click.Context, _param: click.Parameter, value: Path) -> None:
    ctx.meta[DATA_DIR_ENV] = value


data_dir_option = click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=lambda: os.environ.get(DATA_DIR_ENV) or str(DEFAULT_DATA_DIR),
    show_default=f"${DATA_DIR_ENV} or ./{DEFAULT_DATA_DIR}",
    is_eager=True,  # read before the defaults that depend on it
    expose_value=False,
    callback=_remember_data_dir,
    help=f"Data directory of a broker on this host: its {ENDPOINTS_FILE} gives the addresses not given otherwise.",
)


def local_broker() -> Endpoints | None:
    """The endpoints a broker running on ``--data-dir`` wrote (``make run`` / ``tidelog serve``), if any."""
    ctx = click.get_current_context(silent=True)
    data_dir = ctx.meta.get(DATA_DIR_ENV) if ctx is not None else None
    return read_endpoints(Path(data_dir) if data_dir is not None else DEFAULT_DATA_DIR)


def _default_brokers() -> str:
    if os.environ.get(BROKERS_ENV):
        return os.environ[BROKERS_ENV]
    found = local_broker()
    return found.wire if found is not None else DEFAULT_BROKERS


def local_etcd_endpoints() -> str:
    """The etcd endpoints of the broker running on ``--data-dir``, comma-separated; empty if none runs there."""
    found = local_broker()
    return ",".join(found.etcd) if found is not None else ""


def brokers_option(command: Callable[P, T]) -> Callable[P, T]:
    """``--brokers``: the flag, else ``$TIDELOG_BROKERS``, else the local broker's wire address, else the default."""
    with_brokers = click.option(
        "--brokers",
        "-b",
        default=_default_brokers,
        show_default=f"${BROKERS_ENV}, else the wire address in <data-dir>/{ENDPOINTS_FILE}, else {DEFAULT_BROKERS}",
        help="Comma-separated host:port of brokers' wire protocol.",
    )(command)
    return data_dir_option(with_brokers)


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
