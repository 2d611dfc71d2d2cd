"""The ``tidelog`` command: ``serve`` and the client commands (streams, publish, append, subscribe, partitions)."""

from __future__ import annotations

import click

from tidelog import __version__
from tidelog.cli.append import append
from tidelog.cli.cluster import register as register_cluster_commands
from tidelog.cli.partition import partition
from tidelog.cli.publish import publish
from tidelog.cli.serve import serve
from tidelog.cli.streams import stream
from tidelog.cli.subscribe import subscribe


@click.group()
@click.version_option(__version__, prog_name="tidelog")
def cli() -> None:
    """tidelog: a durable, replicated log for NATS."""


cli.add_command(serve)
cli.add_command(stream)
cli.add_command(publish)
cli.add_command(append)
cli.add_command(subscribe)
cli.add_command(partition)
register_cluster_commands(cli)


def main() -> None:
    cli()
