"""One process at a time runs a session: a byte-range lock per session in one shared file.

ARCHITECTURE.md, "Many sessions, a locked database", says why the locks are byte ranges.

Several Kesoku processes can share one database: the daemon, a ``kesoku chat`` beside it, two chats
continuing the same ``--session``. Each process's dispatcher sees every user message, so without an
owner two of them would answer the same message, and one's crash recovery would mark the other's
running tool calls ``lost``. A process therefore runs a session's worker only while it holds the
session's byte of ``<sessions_dir>/.locks/sessions.lock``: an exclusive, non-blocking open-file-
description lock (``fcntl(F_OFD_SETLK)``, Linux 3.15+, fcntl(2) "Open file description locks") on
the byte at a 62-bit hash of the session id.

Why one file and byte ranges. A descriptor per held session (the ``flock(2)`` per session file this
replaced) put a thousand live sessions at the common 1024 open-file limit and the daemon died of
EMFILE; one descriptor per :class:`SessionLocks` holds any number of sessions. Why OFD locks rather
than classic POSIX record locks (``F_SETLK``): those belong to the process, so closing *any*
descriptor of the file drops them all, and two openers in one process never conflict. OFD locks
belong to the open file description, like ``flock``: two :class:`SessionLocks` conflict whether they
live in two processes or one (the tests rely on it), and nothing else in the process can drop them.
The kernel drops them when the holder exits, ``kill -9`` included, so a crash never leaves a session
locked; the descriptor is close-on-exec, so a tool's subprocess that outlives its daemon does not
keep it.

Two session ids sharing a hash would only make one wait for the other (about one chance in 10^8 with
100,000 sessions live at once); within one process such bytes are counted, so releasing one session
never frees the other's byte.

The kernel does not name an OFD lock's holder (``F_OFD_GETLK`` answers pid -1), so the holder writes
its pid to ``<session_id>.pid`` beside the lock file, for the message that names it (best effort),
and removes it before it lets the lock go (so never a later holder's); one killed leaves it, for the
next holder to overwrite.

Within one process the lock is counted: the chat that opened a session and the worker that runs its
turns both hold it, and it is released when the last lets go.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import struct
from pathlib import Path

LOCK_FILE = "sessions.lock"
"""The file whose bytes are the sessions' locks (never written: its size stays 0)."""

_OFFSET_BITS = 62
"""Lock offsets stay below 2**62: l_start + l_len must fit a signed 64-bit off_t."""

# struct flock on 64-bit Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t
# l_pid (fcntl(2); native alignment pads it to 32 bytes). l_pid must be 0 for the F_OFD_* commands.
_FLOCK = struct.Struct("hhqqi4x")


def lock_offset(session_id: str) -> int:
    """The byte of the lock file that stands for ``session_id`` (a 62-bit BLAKE2b hash)."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _OFFSET_BITS)


class SessionLocks:
    """The sessions this process holds, by id; one descriptor however many it holds.

    Args:
        folder: Where the lock file lives (created on first use).
    """

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._fd: int | None = None
        self._held: dict[str, int] = {}  # session id -> holders in this process
        self._bytes: dict[int, int] = {}  # lock offset -> sessions held on it (a hash shared)

    def acquire(self, session_id: str) -> bool:
        """Hold the session (a file open the first time; never waits for another holder).

        Returns:
            False when another process (or another :class:`SessionLocks`) holds it.

        Raises:
            OSError: The lock folder or file cannot be created (EMFILE included, when this is the
                first lock and the process is out of descriptors).
        """
        held = self._held.get(session_id)
        if held is not None:
            self._held[session_id] = held + 1
            return True
        offset = lock_offset(session_id)
        if offset not in self._bytes:
            try:
                self._lock(offset, fcntl.F_WRLCK)
            except OSError as exc:
                # another open file description holds it
                if exc.errno in (
                    errno.EAGAIN,
                    errno.EACCES,
                ):
                    return False
                raise
            self._write_pid(session_id)
        self._bytes[offset] = self._bytes.get(offset, 0) + 1
        self._held[session_id] = 1
        return True

    def release(self, session_id: str) -> None:
        """Let go of one hold; the lock is dropped with the last.

        Releasing what is not held does nothing.
        """
        count = self._held.pop(session_id, None)
        if count is None:
            return
        if count > 1:
            self._held[session_id] = count - 1
            return
        self._remove_pid(session_id)  # while held: no other holder has written one
        offset = lock_offset(session_id)
        sharing = self._bytes.pop(offset) - 1
        if sharing:
            self._bytes[offset] = sharing
        else:
            self._lock(offset, fcntl.F_UNLCK)

    def holder(self, session_id: str) -> int | None:
        """The pid written by the process that holds (or last held) the session, if readable."""
        try:
            return int((self.folder / f"{session_id}.pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Drop every lock this process holds (closing the descriptor drops them all)."""
        for session_id in self._held:
            self._remove_pid(session_id)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._held.clear()
        self._bytes.clear()

    def _lock(self, offset: int, kind: int) -> None:
        if self._fd is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            self._fd = os.open(self.folder / LOCK_FILE, flags, 0o644)
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))

    def _remove_pid(self, session_id: str) -> None:
        with contextlib.suppress(OSError):
            (self.folder / f"{session_id}.pid").unlink(missing_ok=True)

    def _write_pid(self, session_id: str) -> None:
        """Name this process as the holder; best effort: the lock holds without it."""
        with contextlib.suppress(OSError):
            (self.folder / f"{session_id}.pid").write_text(f"{os.getpid()}\n")
