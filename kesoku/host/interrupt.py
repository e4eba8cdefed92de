"""A Ctrl-C that Python could not raise, kept until the command can act on it.

Python runs a SIGINT's handler between bytecodes, wherever the main thread is. When that is inside
a callback whose exceptions Python only reports (a weakref callback of the import system's module
locks, hit while a command is still importing), the ``KeyboardInterrupt`` is printed as "Exception
ignored" and lost: a chat Ctrl-C'd at that instant went on to ask its question. :func:`install`
puts a handler that also records the signal, and ``kesoku chat`` asks :func:`restore` where it
takes SIGINT over (before ``trio.run``, before the client's wake-up descriptor).
"""

from __future__ import annotations

import signal
from types import FrameType

_seen = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _seen
    _seen = True
    raise KeyboardInterrupt


def install() -> None:
    """Take SIGINT as Python does by default (``KeyboardInterrupt``), and remember it came.

    Only until :func:`restore`: trio installs its own delivery only over Python's default handler.
    """
    signal.signal(signal.SIGINT, _on_sigint)


def restore() -> bool:
    """Put Python's default SIGINT handler back; whether a SIGINT came meanwhile.

    Called where a command takes SIGINT over (before ``trio.run``, before the chat client's own
    handler), before anything is asked: a ``KeyboardInterrupt`` that had been raised would have
    ended the command there already, so one that came was lost.
    """
    if signal.getsignal(signal.SIGINT) is _on_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return _seen
