"""``tidelog serve``: run one broker in the foreground until SIGTERM or SIGINT.

The first signal starts a graceful shutdown (stop accepting, finish in-flight appends, flush, stop the embedded
NATS and etcd) and the process exits 0; a second signal during shutdown exits at once with 130. That holds in
every state: a signal during start-up (waiting for an unreachable NATS or etcd, say) cancels the start, which
stops whatever had started, and a shutdown that overruns ``shutdown_timeout_ms`` plus :data:`STOP_MARGIN` ends
the process anyway (status 1).

A failure to start (a port in use, a server binary missing, a child server that exits) is one line on stderr,
naming what failed and, for a port, the setting that moves it; the traceback only with ``--log-level debug``.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tidelog.broker.config import BrokerConfig, config_keys, load_config
from tidelog.broker.config_values import ConfigError
from tidelog.cli.logs import configure_logging, set_log_context
from tidelog.cli.signals import stop_on_signals
from tidelog.launch.process import ProcessStartError
from tidelog.protocol.tls import TlsConfigError
from tidelog.storage.tiered_store import TieredStoreConfigError

if TYPE_CHECKING:
    from tidelog.server import Broker

log = logging.getLogger("tidelog")

STOP_MARGIN = 30.0
"""Seconds a stop may take beyond ``shutdown_timeout_ms`` (closing servers and logs, stopping the embedded NATS and
etcd) before the process exits without finishing it."""


async def run_broker(flags: dict[str, object], config_file: Path | None) -> int:
    from tidelog.server import Broker

    config = load_config(config_file, flags=flags)
    configure_logging(config.log_level, config.log_format)
    broker = Broker(config)
    set_log_context(broker=broker.id)
    stop = stop_on_signals(
        lambda name: log.info("%s received: shutting down", name),
        exiting=lambda name: log.warning("second %s: exiting now", name),
        exit_within=stop_bound(config),
        overdue=lambda bound: log.error("shutdown did not finish within %gs: exiting now", bound),
    )
    if not await start_unless_stopped(broker, stop):
        return 0
    log.info("broker %s is ready", broker.id)
    await stop.wait()
    await broker.stop()
    return 0


def stop_bound(config: BrokerConfig) -> float:
    """Seconds from the first signal to the end of the process, at most."""
    return config.shutdown_timeout_ms / 1000 + STOP_MARGIN


async def start_unless_stopped(broker: Broker, stop: asyncio.Event) -> bool:
    """Start ``broker``, unless ``stop`` is set first: then cancel the start (which stops what it had started)
    and return False. Start-up can wait for ever on a NATS or etcd that does not answer."""
    starting = asyncio.ensure_future(broker.start())
    signalled = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if starting.done():
        starting.result()
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    await broker.stop()
    return False


SETTINGS_EPILOG = (
    "Every broker setting (there are about 40: limits, retention, flush policy, replication timeouts, the "
    "embedded NATS and etcd, ...) is described with its default in docs/configuration.md. Give any of them as "
    "-s KEY=VALUE (repeatable, e.g. -s max_message_bytes=4194304), as TIDELOG_KEY in the environment, or as "
    "KEY = VALUE in the --config file. Flags win over -s, -s over the environment, the environment over the file."
)


@click.command("serve", epilog=SETTINGS_EPILOG)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="TOML configuration file (flat keys, as the flags without dashes).",
)
@click.option("--id", "id_", default=None, help="Broker id (default: generated once, kept in the data dir).")
@click.option("--host", default=None, help="Address to bind and advertise (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Liftbridge gRPC API port (default 9292).")
@click.option("--wire-port", type=int, default=None, help="tidelog wire protocol port (default 9293).")
@click.option("--http-port", type=int, default=None, help="HTTP port of /metrics, /healthz and /readyz (default 9294).")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Data directory (default ./tidelog-data).",
)
@click.option("--nats-servers", default=None, help="Comma-separated NATS URLs (default: run an embedded nats-server).")
@click.option("--etcd-endpoints", default=None, help="Comma-separated etcd endpoints (default: run an embedded etcd).")
@click.option(
    "--embedded-nats-port",
    type=int,
    default=None,
    help="Client port of the embedded nats-server (default 4222; 0: any free port). "
    "Setting embedded_nats_port, env TIDELOG_EMBEDDED_NATS_PORT.",
)
@click.option(
    "--embedded-etcd-port",
    type=int,
    default=None,
    help="Client port of the embedded etcd (default 0: any free port; the broker writes it to "
    "<data-dir>/endpoints.json). Setting embedded_etcd_port.",
)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option(
    "--tiered-store",
    default=None,
    help="Offload sealed segments to this object store: file:///absolute/path (no server) or s3://bucket[/prefix] "
    "(with -s tiered_store_endpoint=... and credentials). Setting tiered_store.",
)
@click.option(
    "--setting",
    "-s",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any broker setting (repeatable; see docs/configuration.md), e.g. -s retention_max_age_ms=3600000; the "
    "flags above win.",
)
def serve(
    config_file: Path | None,
    id_: str | None,
    host: str | None,
    port: int | None,
    wire_port: int | None,
    http_port: int | None,
    data_dir: Path | None,
    nats_servers: str | None,
    etcd_endpoints: str | None,
    embedded_nats_port: int | None,
    embedded_etcd_port: int | None,
    log_level: str | None,
    tiered_store: str | None,
    settings: tuple[str, ...],
) -> None:
    """Run a tidelog broker (with embedded NATS and etcd unless external ones are given).

    Every setting has a TOML key (--config), a TIDELOG_<KEY> variable and -s KEY=VALUE; later ones win, flags
    last. The full list, with defaults: docs/configuration.md.
    """
    named: dict[str, object] = {
        "id": id_,
        "host": host,
        "port": port,
        "wire_port": wire_port,
        "http_port": http_port,
        "data_dir": data_dir,
        "nats_servers": nats_servers.split(",") if nats_servers else None,
        "etcd_endpoints": etcd_endpoints.split(",") if etcd_endpoints else None,
        "embedded_nats_port": embedded_nats_port,
        "embedded_etcd_port": embedded_etcd_port,
        "log_level": log_level,
        "tiered_store": tiered_store,
    }
    flags: dict[str, object] = {**parse_settings(settings), **{k: v for k, v in named.items() if v is not None}}
    try:
        code = _run(run_broker(flags, config_file))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except (TlsConfigError, TieredStoreConfigError) as exc:
        raise click.ClickException(f"cannot start the broker: {exc}") from None
    except OSError as exc:
        log.debug("start-up failed", exc_info=True)
        raise click.ClickException(f"cannot start the broker: {exc}") from None
    except ProcessStartError as exc:
        log.debug("start-up failed", exc_info=True)
        raise click.ClickException(
            f"cannot start the broker: {exc.name} {exc.reason} (its log: {exc.log_path})"
        ) from None
    sys.exit(code)


def parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    """``-s KEY=VALUE`` options as ``{key: value}``; an unknown key or a pair without ``=`` is a usage error
    naming the allowed keys (the values are checked with the rest of the configuration)."""
    keys = config_keys()
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE, e.g. max_message_bytes=4194304", param_hint="-s")
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise click.BadParameter(
                f"unknown setting {key!r}{hint}; the settings are listed in docs/configuration.md: {', '.join(keys)}",
                param_hint="-s",
            )
        settings[key] = value.strip()
    return settings


def _run(coro: object) -> int:
    import uvloop

    return uvloop.run(coro)  # type: ignore[arg-type]
