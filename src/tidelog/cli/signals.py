"""Stopping a long-running command on SIGINT or SIGTERM: the first asks it to stop cleanly, a second exits now.

``tidelog serve`` and ``tidelog cluster dev`` run until interrupted. The first signal sets the event the command
waits on, so it stops what it started; a second one (an impatient operator) exits at once with status 130.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable


def stop_on_signals(announce: Callable[[str], None], *, exiting: Callable[[str], None] | None = None) -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM on the running loop, after ``announce(signal name)``; a second
    signal calls ``exiting(signal name)``, if given, then ``os._exit(130)``."""
    stop = asyncio.Event()
    signals_seen = 0

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

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    return stop
