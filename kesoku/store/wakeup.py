"""Waking other processes after a commit: a named pipe (FIFO) per listening process.

A process whose listeners wait makes an *inbox*, a FIFO in the folder ``<db>-wake/`` next to the
database (mode 0700: only its owner can write to or list them). After each commit that stores new
messages, :meth:`Wakeups.notify` writes one byte to every other inbox. The byte only says "look":
SQLite stays the only source of truth, and the woken process reads ``PRAGMA data_version`` and the
store. It is written after the commit, so whoever reads it sees the commit.

Why not an inotify watch on the ``-wal`` file (tried for issue 24, same delivery within 1 ms): while
any process watches, every write of the WAL by every process costs the kernel about 1 µs more (8 to
10 writes a commit: a fifth of the posting rate), its own commits wake it, and the last write of a
commit comes before the commit is visible. Why a FIFO rather than a Unix datagram socket (tried
too): writing a byte to a pipe costs 0.7 µs, sending a datagram 3 to 10 µs. An inbox costs nothing
while only one process uses the database, and a post costs one ``write()`` per other listening
process.

What can be missed (the gateway's slow safety poll covers it):

- A sender looks at the folder at most every :data:`RESCAN_S`, so an inbox opened in the meantime
  misses the commits of that sliver: the inbox's owner looks once more :data:`SETTLE_S` after
  opening it (the gateway does). It lists the folder only when its modification time moved or is
  recent (:data:`STEADY_S`), so an inbox made while the wall clock is set back onto the very tick of
  the folder's last change is not listed until the next change.
- A folder that cannot be made or is not private: logged once, and the gateway polls.
- Writers that do not go through :class:`~kesoku.store.Store` (the ``sqlite3`` shell).

A full inbox (64 KiB its owner has not read yet) drops the byte: bytes are already waiting, and the
owner reads all of them before it looks. An inbox whose process died without removing it has no
reader, so opening it fails (ENXIO) or writing to it does (EPIPE: Python ignores SIGPIPE): the
sender that finds it so removes it. The owner opens its FIFO for reading and writing (Linux allows
it, fifo(7)), so that it never reads an end of file when a sender closes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import stat
import time

import trio

_log = logging.getLogger(__name__)

RESCAN_S = 0.001
"""A sender lists the inboxes again at most this often (when it sends)."""
SETTLE_S = 2 * RESCAN_S
"""After opening an inbox, look once more this much later: by then every sender lists it."""
STEADY_S = 1.0
"""A sender lists the folder again only when its modification time changed since the last listing,
or is less than this old: an inbox made or removed since then changes it (by the wall clock,
whose file timestamps advance in ticks of up to 10 ms)."""
_SUFFIX = ".fifo"
_READ_SIZE = 64 * 1024


class Inbox:
    """This process's inbox: readable when another process committed messages.

    Made by :meth:`Wakeups.open_inbox`; one trio task at a time may :meth:`wait`.
    """

    def __init__(self, wakeups: Wakeups, fd: int, name: str) -> None:
        self._wakeups = wakeups
        self._fd = fd
        self.name = name
        """The FIFO's file name in the folder."""

    async def wait(self) -> None:
        """Return once a byte arrived since the last return (at once if one is waiting).

        Cancellation:
            Safe: bytes are read only after the wait, and the call returns right after reading.
        """
        await trio.lowlevel.wait_readable(self._fd)  # readable at once when bytes are queued
        self.take()

    def take(self) -> bool:
        """Read every byte waiting now, without waiting; whether there was one."""
        woken = False
        while True:
            try:
                os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                return woken
            woken = True

    def close(self) -> None:
        """Remove the inbox (senders stop writing to it) and close it."""
        self._wakeups._closed_inbox(self)
        trio.lowlevel.notify_closing(self._fd)
        os.close(self._fd)


