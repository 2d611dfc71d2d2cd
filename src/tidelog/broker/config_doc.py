"""Render the configuration reference (``docs/configuration.md``) from :mod:`tidelog.broker.config` itself.

The reference is generated, not written by hand, so it can never list a key the broker does not know or miss one
it does: ``python -m tidelog.broker.config_doc > docs/configuration.md`` regenerates it and a test checks that the
committed file is current.
"""

from __future__ import annotations

from tidelog.broker.config import CONFIG_FILE_ENV, config_keys, describe_keys
from tidelog.broker.config_values import ENV_PREFIX

HEADER = f"""# Configuration reference

A broker reads its settings from four layers; later layers win, key by key:

1. the defaults below;
2. a flat TOML file given with `--config` (or `{CONFIG_FILE_ENV}`), e.g. `port = 9400`;
3. environment variables `{ENV_PREFIX}<KEY>` (upper case), e.g. `{ENV_PREFIX}PORT=9400`; lists are comma-separated;
4. `tidelog serve -s KEY=VALUE` (any key, repeatable), then its own flags (`--port 9400`).

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


if __name__ == "__main__":
    print(render(), end="")
