"""What every client command shares: where the brokers are, running a coroutine, and one-line errors.

A command fails with one clear line on stderr and a non-zero exit (1 for a refused request, 2 for bad usage,
as click does), never with a traceback: the traceback is for ``tidelog --debug`` (or ``TIDELOG_DEBUG=1``).
Bad input is refused at the edge, by click types (:class:`BrokerAddresses`, :func:`stream_name`), before any
connection is opened; what only the broker can judge comes back as its error, named by its code.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import click

from tidelog.launch.endpoints import DEFAULT_DATA_DIR, ENDPOINTS_FILE, Endpoints, read_endpoints
from tidelog.metadata.namespace import DEFAULT_NAMESPACE, NAMESPACE_RULE, is_namespace
from tidelog.protocol.errors import TidelogError, UnavailableError
from tidelog.protocol.tls import TlsConfigError, TlsFiles, client_context

P = ParamSpec("P")
T = TypeVar("T")

BROKERS_ENV = "TIDELOG_BROKERS"
DEBUG_ENV = "TIDELOG_DEBUG"
DEFAULT_WIRE_PORT = 9293
DEFAULT_BROKERS = f"127.0.0.1:{DEFAULT_WIRE_PORT}"
OUTPUT_CHOICES = ("table", "json")
PROBE_TIMEOUT = 0.5  # seconds to wait for a gRPC server's greeting when a wire connection failed


class BrokerAddresses(click.ParamType[list[str]]):
    """Comma-separated ``HOST:PORT`` of brokers' wire protocol (``[::1]:9293`` for IPv6), as a list."""

    name = "HOST:PORT[,HOST:PORT...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[str]:
        if isinstance(value, list):
            return value
        addresses = [part.strip() for part in str(value).split(",") if part.strip()]
        if not addresses:
            self.fail("no broker given: expected HOST:PORT, e.g. 127.0.0.1:9293", param, ctx)
        for address in addresses:
            host, sep, port = address.rpartition(":")
            if not sep or not host.strip("[]") or not port.isdigit() or not 1 <= int(port) <= 65535:
                self.fail(
                    f"{address!r} is not HOST:PORT: expected a host and a port 1-65535, e.g. "
                    f"127.0.0.1:{DEFAULT_WIRE_PORT} (the broker's wire protocol port); several are comma-separated",
                    param,
                    ctx,
                )
        return addresses


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

