"""A child server process that is started on readiness and stopped by PID, for tests and for ``tidelog serve``.

:class:`ManagedProcess` owns one child at a time (it can be restarted). Its lifecycle:

- ``start(ready)`` spawns the child with stdout and stderr appended to a log file, then polls the readiness probe
  until it passes or the deadline expires. If the child exits first, the wait ends at once. Either failure stops
  the child and raises :class:`ProcessStartError` carrying the tail of the log, so a test failure shows why the
  server refused to come up instead of a bare timeout.
- ``stop()`` sends SIGTERM to the child's PID, waits up to a timeout, then sends SIGKILL. It is idempotent and safe
  to call concurrently; it never signals a PID that this object has already reaped (no PID-reuse accidents).

Children never outlive the parent:

- a module ``atexit`` hook terminates every child still running when the interpreter exits;
- a finalizer terminates the child of a :class:`ManagedProcess` that is garbage-collected while running (and
  warns with ``ResourceWarning``, as :class:`subprocess.Popen` does);
- on Linux the child asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``), which covers a
  parent killed by SIGKILL, where no Python code runs. The signal is armed before the child is reported
  started, and a child whose parent died before it was armed exits instead of running (:data:`_CHECK_PARENT`).
  The kernel ties this to the *thread* that spawned the child, so start children from a long-lived thread (the
  event loop's), never from a short-lived worker.

Children run in their own session, so a Ctrl-C in the terminal reaches only the parent: ``tidelog serve`` then
stops the broker before the NATS and etcd it depends on, instead of losing them at the same instant.

Waiting for an exit uses a pidfd registered with the event loop where the platform has one, so ``stop()`` returns
the moment the child is gone; elsewhere it polls with a short back-off. Deadlines bound waits on real OS
processes, so they use the event loop's monotonic clock rather than an injected one.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import enum
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from tidelog.launch.probes import ReadinessProbe

__all__ = [
    "ManagedProcess",
    "ProcessStartError",
    "ProcessState",
    "pid_alive",
    "wait_pid_exit",
]

_KILL_WAIT = 5.0  # after SIGKILL: only a process stuck in the kernel takes longer
_ORPHAN_GRACE = 1.0  # SIGTERM grace for children found at exit or garbage collection
_POLL_FIRST, _POLL_MAX = 0.01, 0.25  # readiness poll back-off, seconds
_PR_SET_PDEATHSIG = 1


class ProcessState(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"  # stopped by stop(), or after a failed start
    EXITED = "exited"  # ended on its own after start() returned


class ProcessStartError(RuntimeError):
    """The child could not be executed, exited during start-up, or was not ready before the deadline."""

    def __init__(self, name: str, reason: str, *, log_path: Path, log_tail: str, returncode: int | None) -> None:
        self.name = name
        self.reason = reason
        self.log_path = log_path
        self.log_tail = log_tail
        self.returncode = returncode
        tail = log_tail.rstrip() or "(empty)"
        super().__init__(f"{name}: {reason}\n--- last lines of {log_path} ---\n{tail}")


# ---- children that must not outlive us ----

_live: dict[int, subprocess.Popen[bytes]] = {}  # pid -> child still owned by some ManagedProcess


def _terminate(children: Sequence[subprocess.Popen[bytes]], grace: float) -> None:
    """SIGTERM all, wait for all within one shared grace period, SIGKILL the rest. Blocking: exit paths only."""
    for child in children:
        child.send_signal(signal.SIGTERM)  # no-op once reaped, so a recycled PID is never hit
    deadline = time.monotonic() + grace
    for child in children:
        try:
            child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=_KILL_WAIT)
        _live.pop(child.pid, None)


@atexit.register
def _terminate_all_at_exit() -> None:
    _terminate(list(_live.values()), _ORPHAN_GRACE)


def _finalize_orphan(name: str, child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        warnings.warn(
            f"{name} (pid {child.pid}) was still running when its ManagedProcess was garbage-collected",
            ResourceWarning,
            stacklevel=1,
        )
        _terminate([child], _ORPHAN_GRACE)
    _live.pop(child.pid, None)


def _load_prctl() -> Callable[[int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[[int, int], int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


_ARMED_WITHIN = 10.0  # seconds a child may take from fork to its armed death signal (sh starts in a few ms)
_PRCTL = _load_prctl()  # loaded in the parent, so the child does nothing but one call between fork and exec


_SETPRIV = shutil.which("setpriv")
"""util-linux's ``setpriv --pdeathsig`` sets the parent-death signal in the child without running Python
between fork and exec. A ``preexec_fn`` does run Python there, and in a process whose gRPC threads are busy the
forked child can crash (SIGSEGV) before it ever execs: seen as a nats-server or etcd that died at start-up with
status -11 next to "Other threads are currently calling into gRPC, skipping fork() handlers"."""

_SH = shutil.which("sh") or "/bin/sh"

_ARMED = b"!"
_CHECK_PARENT = f'test "$PPID" = "$1" || exit 1; printf {_ARMED.decode()} >&0; exec 0</dev/null; shift; exec "$@"'
"""Run by ``sh`` after ``setpriv`` armed the death signal, before the command: the signal is armed against
whichever process is the parent at that moment, so a parent that died before it (the child was already
reinherited) means the child must not run at all. Then it tells the parent that the signal is armed, on the
pipe its stdin holds for that moment, and gives the command ``/dev/null`` as stdin, as without it."""


def _spawn_argv(argv: Sequence[str], die_with_parent: bool) -> tuple[list[str], Callable[[], None] | None, bool]:
    """The command to run, the preexec hook to run it with (see :data:`_SETPRIV`), and whether the child says on
    its stdin when its death signal is armed (:data:`_CHECK_PARENT`)."""
    if not die_with_parent:
        return list(argv), None, False
    if _SETPRIV is not None:
        check = [_SH, "-c", _CHECK_PARENT, "tidelog-launch", str(os.getpid())]
        return [_SETPRIV, "--pdeathsig", "KILL", "--", *check, *argv], None, True
    return list(argv), _die_with_parent_hook(), False


def _await_armed(read_end: int, within: float) -> None:
    """Wait until the child says its death signal is armed, or is gone (end of file) before it could."""
    with contextlib.closing(os.fdopen(read_end, "rb", buffering=0)) as pipe:
        readable, _, _ = select.select([pipe], [], [], within)
        if readable:
            pipe.read(len(_ARMED))


def _die_with_parent_hook() -> Callable[[], None] | None:
    if _PRCTL is None:
        return None
    prctl, parent, sigkill = _PRCTL, os.getpid(), int(signal.SIGKILL)

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return hook


# ---- the managed process ----


class ManagedProcess:
    """One child server process: spawn, wait for readiness, stop by PID. Restartable after ``stop()``."""

    def __init__(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        log_path: Path,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        """``env`` replaces the whole environment when given (``None`` inherits ours); ``log_path`` is appended
        to, so the output of earlier runs stays next to the current one."""
        if not argv:
            raise ValueError("argv must name a program")
        self.argv: tuple[str, ...] = tuple(os.fspath(arg) for arg in argv)
        self.name = name or Path(self.argv[0]).name
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self._child: subprocess.Popen[bytes] | None = None
        self._state = ProcessState.NEW
        self._log_start = 0  # where the current run's output begins in the log file
        self._finalizer: weakref.finalize[[str, subprocess.Popen[bytes]], ManagedProcess] | None = None

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid} state={self.state.value}>"

    @property
    def pid(self) -> int | None:
        """PID of the current or last child; ``None`` before the first start."""
        return self._child.pid if self._child is not None else None

    @property
    def returncode(self) -> int | None:
        """Exit status of the last child (negative: killed by that signal); ``None`` while it runs."""
        return self._child.poll() if self._child is not None else None

    @property
    def state(self) -> ProcessState:
        if self._state is ProcessState.RUNNING and self.returncode is not None:
            return ProcessState.EXITED
        return self._state

    @property
    def running(self) -> bool:
        """The child has been spawned and has not exited (it may still be starting or stopping)."""
        return self._child is not None and self._child.poll() is None

    # ---- start ----

    async def start(self, ready: ReadinessProbe | None = None, *, ready_within: float = 10.0) -> None:
        """Spawn the child and return once ``ready`` passes, within ``ready_within`` seconds of the spawn.

        Without a probe, return once the child is spawned. On failure the child is stopped before
        :class:`ProcessStartError` is raised, so a failed start leaves nothing running.
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._state = ProcessState.STARTING
        child = self._spawn()
        try:
            reason = await _await_ready(child, ready, ready_within)
        except BaseException:  # cancelled or a probe bug: the child must not be left behind
            self._kill_now(child)
            raise
        if reason is None:
            self._state = ProcessState.RUNNING
            return
        await self.stop()
        raise ProcessStartError(
            self.name, reason, log_path=self.log_path, log_tail=self.log_tail(), returncode=child.returncode
        )

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"===== {stamp} tidelog starting: {shlex.join(self.argv)}\n".encode())
            log.flush()
            self._log_start = log.tell()
            argv, preexec, says_armed = _spawn_argv(self.argv, self.die_with_parent)
            read_end, write_end = os.pipe() if says_armed else (None, None)
            try:
                child = self._popen(argv, preexec, log, subprocess.DEVNULL if write_end is None else write_end)
            except BaseException:
                if read_end is not None:
                    os.close(read_end)
                raise
            finally:
                if write_end is not None:
                    os.close(write_end)
        if read_end is not None:  # not started before its death signal is armed: a parent killed now takes it along
            _await_armed(read_end, _ARMED_WITHIN)
        self._child = child
        _live[child.pid] = child
        self._finalizer = weakref.finalize(self, _finalize_orphan, self.name, child)
        self._finalizer.atexit = False  # the module's atexit hook stops every child at once, in one grace period
        return child

    def _popen(
        self, argv: list[str], preexec: Callable[[], None] | None, log: BinaryIO, stdin: int
    ) -> subprocess.Popen[bytes]:
        try:
            if shutil.which(self.argv[0]) is None:  # through setpriv a missing program would only exit 127
                raise FileNotFoundError(f"no executable {self.argv[0]!r}")
            return subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            self._state = ProcessState.STOPPED
            raise ProcessStartError(
                self.name,
                f"cannot execute {self.argv[0]}: {exc}",
                log_path=self.log_path,
                log_tail=self.log_tail(),
                returncode=None,
            ) from exc

    # ---- stop ----

    async def stop(self, *, grace: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Returns the exit status (``None``: never started)."""
        child = self._child
        if child is None:
            return None
        if child.poll() is None:
            self._state = ProcessState.STOPPING
            child.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(_wait_exit(child), grace)
            except TimeoutError:
                child.kill()
                await asyncio.wait_for(_wait_exit(child), _KILL_WAIT)
        self._forget(child)
        return child.returncode

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the running child (SIGSTOP and SIGCONT for fault tests). Only a child that has not
        been reaped: its PID cannot have been reused (an exited, unreaped child keeps it as a zombie), so the
        signal reaches our process or nothing."""
        child = self._child
        if child is None or child.returncode is not None:
            raise RuntimeError(f"{self.name} is not running")
        os.kill(child.pid, signum)

    async def kill(self) -> int | None:
        """SIGKILL (a crash: no shutdown of any kind), wait for the exit and forget the child."""
        child = self._child
        if child is None:
            return None
        if child.poll() is None:
            child.kill()
            await asyncio.wait_for(_wait_exit(child), _KILL_WAIT)
        self._forget(child)
        return child.returncode

    def stop_sync(self, *, grace: float = 10.0) -> int | None:
        """:meth:`stop` for code without an event loop (synchronous fixtures, exit hooks). Blocks the caller."""
        child = self._child
        if child is None:
            return None
        if child.poll() is None:
            self._state = ProcessState.STOPPING
            _terminate([child], grace)
        self._forget(child)
        return child.returncode

    def _kill_now(self, child: subprocess.Popen[bytes]) -> None:
        child.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=_KILL_WAIT)
        self._forget(child)

    def _forget(self, child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            return  # still alive (stuck in the kernel): stay registered so the exit hook tries again
        _live.pop(child.pid, None)
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._state = ProcessState.STOPPED

    async def wait(self) -> int:
        """Wait for the child to exit by itself (no signal sent); bound it with ``asyncio.timeout``."""
        if self._child is None:
            raise RuntimeError(f"{self.name} was never started")
        return await _wait_exit(self._child)

    # ---- log ----

    def log_tail(self, max_lines: int = 40, max_bytes: int = 16384) -> str:
        """The last lines the current (or last) run wrote: what a start-up failure report shows.

        Earlier runs' output stays in the file but is left out here, so it cannot be mistaken for this run's.
        """
        try:
            with self.log_path.open("rb") as log:
                log.seek(0, os.SEEK_END)
                log.seek(max(self._log_start, log.tell() - max_bytes))
                data = log.read()
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-max_lines:])

    async def __aenter__(self) -> ManagedProcess:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def _await_ready(child: subprocess.Popen[bytes], ready: ReadinessProbe | None, ready_within: float) -> str | None:
    """``None`` once ready, else why not. Polls the probe with back-off; a child exit ends the wait at once."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ready_within
    exited = asyncio.ensure_future(_wait_exit(child))
    try:
        delay = _POLL_FIRST
        while True:
            if exited.done():
                return f"exited with status {child.returncode} before it was ready"
            remaining = deadline - loop.time()
            if remaining <= 0:
                return f"not ready after {ready_within:g}s"
            if ready is None or await _probe_once(ready, remaining):
                return None
            await asyncio.wait({exited}, timeout=min(delay, max(0.0, deadline - loop.time())))
            delay = min(delay * 2, _POLL_MAX)
    finally:
        exited.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await exited


async def _probe_once(ready: ReadinessProbe, remaining: float) -> bool:
    """One probe attempt, bounded by what is left of the deadline; connection failures mean "not yet"."""
    try:
        return await asyncio.wait_for(ready(), remaining)
    except (OSError, TimeoutError):
        return False


async def _wait_exit(child: subprocess.Popen[bytes]) -> int:
    """Wait until our ``child`` exits and reap it, without blocking the event loop."""
    status = child.poll()
    if status is not None:
        return status
    if not await _await_pidfd(child.pid):
        return await _poll_until(child.poll)
    return child.wait()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited; a zombie (exited, not yet reaped) counts as exited,
    since a child whose parent died may wait a while for ``init`` to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return False  # gone between the two checks
    except OSError:
        return True  # no /proc: a zombie cannot be told apart
    state = stat.rsplit(")", 1)[-1].split()[:1]  # the command name in parentheses may contain anything
    return state not in (["Z"], ["X"])


async def wait_pid_exit(pid: int) -> None:
    """Return once process ``pid`` has exited, whoever its parent is; bound it with ``asyncio.timeout``.

    For asserting that a server (or a grandchild) is really gone. Only meaningful for a PID seen alive recently:
    after a process is reaped its PID may be reused, and the newcomer would be waited on instead.
    """
    if not await _await_pidfd(pid):
        await _poll_until(lambda: None if pid_alive(pid) else 0)


async def _await_pidfd(pid: int) -> bool:
    """Wait for ``pid`` to exit through a pidfd (readable once the process has exited, reaped or not).

    ``False`` if the platform or event loop cannot do that, so the caller polls instead.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already reaped
    except (AttributeError, OSError):
        return False
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    try:
        loop.add_reader(pidfd, _resolve, gone)
    except (NotImplementedError, OSError):
        os.close(pidfd)
        return False
    try:
        await gone
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _poll_until(status: Callable[[], int | None]) -> int:
    """Poll ``status`` with a short back-off until it gives a value: the fallback where pidfds do not exist."""
    delay = _POLL_FIRST / 2
    while (value := status()) is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)
    return value
