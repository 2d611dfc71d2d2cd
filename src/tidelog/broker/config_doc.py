"""Render the configuration reference (``docs/configuration.md``) from :mod:`tidelog.broker.config` itself.

The reference is generated, not written by hand, so it can never list a key the broker does not know or miss one
it does: ``python -m tidelog.broker.config_doc > docs/configuration.md`` regenerates it and a test checks that the
committed file is current. The example configuration file is generated the same way, every key commented out at
its default: ``python -m tidelog.broker.config_doc --toml > examples/tidelog.toml``.
"""

from __future__ import annotations

import sys
import textwrap

from tidelog.broker.config import CONFIG_FILE_ENV, ENV_PREFIX, BrokerConfig, config_keys, describe_keys

HEADER = f"""# Configuration reference

A broker reads its settings from four layers; later layers win, key by key:

1. the defaults below;
2. a flat TOML file given with `--config` (or `{CONFIG_FILE_ENV}`), e.g. `port = 9400`;
3. environment variables `{ENV_PREFIX}<KEY>` (upper case), e.g. `{ENV_PREFIX}PORT=9400`; lists are comma-separated;
4. command-line flags of `tidelog serve` (`--port 9400`).

An unknown key in the file or an unknown `{ENV_PREFIX}*` variable is refused with its name (the client commands'
`TIDELOG_BROKERS` is the one exception). Durations are milliseconds, sizes bytes. What the flush and ack settings
survive is in [durability.md](durability.md).

| key | environment variable | meaning |
|---|---|---|
"""


def render() -> str:
    described = describe_keys()
    rows = [f"| `{key}` | `{ENV_PREFIX}{key.upper()}` | {described[key]} |" for key in config_keys()]
    return HEADER + "\n".join(rows) + "\n"


TOML_HEADER = f"""\
# tidelog broker configuration: every setting, commented out at its default value.
#
# Generated from the broker's configuration schema (python -m tidelog.broker.config_doc --toml); the same text is
# in docs/configuration.md. Uncomment a line to change a setting, then start the broker with
#     tidelog serve --config tidelog.toml        (or {CONFIG_FILE_ENV}=tidelog.toml tidelog serve)
# The file is flat (no tables). {ENV_PREFIX}<KEY> environment variables, then tidelog serve's flags, override it
# key by key. An unknown key or a bad value stops the broker before it starts, naming the key.
# Durations are milliseconds, sizes bytes; an empty string leaves an optional setting unset.
"""


def _toml_value(value: object) -> str:
    """``value`` (a default of :class:`BrokerConfig`) as a TOML value that the loader parses back to it."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:_}" if value >= 10_000 else str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    text = str(value)
    if not text.isprintable() or '"' in text or "\\" in text:
        raise ValueError(f"default {text!r} needs escaping in TOML")  # no default does: keep the renderer simple
    return f'"{text}"'


def render_toml() -> str:
    """The example ``tidelog.toml``: each key's description as comments, then the key commented out at its default."""
    described = describe_keys()
    defaults = BrokerConfig()
    blocks = []
    for key in config_keys():
        comment = textwrap.fill(described[key], width=118, initial_indent="# ", subsequent_indent="# ")
        blocks.append(f"{comment}\n# {key} = {_toml_value(getattr(defaults, key))}\n")
    return TOML_HEADER + "\n" + "\n".join(blocks)


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--toml"]):
        sys.exit(f"usage: python -m tidelog.broker.config_doc [--toml]; got {' '.join(sys.argv[1:])!r}")
    print(render_toml() if sys.argv[1:] else render(), end="")