class Wakeups:
    """Both ends for one database: this process's inbox and the bytes sent to the others' inboxes.

    Args:
        db_path: The database file; the inboxes live in ``<db_path>-wake/``.
    """

    def __init__(self, db_path: str | os.PathLike[str]) -> None:
        self.folder = f"{os.fspath(db_path)}-wake"
        self._dirfd = -1  # the folder, opened (and checked) once
        self._failed = False  # said once that the folder is unusable
        self._own: str | None = None  # our inbox's name, not written to
        self._peers: dict[str, int] = {}  # inbox name -> its FIFO opened for writing
        self._scanned_at = -RESCAN_S  # time.monotonic() of the last look at the folder
        self._listed = -1  # the folder's st_mtime_ns when last listed

    def _folder_fd(self) -> int:
        """The folder's descriptor, made private (0700) if missing; -1 when unusable."""
        if self._dirfd >= 0 or self._failed:
            return self._dirfd
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            info = os.fstat(fd)
            if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
                os.close(fd)
                raise PermissionError(
                    f"{self.folder} is mode {stat.S_IMODE(info.st_mode):04o} (uid "
                    f"{info.st_uid}), not private to this user: chmod 700 it, or remove it while "
                    "Kesoku is stopped"
                )
        except OSError as exc:
            self._failed = True
            _log.warning("wake-ups off, other processes' messages arrive by polling: %s", exc)
            return -1
        self._dirfd = fd
        return fd

    def open_inbox(self) -> Inbox | None:
        """Make this process's inbox; close it (:meth:`Inbox.close`) when nothing listens.

        Returns:
            The inbox, or None when there can be none (the folder unusable: logged once).
        """
        if self._folder_fd() < 0:
            return None
        name = f"{os.getpid()}-{secrets.token_hex(4)}{_SUFFIX}"
        try:
            os.mkfifo(name, 0o600, dir_fd=self._dirfd)
            fd = os.open(name, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._dirfd)
        except OSError as exc:
            self._unlink(name)
            _log.warning("wake-ups off, other processes' messages arrive by polling: %s", exc)
            return None
        self._own = name
        return Inbox(self, fd, name)

    def _closed_inbox(self, inbox: Inbox) -> None:
        if self._own == inbox.name:
            self._own = None
        self._unlink(inbox.name)

    def notify(self) -> None:
        """Send a byte to every other process's inbox (after a commit of new messages).

        Never raises and never blocks: an inbox that cannot take the byte now already holds one.
        """
        now = time.monotonic()
        if now - self._scanned_at >= RESCAN_S:
            self._scanned_at = now
            self._rescan()
        gone: list[str] = []
        for name, fd in self._peers.items():
            try:
                os.write(fd, b"\0")
            except BlockingIOError:
                pass  # its owner has not read the previous bytes: it will look after this commit
            except OSError:  # EPIPE: no reader
                gone.append(name)
        for name in gone:
            os.close(self._peers.pop(name))
            self._unlink(name)  # its process died without removing it (or has just removed it)

    def _rescan(self) -> None:
        if self._dirfd < 0 and (self._failed or not os.path.isdir(self.folder)):
            return  # no process has listened yet: nothing to wake, nothing to make
        if self._folder_fd() < 0:
            return
        try:
            # A stat costs a fifth of a listing, and a post's sender looks every RESCAN_S.
            changed = os.fstat(self._dirfd).st_mtime_ns
            if changed == self._listed and time.time_ns() - changed > STEADY_S * 1e9:
                return  # no inbox came or went since the last listing
            names = {e.name for e in os.scandir(self._dirfd) if e.name.endswith(_SUFFIX)}
        except OSError:
            return
        self._listed = changed  # read before the listing: a change during it shows next time
        names.discard(self._own or "")
        for name in set(self._peers) - names:
            os.close(self._peers.pop(name))
        for name in names - set(self._peers):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._dirfd)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    self._unlink(name)  # no reader: its process died without removing it
                self._listed = -1  # try it again at the next look
                continue
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.close(fd)  # not an inbox: never write into a file
                continue
            self._peers[name] = fd

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):  # removed already (by its owner, or another sender)
            os.unlink(os.path.join(self.folder, name))

    def close(self) -> None:
        """Close the other inboxes and the folder's descriptor (not our inbox).

        The folder is removed when no inbox is left in it.
        """
        for fd in self._peers.values():
            os.close(fd)
        self._peers.clear()
        if self._dirfd >= 0:
            os.close(self._dirfd)
            self._dirfd = -1
            # Only an empty folder goes (ENOTEMPTY otherwise). A process making its inbox at this
            # instant finds the folder gone, says so once and polls instead.
            with contextlib.suppress(OSError):
                os.rmdir(self.folder)
