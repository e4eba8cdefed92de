"""Opening the SQLite database and migrating it (apsw).

Connection settings, in order: the busy timeout first (so even the first pragma waits for a
concurrent writer instead of raising "database is locked"), then the page size (it must come before
WAL on a new file, and is ignored on an existing one), then WAL, synchronous=NORMAL and foreign
keys. WAL with synchronous=NORMAL keeps every committed transaction through a crash or ``kill -9``
of the process; only an operating-system crash or power loss can drop the last commits (SQLite docs,
"Write-Ahead Logging" and "PRAGMA synchronous").
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import apsw

from kesoku.vocab.errors import StoreError

BUSY_TIMEOUT_MS = 5_000
"""How long a write waits for another connection's write lock before failing."""

PAGE_SIZE = 1024
"""The page size of a new database file (an existing file keeps its own).

A single-message commit rewrites 3 or 4 pages (table leaf, history index leaf, sqlite_sequence), and
the WAL holds whole pages: 1 KiB pages write a quarter of the bytes of the default 4 KiB, about 12 %
more commits/s with the checkpoint thread. The cost is on reads of messages over ~1 KB, which spill
into overflow pages: a 10,000-message history with 2 KB tool results reads about 10 % slower (same
read of small messages: no difference). Measured for issue 2 with bench/history_bench.py and a
variant. """

_WAL_WRITE_LOCK = 120
"""The byte of the ``-shm`` file a WAL writer locks (SQLite's WALINDEX_LOCK_OFFSET + WAL_WRITE_LOCK,
"WAL-mode File Format", sqlite.org/walformat.html): whoever holds it is writing."""


def write_lock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid holding the database's write lock, from /proc/locks (Linux); None if unknown.

    /proc/locks is read rather than asking ``fcntl(F_GETLK)``: that needs a descriptor on the
    ``-shm`` file, and closing it would drop this process's own SQLite locks on that file (POSIX
    record locks belong to the process, fcntl(2)).
    """
    try:
        inode = os.stat(f"{os.fspath(path)}-shm").st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 4242 fe:00:2147418 120 120" (proc(5)); "->" marks a waiter.
        if len(fields) < 8 or fields[1] == "->" or fields[3] != "WRITE":
            continue
        if fields[5].rsplit(":", 1)[-1] != str(inode):
            continue
        end = fields[7]
        if int(fields[6]) <= _WAL_WRITE_LOCK and (end == "EOF" or int(end) >= _WAL_WRITE_LOCK):
            return int(fields[4]) if fields[4].isdigit() else None
    return None


_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


class Migration(NamedTuple):
    """One schema/NNNN_name.sql file."""

    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Read the bundled migrations, ordered by version.

    Returns:
        The migrations from ``schema/`` (shipped as ``kesoku/_schema``).

    Raises:
        StoreError: When two files share a version or a version is skipped.
    """
    found: list[Migration] = []
    for entry in resources.files("kesoku").joinpath("_schema").iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            found.append(
                Migration(int(match.group(1)), entry.name, entry.read_text(encoding="utf-8"))
            )
    found.sort()
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise StoreError(f"schema migrations are not numbered 1..n: found {migration.name}")
    return found


def open_connection(
    path: str | os.PathLike[str], *, busy_timeout_ms: int = BUSY_TIMEOUT_MS
) -> apsw.Connection:
    """Open (creating if needed) and migrate the database at ``path``.

    Args:
        path: The database file; its folder is created. ``:memory:`` works for tests.
        busy_timeout_ms: How long a statement waits for another connection's lock.

    Returns:
        A connection in WAL mode with foreign keys on, migrated to the newest schema.

    Raises:
        StoreError: The file is not a database, cannot be opened, or was written by a newer Kesoku;
            or its folder cannot be made.
    """
    where = str(path)
    if where != ":memory:":
        folder = Path(where).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent is a file, no permission, a read-only file system
            reason = exc.strerror or exc
            raise StoreError(
                f"{where}: cannot make its folder {folder}: {reason} (workspace.db_path)"
            ) from None
    try:
        conn = apsw.Connection(where)
        conn.set_busy_timeout(busy_timeout_ms)
        conn.execute(f"PRAGMA page_size = {PAGE_SIZE:d}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        _migrate(conn, where)
    except (apsw.NotADBError, apsw.CorruptError) as exc:
        raise StoreError(f"{where}: not a Kesoku database ({exc})") from None
    except apsw.CantOpenError as exc:
        raise StoreError(f"{where}: cannot open the database ({exc})") from None
    except (apsw.ReadOnlyError, apsw.PermissionsError) as exc:
        raise StoreError(f"{where}: the database is not writable ({exc})") from None
    return conn


def schema_version(conn: apsw.Connection) -> int:
    """Return the schema version recorded in ``PRAGMA user_version``."""
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0]) if row else 0


def _migrate(conn: apsw.Connection, where: str) -> None:
    steps = migrations()
    newest = steps[-1].version if steps else 0
    current = schema_version(conn)
    if current > newest:
        raise StoreError(
            f"{where}: written by a newer Kesoku (schema version {current}; this one knows up to "
            f"{newest}). Upgrade Kesoku, or point workspace.db_path at another file."
        )
    for step in steps[current:]:
        # BEGIN IMMEDIATE takes the write lock first: two processes opening a new file at once
        # serialize here, and the second re-reads the version instead of applying a step twice.
        conn.execute("BEGIN IMMEDIATE")
        try:
            if schema_version(conn) < step.version:
                conn.execute(step.sql)
                conn.execute(f"PRAGMA user_version = {step.version:d}")
            conn.execute("COMMIT")
        except BaseException:
            # An interrupted statement (Ctrl-C while a new database is made) may have ended the
            # transaction already: a ROLLBACK then fails and hides why.
            if not conn.getautocommit():
                conn.execute("ROLLBACK")
            raise
