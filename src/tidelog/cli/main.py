"""The ``tidelog`` command: ``serve`` and the client commands (streams, publish, append, subscribe, partitions,
consumer groups).

Every failure ends as one line on stderr and a non-zero exit; ``tidelog --debug COMMAND`` (or
``TIDELOG_DEBUG=1``) shows the traceback instead, for a bug report.
"""

from __future__ import annotations

import os
import sys

import click

from tidelog import __version__
from tidelog.cli.acl import acl
from tidelog.cli.activity import activity
from tidelog.cli.append import append
from tidelog.cli.cluster import cluster
from tidelog.cli.cluster import register as register_cluster_commands
from tidelog.cli.common import DEBUG_ENV
from tidelog.cli.group_reset import reset_offsets
from tidelog.cli.groups import group
from tidelog.cli.partition import partition
from tidelog.cli.publish import publish
from tidelog.cli.reassign import broker, reassign
from tidelog.cli.reshape import add_partitions, alter, rebalance
from tidelog.cli.serve import serve
from tidelog.cli.streams import stream
from tidelog.cli.subscribe import subscribe
from tidelog.cli.top import top
from tidelog.cli.users import user

INTERNAL_ERROR = 1


@click.group()
@click.version_option(__version__, prog_name="tidelog")
@click.option(
    "--debug",
    is_flag=True,
    envvar=DEBUG_ENV,
    help=f"Show the traceback of a failure instead of one line (also ${DEBUG_ENV}=1).",
)
def cli(debug: bool) -> None:
    """tidelog: a durable, replicated log for NATS."""


cli.add_command(serve)
stream.add_command(add_partitions)
stream.add_command(alter)
cli.add_command(stream)
cli.add_command(publish)
cli.add_command(append)
cli.add_command(subscribe)
partition.add_command(reassign)
cli.add_command(partition)
cli.add_command(broker)
cli.add_command(activity)
cli.add_command(top)
cli.add_command(acl)
cli.add_command(user)
group.add_command(reset_offsets)
cli.add_command(group)
cluster.add_command(rebalance)
register_cluster_commands(cli)


def main() -> None:
    try:
        code = cli.main(prog_name="tidelog", standalone_mode=False)
    except click.UsageError as exc:  # one line: what was wrong, what is allowed, where the help is
        command = exc.ctx.command_path if exc.ctx is not None else "tidelog"
        click.echo(f"Error: {exc.format_message()} (see {command} --help)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except Exception as exc:  # a bug, or a failure no command turned into its own message
        if "--debug" in sys.argv[1:] or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        lines = str(exc).splitlines()
        detail = f": {lines[0]}" if lines else ""
        click.echo(f"Error: {type(exc).__name__}{detail} (tidelog --debug shows the traceback)", err=True)
        sys.exit(INTERNAL_ERROR)
    sys.exit(code if isinstance(code, int) else 0)
