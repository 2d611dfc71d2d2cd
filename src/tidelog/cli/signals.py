"""Stopping a long-running command on SIGINT or SIGTERM: the first asks it to stop cleanly, a second exits now.

``tidelog serve`` and ``tidelog cluster dev`` run until interrupted. The first signal sets the event the command
waits on, so it stops what it started; a second one (an impatient operator) exits at once with status 130. With
``exit_within``, a stop that takes longer than that (a dependency that never answers, a stuck flush) ends the
process anyway with status 1, so a signal always ends it within a bounded time, whatever state it is in; the
child servers it started die with it (they are tied to it by ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable


def stop_on_signals(
    announce: Callable[[str], None],
    *,
    exiting: Callable[[str], None] | None = None,
    exit_within: float | None = None,
    overdue: Callable[[float], None] | None = None,
) -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM on the running loop, after ``announce(signal name)``; a second
    signal calls ``exiting(signal name)``, if given, then ``os._exit(130)``. With ``exit_within`` seconds, the
    first signal also arms a deadline: past it, ``overdue(exit_within)`` is called, if given, then ``os._exit(1)``."""
    stop = asyncio.Event()
    signals_seen = 0
    loop = asyncio.get_running_loop()

    def give_up() -> None:
        assert exit_within is not None
        if overdue is not None:
            overdue(exit_within)
        os._exit(1)

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        name = signal.Signals(signum).name
        if signals_seen > 1:
            if exiting is not None:
                exiting(name)
            os._exit(130)
        announce(name)
        stop.set()
        if exit_within is not None:  # a thread, so that even an event loop blocked in a call cannot hold it up
            timer = threading.Timer(exit_within, give_up)
            timer.daemon = True
            timer.start()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    return stop
