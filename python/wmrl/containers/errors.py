"""Errors a user can fix; each message is one line that says what to do."""

from __future__ import annotations


class ContainerError(RuntimeError):
    """Printed as ``error: <message>`` with exit code 2 by the command line."""


def one_line(text: object, limit: int = 300) -> str:
    """Collapse an engine message (often multi-line, with a Go error chain) to one short line."""
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[: limit - 3] + "..."
