"""Render the example configuration file (``examples/tidelog.toml``) from :mod:`tidelog.broker.config` itself.

Like the reference (:mod:`tidelog.broker.config_doc`), the example is generated, so it names every key the broker
knows and no other: each key's description as comments, then the key commented out at its default value, so that
the file as shipped configures nothing and any line uncommented is a valid setting.
``python -m tidelog.broker.config_example > examples/tidelog.toml`` regenerates it and a test checks that the
committed file is current.
"""

from __future__ import annotations

import sys
import textwrap

from tidelog.broker.config import CONFIG_FILE_ENV, BrokerConfig, config_keys, describe_keys

HEADER = f"""\
# tidelog broker configuration: every setting, commented out at its default value.
#
# Generated from the broker's configuration schema (python -m tidelog.broker.config_example); the same
# descriptions are in docs/configuration.md. Uncomment a line to change a setting, then start the broker with
#     tidelog serve --config tidelog.toml        (or {CONFIG_FILE_ENV}=tidelog.toml tidelog serve)
# The file is flat (no tables). TIDELOG_<KEY> environment variables, then tidelog serve's flags, override it
# key by key. An unknown key or a bad value stops the broker before it starts, naming the key.
# Durations are milliseconds, sizes bytes; an empty string leaves an optional setting unset.
"""


def toml_value(value: object) -> str:
    """``value`` (a default of :class:`BrokerConfig`) as a TOML value that the loader parses back to it."""
    if value is None:
        return '""'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:_}" if value >= 10_000 else str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    text = str(value)
    if not text.isprintable() or '"' in text or "\\" in text:
        raise ValueError(f"default {text!r} needs escaping in TOML")  # no default does: keep the renderer simple
    return f'"{text}"'


def render() -> str:
    """The example file: each key's description as comments, then the key commented out at its default."""
    described = describe_keys()
    defaults = BrokerConfig()
    blocks = []
    for key in config_keys():
        comment = textwrap.fill(described[key], width=118, initial_indent="# ", subsequent_indent="# ")
        blocks.append(f"{comment}\n# {key} = {toml_value(getattr(defaults, key))}\n")
    return HEADER + "\n" + "\n".join(blocks)


if __name__ == "__main__":
    if sys.argv[1:]:
        sys.exit(f"usage: python -m tidelog.broker.config_example (no arguments); got {' '.join(sys.argv[1:])!r}")
    print(render(), end="")
