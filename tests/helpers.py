"""Small helpers shared by test modules of several packages (harnesses that are real code live in
:mod:`tidelog.testing`)."""

from __future__ import annotations

BOUND = 20.0
"""Seconds any single wait in a test may take: an upper bound that fails a stuck test, never one that paces it."""

LONG_BOUND = 60.0
""":data:`BOUND` for waits on whole processes or clusters starting (several processes on a loaded machine)."""
