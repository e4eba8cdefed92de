"""One process at a time runs a session: an advisory file lock per session (DESIGN §3).

Several Kesoku processes can share one database: the daemon, a ``kesoku chat`` beside it, two chats
continuing the same ``--session``. Each process's dispatcher sees every user message, so without an
owner two of them would answer the same message, and one's crash recovery would mark the other's
running tool calls ``lost``. A process therefore runs a session's worker only while it holds
``<sessions_dir>/.locks/<session_id>.lock`` (``flock(2)``, exclusive, non-blocking). The kernel drops
the lock when its holder exits, ``kill -9`` included, so a crash never leaves a session locked. The
descriptor is close-on-exec: a tool's subprocess that outlives its daemon does not keep the session.
The file holds the holder's pid, for the message that names it.

Within one process the lock is counted: the chat that opened a session and the worker that runs its
turns both hold it, and it is released when the last lets go.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class SessionLocks:
    """The sessions this process holds, by id.

    Args:
        folder: Where the lock files live (created on first use).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._held: dict[str, tuple[int, int]] = {}  # session id -> (descriptor, holders in this process)

    def acquire(self, session_id: str) -> bool:
        """Hold the session (blocking for a file open, never for another process).

        Returns:
            False when another process holds it.

        Raises:
            OSError: The lock folder or file cannot be created.
        """
        held = self._held.get(session_id)
        if held is not None:
            self._held[session_id] = (held[0], held[1] + 1)
            return True
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / f"{session_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        # Written before the old content is cut off, so a reader never finds the file empty.
        pid = f"{os.getpid()}\n".encode()
        os.pwrite(fd, pid, 0)
        os.ftruncate(fd, len(pid))
        self._held[session_id] = (fd, 1)
        return True

    def release(self, session_id: str) -> None:
        """Let go of one hold; the lock is dropped with the last. Releasing what is not held does nothing."""
        held = self._held.pop(session_id, None)
        if held is None:
            return
        fd, count = held
        if count > 1:
            self._held[session_id] = (fd, count - 1)
        else:
            os.close(fd)  # closing the descriptor drops the flock

    def holder(self, session_id: str) -> int | None:
        """The pid written by the process that holds (or last held) the session, if readable."""
        try:
            return int((self.folder / f"{session_id}.lock").read_text().strip())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Drop every lock this process holds."""
        for fd, _ in self._held.values():
            os.close(fd)
        self._held.clear()