output_option = click.option(
    "--output",
    "-o",
    type=click.Choice(OUTPUT_CHOICES),
    default="table",
    show_default=True,
    help="A table for people, or JSON (one document) for scripts.",
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


NAMESPACE_ENV = "TIDELOG_NAMESPACE"


def _namespace(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not is_namespace(value):
        raise click.BadParameter(f"{value!r}: a namespace is {NAMESPACE_RULE}", ctx, param)
    return value


def _default_namespace() -> str:
    if os.environ.get(NAMESPACE_ENV):
        return os.environ[NAMESPACE_ENV]
    found = local_broker()
    return found.namespace if found is not None and found.namespace else DEFAULT_NAMESPACE


namespace_option = click.option(
    "--namespace",
    default=_default_namespace,
    show_default=f"${NAMESPACE_ENV}, else that of the broker on <data-dir>, else {DEFAULT_NAMESPACE}",
    callback=_namespace,
    help="The cluster's namespace (the brokers' namespace setting): its etcd keys are under /NAMESPACE/.",
)


def local_etcd_endpoints() -> str:
    """The etcd endpoints of the broker running on ``--data-dir``, comma-separated; empty if none runs there."""
    found = local_broker()
    return ",".join(found.etcd) if found is not None else ""


TLS_OPTIONS = {
    "tls_ca": "TIDELOG_CLIENT_TLS_CA",
    "tls_cert": "TIDELOG_CLIENT_TLS_CERT",
    "tls_key": "TIDELOG_CLIENT_TLS_KEY",
}
"""The client's TLS options and their environment variables (not broker settings: the broker ignores them)."""


def _remember_tls(ctx: click.Context, param: click.Parameter, value: Path | str | None) -> None:
    assert param.name is not None
    ctx.meta[param.name] = value


def _tls_option(name: str, help_: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    return click.option(
        f"--{name.replace('_', '-')}",
        name,
        type=click.Path(path_type=Path, dir_okay=False),
        envvar=TLS_OPTIONS[name],
        show_envvar=True,
        expose_value=False,
        callback=_remember_tls,
        help=help_,
    )


def client_tls() -> ssl.SSLContext | None:
    """The TLS context the command's ``--tls-*`` options ask for (None: plaintext). Files that cannot be used
    are a usage error naming the option."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    ca, cert, key = (meta.get(name) for name in TLS_OPTIONS)
    if ca is None and cert is None and key is None:
        return None
    if (cert is None) != (key is None):
        raise click.BadParameter("--tls-cert and --tls-key go together", param_hint="--tls-cert/--tls-key")
    try:
        return client_context(TlsFiles(ca=ca, cert=cert, key=key))
    except TlsConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--tls-ca/--tls-cert/--tls-key") from None


LOGIN_OPTIONS = {
    "user": "TIDELOG_CLIENT_USER",
    "password": "TIDELOG_CLIENT_PASSWORD",
    "password_file": "TIDELOG_CLIENT_PASSWORD_FILE",
}
"""The client's password login options and their environment variables (read by the commands, not the broker)."""


def _login_option(name: str, help_: str, **kwargs: Any) -> Callable[[Callable[P, T]], Callable[P, T]]:
    return click.option(
        f"--{name.replace('_', '-')}",
        name,
        envvar=LOGIN_OPTIONS[name],
        show_envvar=True,
        expose_value=False,
        callback=_remember_tls,
        help=help_,
        **kwargs,
    )


def client_credentials() -> tuple[str, str] | None:
    """The (user, password) the command's ``--user`` options ask to log in with (None: no login, the client is
    its certificate or anonymous). The password comes from ``--password-file``, else ``--password`` (or their
    environment variables), else a hidden prompt when standard input is a terminal. Logins go only over TLS."""
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    if "login" not in meta:  # asked once per command, however many clients it opens
        meta["login"] = _login(meta)
    found: tuple[str, str] | None = meta["login"]
    return found


def _login(meta: dict[str, Any]) -> tuple[str, str] | None:
    user: str | None = meta.get("user")
    password: str | None = meta.get("password")
    password_file: Path | None = meta.get("password_file")
    if user is None:
        if password is not None or password_file is not None:
            raise click.BadParameter("a password needs --user (or $TIDELOG_CLIENT_USER)", param_hint="--user")
        return None
    if not user:
        raise click.BadParameter("the user name is empty", param_hint="--user")
    if password is not None and password_file is not None:
        raise click.BadParameter("give one of --password and --password-file", param_hint="--password")
    if not any(meta.get(name) is not None for name in TLS_OPTIONS):
        raise click.BadParameter(
            "a password login needs TLS (--tls-ca): brokers refuse logins on connections without it",
            param_hint="--user",
        )
    if password_file is not None:
        try:
            lines = password_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(f"cannot read {password_file}: {exc}", param_hint="--password-file") from None
        if not lines or not lines[0]:
            raise click.BadParameter(
                f"{password_file} is empty: its first line is the password", param_hint="--password-file"
            )
        password = lines[0]
    elif password is None:
        if not sys.stdin.isatty():
            raise click.BadParameter(
                f"no password for user {user!r}: give --password-file FILE, or $TIDELOG_CLIENT_PASSWORD, or run "
                "from a terminal to be asked",
                param_hint="--user",
            )
        password = str(click.prompt(f"password for {user}", hide_input=True, err=True))
    return user, password


def login_options(command: Callable[P, T]) -> Callable[P, T]:
    """``--user``, ``--password`` and ``--password-file`` (read them with :func:`client_credentials`)."""
    command = _login_option(
        "password_file",
        "Read the --user password from the first line of this file (kept out of shell history and ps).",
        type=click.Path(path_type=Path, dir_okay=False),
    )(command)
    command = _login_option(
        "password",
        "The --user password. On the command line it is seen by ps and kept in shell history: prefer "
        "--password-file, the environment variable, or the prompt (asked when neither is given).",
    )(command)
    return _login_option(
        "user", "Log in as this user (SCRAM-SHA-256, over TLS only), for clients without a certificate."
    )(command)


def tls_options(command: Callable[P, T]) -> Callable[P, T]:
    """``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (read them with :func:`client_tls`), and the password login
    options (:func:`login_options`)."""
    command = login_options(command)
    command = _tls_option("tls_key", "Private key of --tls-cert.")(command)
    command = _tls_option("tls_cert", "Client certificate (PEM) for brokers that require one.")(command)
    return _tls_option(
        "tls_ca", "Connect with TLS, verifying the brokers against this CA (PEM). Implied by --tls-cert."
    )(command)


def brokers_option(command: Callable[P, T]) -> Callable[P, T]:
    """``--brokers``: the flag, else ``$TIDELOG_BROKERS``, else the local broker's wire address, else the default;
    and ``--tls-ca``/``--tls-cert``/``--tls-key`` for brokers that speak TLS (:func:`client_tls`)."""
    command = tls_options(command)
    with_brokers = click.option(
        "--brokers",
        "-b",
        type=BrokerAddresses(),
        default=_default_brokers,
        show_default=f"${BROKERS_ENV}, else the wire address in <data-dir>/{ENDPOINTS_FILE}, else {DEFAULT_BROKERS}",
        help=f"Comma-separated HOST:PORT of brokers' wire protocol (port {DEFAULT_WIRE_PORT} by default, not the "
        "gRPC port).",
    )(command)
    return data_dir_option(with_brokers)


wide_option = click.option("--wide", is_flag=True, help="Show full broker ids and every column, however wide.")


def stream_name(ctx: click.Context | None, param: click.Parameter | None, value: str) -> str:
    """A stream name argument: not empty, no whitespace (the broker checks the rest and names it)."""
    if not value:
        raise click.BadParameter("a stream name cannot be empty", ctx, param)
    if any(c.isspace() for c in value):
        raise click.BadParameter(f"{value!r}: a stream name cannot contain whitespace", ctx, param)
    return value


def bootstrap(brokers: str | Sequence[str]) -> list[str]:
    if isinstance(brokers, str):
        return [b.strip() for b in brokers.split(",") if b.strip()]
    return list(brokers)


def debugging() -> bool:
    """Whether ``tidelog --debug`` (or ``TIDELOG_DEBUG=1``) asked for tracebacks."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.find_root().params.get("debug"):
        return True
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def run(coro: Coroutine[Any, Any, T], brokers: Sequence[str] = ()) -> T:
    """Run a client coroutine, turning failures into one-line errors (``brokers``: to explain a failed
    connection, such as one to a broker's gRPC port)."""
    if debugging():
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        try:
            return asyncio.run(coro)
        except KeyboardInterrupt:
            raise SystemExit(130) from None
    # The client's own log lines (a warning per failed batch) would repeat the one-line error below.
    logging.getLogger("tidelog").addHandler(logging.NullHandler())
    try:
        return asyncio.run(coro)
    except UnavailableError as exc:
        raise click.ClickException(_unreachable(f"unavailable: {exc.message}", brokers)) from None
    except TidelogError as exc:
        raise click.ClickException(f"{exc.code.name.lower().replace('_', ' ')}: {exc.message}") from None
    except TimeoutError:  # before OSError, its base class
        raise click.ClickException("the broker did not answer in time") from None
    except OSError as exc:
        raise click.ClickException(_unreachable(f"cannot reach the broker: {exc}", brokers)) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


def _unreachable(message: str, brokers: Sequence[str]) -> str:
    for address in brokers:
        if speaks_http2(address):
            return (
                f"{address} is a broker's gRPC port (the Liftbridge API), not its wire protocol port: tidelog "
                f"commands use the wire port, {DEFAULT_WIRE_PORT} by default (serve --wire-port)"
            )
    return message


def speaks_http2(address: str) -> bool:
    """Whether the server at ``address`` greets a new connection with an HTTP/2 SETTINGS frame, as a gRPC server
    does (a tidelog wire port waits for the client to speak first)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT) as sock:
            sock.settimeout(PROBE_TIMEOUT)
            greeting = sock.recv(9)
    except (OSError, ValueError):
        return False
    return len(greeting) >= 4 and greeting[3] == 0x04  # frame type 4: SETTINGS


def async_command(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """Let a click command be ``async def``."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        brokers = kwargs.get("brokers")
        return run(func(*args, **kwargs), bootstrap(brokers) if isinstance(brokers, str | list) else ())

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
