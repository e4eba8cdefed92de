"""Checkpointing the WAL off the commit path: a thread with its own connection.

Why: with SQLite's default (``wal_autocheckpoint`` of 1,000 pages) every thousandth page written
makes the committing call copy the WAL into the database file and fsync both, on the trio thread,
inside some ``post()``. On our schema that more than halves the single-row commit rate (about
11,700/s with it, 26,000/s without, measured for issue 2).

So the store's own connection keeps only a large ``wal_autocheckpoint`` as a safety net, and a
:class:`Checkpointer` thread runs PASSIVE checkpoints on a second connection shortly after writes. A
PASSIVE checkpoint never waits for a lock and never blocks a writer or a reader, and apsw releases
the GIL while SQLite copies and syncs, so the trio thread keeps running.

Why the safety net is still needed: the WAL restarts from its beginning (and stops growing) only
when a write begins with every frame already checkpointed. Under sustained writes the thread is
always a few commits behind, so it cannot get there alone; once the WAL reaches the limit, a commit
on the writer's connection checkpoints the remainder (little, as the thread copied the rest) and the
next write restarts the WAL. In bursty use the thread catches up in the pauses and the net does not
fire.
"""

from __future__ import annotations

import logging
import threading

import apsw

WAL_LIMIT_PAGES = 10_000
"""The safety net: a commit that leaves this many pages in the WAL checkpoints on the writer's
thread."""
CHECKPOINT_DELAY_S = 0.05
"""How long after a write the thread checkpoints: the commits of a burst share one checkpoint."""

_log = logging.getLogger(__name__)


class Checkpointer:
    """A daemon thread that runs PASSIVE WAL checkpoints of one database file, shortly after writes.

    Install :meth:`wrote` as the writing connection's commit hook; :meth:`close` stops the thread.

    Args:
        path: The database file (it must exist and be in WAL mode).
        delay_s: How long to let writes accumulate before a checkpoint.
    """

    def __init__(self, path: str, *, delay_s: float = CHECKPOINT_DELAY_S) -> None:
        self.delay_s = delay_s
        self.runs = 0
        """How many checkpoints completed (a test figure)."""
        self.last: tuple[int, int] = (0, 0)
        """(frames in the WAL, frames checkpointed) after the last checkpoint."""
        # Its own connection: a checkpoint on the store's connection would run on the trio thread.
        # synchronous=NORMAL as the writer: the WAL is synced before the copy, the database after
        # it.
        self._conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE)
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._wrote = threading.Event()
        self._closing = threading.Event()
        self._failed: str | None = None
        self._thread = threading.Thread(target=self._run, name="kesoku-checkpoint", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread.is_alive()

    def wrote(self) -> bool:
        """Note a commit (an apsw commit hook: runs on the writer's thread, before each commit).

        Returns:
            False, so that the commit goes ahead.
        """
        # is_set() is a plain read; set() takes a lock, so it runs only once per checkpoint round.
        if not self._wrote.is_set():
            self._wrote.set()
        return False

    def close(self) -> None:
        """Stop the thread, waiting for a checkpoint in progress; then close its connection."""
        self._closing.set()
        self._wrote.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        try:
            # close() sets _closing before _wrote: whichever of them this loop sees last, it ends.
            while not self._closing.is_set():
                self._wrote.wait()
                if self._closing.wait(self.delay_s):
                    break  # closing the store's connection (the last one) checkpoints what is left
                # Cleared before the checkpoint: a commit during it sets it again for the next
                # round.
                self._wrote.clear()
                self._checkpoint()
        finally:
            self._conn.close()

    def _checkpoint(self) -> None:
        try:
            self.last = self._conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_PASSIVE)
            self.runs += 1
        except apsw.BusyError:
            # Another connection is checkpointing or recovering the WAL: try again next round.
            self._wrote.set()
        except apsw.Error as exc:
            # The safety net still bounds the WAL; say so once rather than every round.
            if self._failed != str(exc):
                self._failed = str(exc)
                _log.warning("WAL checkpoint failed (the writer will checkpoint instead): %s", exc)
