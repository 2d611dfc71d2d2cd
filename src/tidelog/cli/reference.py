"""The CLI reference, ``docs/cli.md``, generated from the click commands themselves.

``python -m tidelog.cli.reference > docs/cli.md`` regenerates it; a test checks the committed file is current,
so a command's help and its reference never disagree. Each command's section is its ``--help`` exactly as a
terminal of :data:`WIDTH` columns shows it, without the environment's influence (defaults read from
``TIDELOG_*`` variables are shown by name, not by value).
"""

from __future__ import annotations

from collections.abc import Iterator

import click

from tidelog.cli.main import cli

WIDTH = 100

HEADER = """# CLI reference

Every `tidelog` command with its options, as `tidelog COMMAND --help` prints them. Generated from the commands:
regenerate with `python -m tidelog.cli.reference > docs/cli.md` (a test checks it is current).

Client commands find the brokers through `--brokers` (or `TIDELOG_BROKERS`): the brokers' **wire protocol**
port, 9293 by default, not the gRPC port 9292 that Liftbridge clients use. Every error is one line on stderr
with a non-zero exit status (2: bad usage, 1: refused or failed, 3: an append's expectation failed);
`tidelog --debug COMMAND` shows the traceback instead. Listing commands take `--output json` for scripts.
Broker settings are in [configuration.md](configuration.md).
"""


def commands(group: click.Group = cli, path: tuple[str, ...] = ("tidelog",)) -> Iterator[tuple[str, click.Command]]:
    """Every command under ``group`` with its full name (``"tidelog stream create"``), groups first, by name."""
    yield " ".join(path), group
    ctx = click.Context(group, info_name=path[-1])
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def help_text(path: str, command: click.Command) -> str:
    """``path --help`` as a terminal of :data:`WIDTH` columns prints it."""
    names = path.split()
    parent: click.Context | None = None
    group: click.Command = cli
    for depth, name in enumerate(names[1:]):  # the groups above the command, for its usage line
        parent = click.Context(group, info_name=names[depth], parent=parent)
        found = group.get_command(parent, name) if isinstance(group, click.Group) else None
        assert found is not None, path
        group = found
    ctx = click.Context(command, info_name=names[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH)
    return command.get_help(ctx)


def render() -> str:
    sections = [HEADER]
    for path, command in commands():
        sections.append(f"## `{path}`\n\n```text\n{help_text(path, command)}\n```\n")
    return "\n".join(sections)


if __name__ == "__main__":
    print(render(), end="")
