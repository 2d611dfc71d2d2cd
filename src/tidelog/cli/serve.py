"""``tidelog serve``: run one broker in the foreground until SIGTERM or SIGINT.

The first signal starts a graceful shutdown (stop accepting, finish in-flight appends, flush, stop the embedded
NATS and etcd) and the process exits 0; a second signal during shutdown exits at once with 130.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from tidelog.broker.config import load_config
from tidelog.broker.config_values import ConfigError
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


async def run_broker(flags: dict[str, object], config_file: Path | None) -> int:
    from tidelog.server import Broker

    config = load_config(config_file, flags=flags)
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


@click.command("serve")
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
) -> None:
    """Run a tidelog broker (with embedded NATS and etcd unless external ones are given)."""
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
        code = _run(run_broker({k: v for k, v in flags.items() if v is not None}, config_file))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot start the broker: {exc}") from None
    sys.exit(code)


def _run(coro: object) -> int:
    import uvloop

    return uvloop.run(coro)  # type: ignore[arg-type]
