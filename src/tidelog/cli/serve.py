"""``tidelog serve``: run one broker in the foreground until SIGTERM or SIGINT.

The first signal starts a graceful shutdown (stop accepting, finish in-flight appends, flush, stop the embedded
NATS and etcd) and the process exits 0; a second signal during shutdown exits at once with 130.
"""

from __future__ import annotations

import difflib
import logging
import sys
from collections.abc import Mapping
from pathlib import Path

import click

from tidelog.broker.config import ConfigError, config_keys, load_config
from tidelog.cli.signals import stop_on_signals

log = logging.getLogger("tidelog")


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Third-party chatter (gRPC/etcd internals) is only interesting when debugging.
    for noisy in ("aetcd", "nats", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING if level != "debug" else logging.DEBUG)


async def run_broker(
    flags: dict[str, object], config_file: Path | None, settings: Mapping[str, str] | None = None
) -> int:
    from tidelog.server import Broker

    config = load_config(config_file, flags=flags, settings=settings)
    configure_logging(config.log_level)
    broker = Broker(config)
    stop = stop_on_signals(
        lambda name: log.info("%s received: shutting down", name),
        exiting=lambda name: log.warning("second %s: exiting now", name),
    )
    await broker.start()
    log.info("broker %s is ready", broker.id)
    await stop.wait()
    await broker.stop()
    return 0


SETTINGS_EPILOG = (
    "Every broker setting (there are about 40: limits, retention, flush policy, replication timeouts, the "
    "embedded NATS and etcd, ...) is described with its default in docs/configuration.md. Give any of them as "
    "-s KEY=VALUE (repeatable, e.g. -s max_message_bytes=4194304), as TIDELOG_KEY in the environment, or as "
    "KEY = VALUE in the --config file. Flags win over -s, -s over the environment, the environment over the file."
)


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
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Data directory (default ./tidelog-data).",
)
@click.option("--nats-servers", default=None, help="Comma-separated NATS URLs (default: run an embedded nats-server).")
@click.option("--etcd-endpoints", default=None, help="Comma-separated etcd endpoints (default: run an embedded etcd).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
@click.option(
    "--setting",
    "-s",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any broker setting (repeatable; see docs/configuration.md), as dev-cluster takes them.",
)
def serve(
    config_file: Path | None,
    id_: str | None,
    host: str | None,
    port: int | None,
    wire_port: int | None,
    data_dir: Path | None,
    nats_servers: str | None,
    etcd_endpoints: str | None,
    log_level: str | None,
    settings: tuple[str, ...],
) -> None:
    """Run a tidelog broker (with embedded NATS and etcd unless external ones are given)."""
    parsed = parse_settings(settings)
    flags: dict[str, object] = {
        "id": id_,
        "host": host,
        "port": port,
        "wire_port": wire_port,
        "data_dir": data_dir,
        "nats_servers": nats_servers.split(",") if nats_servers else None,
        "etcd_endpoints": etcd_endpoints.split(",") if etcd_endpoints else None,
        "log_level": log_level,
    }
    try:
        code = _run(run_broker({k: v for k, v in flags.items() if v is not None}, config_file, parsed))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start the broker: {exc}") from None
    sys.exit(code)


def _run(coro: object) -> int:
    import uvloop

    return uvloop.run(coro)  # type: ignore[arg-type]
