"""The process log: one line per event on stderr, styled for where it goes.

Under journald (``$JOURNAL_STREAM``) each line starts with a syslog priority (``<4>``) so
``journalctl -p warning`` filters it; without a terminal there is no ANSI.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TextIO

_GROUPS = frozenset({"agent", "config", "host", "observe", "vocab"})
"""Packages that only group modules: a log line names the module (``daemon``, ``turn``)."""

# Chatty libraries log every HTTP request at INFO: one line per event means ours, not theirs.
_QUIET_LOGGERS = (
    "httpx",
    "httpx2",
    "httpcore",
    "httpcore2",
    "hpack",
    "google_genai",
    "anthropic",
    "openai",
)
_SYSLOG_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}
_COLORS = {
    logging.DEBUG: "2",
    logging.INFO: "36",
    logging.WARNING: "33",
    logging.ERROR: "31",
    logging.CRITICAL: "1;31",
}


class LineFormatter(logging.Formatter):
    """One event, one line: a traceback is folded into the line (`` | `` between its lines).

    Args:
        style: ``journal`` (syslog priority prefix, no timestamp: journald adds its own), ``tty``
            (time and a coloured level) or ``plain`` (ISO time, no ANSI).
    """

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line in this formatter's style."""
        text = record.getMessage()
        if record.exc_info:
            text = f"{text} | {self.formatException(record.exc_info)}"
        text = " | ".join(part.strip() for part in text.splitlines() if part.strip())
        name = record.name.removeprefix("kesoku.")
        group, _, module = name.partition(".")
        if group in _GROUPS and module:
            name = module
        level = record.levelname.lower()
        if self.style == "journal":
            return f"<{_SYSLOG_PRIORITY.get(record.levelno, 6)}>{level} {name}: {text}"
        if self.style == "tty":
            stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
            color = _COLORS.get(record.levelno, "0")
            return f"\x1b[2m{stamp}\x1b[0m \x1b[{color}m{level:<7}\x1b[0m {name}: {text}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(record.created))
        return f"{stamp} {level} {name}: {text}"


def configure_logging(
    stream: TextIO | None = None, *, level: int = logging.INFO
) -> logging.Handler:
    """Send the log to ``stream`` (stderr), one line per event, styled for where it goes.

    Args:
        stream: The stream; ``sys.stderr`` when None.
        level: The lowest level shown.

    Returns:
        The installed handler (it replaces the root logger's handlers).
    """
    stream = sys.stderr if stream is None else stream
    if os.environ.get("JOURNAL_STREAM") and not stream.isatty():
        style = "journal"
    elif stream.isatty() and not os.environ.get("NO_COLOR"):
        style = "tty"
    else:
        style = "plain"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(LineFormatter(style))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return handler
