"""The store: every query Kesoku runs against SQLite, each write one short transaction.

This module holds sessions, messages, cursors, taint and view states; the spend ledger
(:mod:`kesoku.store.ledger`) and schedules (:mod:`kesoku.store.schedules`) are mixins of
:class:`Store` over :class:`~kesoku.store.base.StoreBase`.

The store is synchronous and lives on the trio thread: a single-row commit takes about 26 µs and
reading a 10,000-message history about 15 ms (bench/history_bench.py), both well inside the 20 ms a
step of the event loop may take. It is not thread-safe; give each process (or thread) its own Store.
(Its one helper thread, the WAL checkpointer of :mod:`kesoku.store.checkpoint`, has a connection of
its own.)

What it writes is first made valid UTF-8 (:mod:`kesoku.vocab.text`): SQLite and msgspec refuse lone
surrogates, and a message, a session's title or metadata, or a taint label may come from a chat
platform, a tool or a model.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import apsw
import msgspec

from kesoku.store.base import StoreBase, writes
from kesoku.store.checkpoint import WAL_LIMIT_PAGES, Checkpointer
from kesoku.store.db import BUSY_TIMEOUT_MS, open_connection
from kesoku.store.filters import MessageFilter
from kesoku.store.ledger import SpendTable
from kesoku.store.schedules import ScheduleTable
from kesoku.store.wakeup import Wakeups
from kesoku.vocab.errors import AmbiguousSessionError, UnknownSessionError
from kesoku.vocab.model import (
    EMPTY_METADATA,
    Kind,
    Message,
    Metadata,
    Role,
    Session,
    Status,
    TaintSource,
    valid_message,
)
from kesoku.vocab.text import valid_data, valid_text

_ROLES = {r.value: r for r in Role}
_KINDS = {k.value: k for k in Kind}
_STATUSES = {s.value: s for s in Status}
_EMPTY_JSON = b"{}"

_encode = msgspec.json.Encoder().encode
_decode_metadata = msgspec.json.Decoder(Metadata).decode
_decode_dict = msgspec.json.Decoder(dict[str, Any]).decode

_MESSAGE_COLUMNS = (
    "id, session_id, role, kind, status, sender, content, root_id, parent_id, ts, root_ts,"
    " metadata, external_id"
)
_SESSION_COLUMNS = "id, adapter, channel_id, created_at, workspace, title, llm, parent_id, metadata"

# A root_id of 0 asks for the message's own id (it opens its turn). AUTOINCREMENT gives the new row
# the sequence's value plus one, and this statement reads that value before it writes the row,
# inside its own write lock: one statement, where an UPDATE after the INSERT would need a second one
# and a savepoint. RETURNING root_id lets the caller check the two agree (they always do unless
# sqlite_sequence was edited).
_INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, role, kind, status, sender, content, root_id, parent_id, ts,"
    " root_ts, metadata, adapter, external_id)"
    " VALUES (?1, ?2, ?3, ?4, ?5, ?6,"
    " CASE ?7 WHEN 0 THEN coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0)"
    " + 1 ELSE ?7 END,"
    " ?8, ?9, ?10, ?11, (SELECT adapter FROM sessions WHERE id = ?1), ?12)"
    " ON CONFLICT (adapter, external_id) WHERE external_id IS NOT NULL DO NOTHING"
    " RETURNING id, root_id, adapter"
)


class Inserted(NamedTuple):
    """The result of storing one message."""

    message: Message
    """The stored message, with its id (the existing one for a duplicate)."""
    adapter: str
    """The adapter that owns its session."""
    new: bool
    """False when (adapter, external_id) was already stored: nothing was written."""


def _to_messages(rows: Iterable[tuple[Any, ...]], session_id: str | None = None) -> list[Message]:
    """Rows of :data:`_MESSAGE_COLUMNS` as Messages.

    Args:
        rows: The rows.
        session_id: The session every row belongs to, if one: its string is shared by all.

    One comprehension, no call per row: a worker's first request reads its whole session this way,
    10,000 rows and more.
    """
    roles, kinds, statuses, decode = _ROLES, _KINDS, _STATUSES, _decode_metadata
    return [
        Message(
            id=id_,
            session_id=session_id or sid,
            role=roles[role],
            kind=kinds[kind],
            status=statuses[status],
            sender=sender,
            content=content,
            root_id=root_id,
            parent_id=parent_id,
            ts=ts,
            root_ts=root_ts,
            metadata=EMPTY_METADATA if meta == _EMPTY_JSON else decode(meta),
            external_id=ext,
        )
        for (
            id_,
            sid,
            role,
            kind,
            status,
            sender,
            content,
            root_id,
            parent_id,
            ts,
            root_ts,
            meta,
            ext,
        ) in rows
    ]


def _row_to_message(row: tuple[Any, ...]) -> Message:
    """A row of :data:`_MESSAGE_COLUMNS` as a Message."""
    return _to_messages((row,))[0]


def _row_to_session(row: tuple[Any, ...]) -> Session:
    id_, adapter, channel_id, created_at, workspace, title, llm, parent_id, meta = row
    return Session(
        id=id_,
        adapter=adapter,
        channel_id=channel_id,
        created_at=created_at,
        workspace=workspace,
        title=title,
        llm=llm,
        parent_id=parent_id,
        metadata=_decode_dict(meta),
    )


_DONE = "/done/"
"""Rows of the cursors table named ``<cursor>/done/<id>`` hold the ids a cursor handled above it."""


def _done_range(name: str) -> tuple[str, str]:
    """The names of a cursor's done rows: ``[low, high)`` in SQLite's text order."""
    low = f"{name}{_DONE}"
    return low, low[:-1] + chr(ord(low[-1]) + 1)


class Store(ScheduleTable, SpendTable, StoreBase):
    """Sessions, the message log, cursors, view states, spend and schedules in one SQLite file.

    A file database checkpoints its WAL from a background thread (:mod:`kesoku.store.checkpoint`),
    so that commits on the caller's thread never copy the WAL into the database or fsync.

    Args:
        path: The database file (created and migrated), or ``:memory:``.
        busy_timeout_ms: How long a write waits for another process's lock.
        wal_limit_pages: The WAL size (in pages) past which a commit checkpoints on this connection
            itself: the bound on the WAL when the background checkpoints cannot keep up.

    Raises:
        StoreError: The file cannot be used (see :func:`kesoku.store.db.open_connection`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        wal_limit_pages: int = WAL_LIMIT_PAGES,
    ) -> None:
        self.path = str(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._conn = open_connection(path, busy_timeout_ms=busy_timeout_ms)
        self._checkpointer: Checkpointer | None = None
        self.wakeups: Wakeups | None = None
        """Wakes other processes' listeners after a commit of messages (None in memory)."""
        if self.path != ":memory:":
            self.wakeups = Wakeups(self.path)
            conn = self._conn
            conn.wal_autocheckpoint(wal_limit_pages)
            # Once the WAL restarts, truncate a file that grew past the limit (a long reader pinned
            # it).
            page_size = self._pragma_int("page_size")
            conn.execute(f"PRAGMA journal_size_limit = {wal_limit_pages * (page_size + 24) + 32:d}")
            self._checkpointer = Checkpointer(self.path)
            conn.set_commit_hook(self._checkpointer.wrote)

    def close(self) -> None:
        """Stop the checkpoint thread and close the connection.

        The last connection to close checkpoints the whole WAL and removes it (SQLite does this).
        """
        if self._checkpointer is not None:
            self._checkpointer.close()
        if self.wakeups is not None:
            self.wakeups.close()
        self._conn.close()

    # -- sessions ---------------------------------------------------------------------------------

    @writes
    def create_session(
        self,
        adapter: str,
        channel_id: str,
        *,
        workspace_root: str | os.PathLike[str],
        created_at: float | None = None,
        title: str | None = None,
        llm: str | None = None,
        parent_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """Create the session of (adapter, channel_id), or return the one that exists.

        Args:
            adapter: The owning adapter's chatbot id.
            channel_id: The platform's thread or space id.
            workspace_root: The sessions folder; the session's workspace is ``<root>/<id>``.
            created_at: UNIX seconds (the first platform message's time); now when None.
            title: A title, if known.
            llm: A backend override.
            parent_id: The session this one forks.
            metadata: Free-form adapter fields.

        Returns:
            The session (the existing one if (adapter, channel_id) was taken).
        """
        channel_id, metadata = valid_text(channel_id), valid_data(metadata)
        title = title and valid_text(title)
        existing = self.find_session(adapter, channel_id)
        if existing is not None:
            return existing
        session_id = uuid.uuid4().hex[:16]
        session = Session(
            id=session_id,
            adapter=adapter,
            channel_id=channel_id,
            created_at=time.time() if created_at is None else created_at,
            workspace=os.path.join(os.fspath(workspace_root), session_id),
            title=title,
            llm=llm,
            parent_id=parent_id,
            metadata=metadata or {},
        )
        # ON CONFLICT: another process may create the same channel's session between our read and
        # write.
        self._conn.execute(
            f"INSERT INTO sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (adapter, channel_id) DO NOTHING",
            (
                session.id,
                adapter,
                channel_id,
                session.created_at,
                session.workspace,
                title,
                llm,
                parent_id,
                _encode(session.metadata),
            ),
        )
        stored = self.find_session(adapter, channel_id)
        assert stored is not None  # just written or written by the winner of the race
        return stored

    def get_session(self, session_id: str) -> Session | None:
        """Return the session with this id, or None."""
        row = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return _row_to_session(row) if row else None

    def find_session(self, adapter: str, channel_id: str) -> Session | None:
        """Return the session of a platform thread or space, or None."""
        row = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE adapter = ? AND channel_id = ?",
            (adapter, channel_id),
        ).fetchone()
        return _row_to_session(row) if row else None

    def list_sessions(self, *, adapter: str | None = None) -> list[Session]:
        """Return every session (of one adapter when given), oldest first."""
        sql = f"SELECT {_SESSION_COLUMNS} FROM sessions"
        rows = (
            self._conn.execute(sql + " WHERE adapter = ? ORDER BY created_at, id", (adapter,))
            if adapter is not None
            else self._conn.execute(sql + " ORDER BY created_at, id")
        )
        return [_row_to_session(r) for r in rows]

    @writes
    def set_session_title(self, session_id: str, title: str) -> None:
        """Set a session's title."""
        self._conn.execute(
            "UPDATE sessions SET title = ? WHERE id = ?", (valid_text(title), session_id)
        )

    @writes
    def delete_session(self, session_id: str) -> Session | None:
        """Delete a session with its messages and view states (foreign-key cascade).

        The workspace folder is the caller's to remove (the gateway does it off the event loop).

        Returns:
            The deleted session, or None if there was none.
        """
        session = self.get_session(session_id)
        if session is not None:
            self._conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        return session

    # -- messages ---------------------------------------------------------------------------------

    @writes
    def insert_messages(
        self, messages: Sequence[Message], *, busy_timeout_ms: int | None = None
    ) -> list[Inserted]:
        """Store messages in one transaction; ids are assigned in order.

        ``ts`` of 0 becomes now, ``root_ts`` of 0 becomes ``ts``, and ``root_id`` of 0 becomes the
        message's own id (a message that opens its turn). A message whose (adapter, external_id) is
        already stored is not written again: the stored one is returned with ``new=False``.
        Text is made valid UTF-8 first (:func:`~kesoku.vocab.model.valid_message`: a lone surrogate
        becomes U+FFFD); the returned messages hold what was written. After the commit of a new
        message, other processes' listeners are woken (:mod:`kesoku.store.wakeup`).

        Args:
            messages: Messages with ``id == 0``.
            busy_timeout_ms: How long this call waits for another connection's write lock; None:
                the store's own timeout. (The wait blocks the caller's thread: a retry loop passes a
                short one and sleeps between tries.)

        Returns:
            One :class:`Inserted` per message, in order.

        Raises:
            UnknownSessionError: A message names a session that does not exist; nothing is written.
            StoreBusyError: Another connection held the write lock past the busy timeout; nothing
                is written.
        """
        now = time.time()
        if busy_timeout_ms is not None:
            self._conn.set_busy_timeout(busy_timeout_ms)
        try:
            if len(messages) == 1:
                # One statement is atomic by itself: no transaction to open and close around it.
                inserted = [self._insert(messages[0], now)]
            else:
                with self._conn:  # one transaction (a savepoint) for the batch: all or nothing
                    inserted = [self._insert(msg, now) for msg in messages]
        finally:
            if busy_timeout_ms is not None:
                self._conn.set_busy_timeout(self.busy_timeout_ms)
        if self.wakeups is not None:
            for item in inserted:
                if item.new:
                    self.wakeups.notify()  # after the commit: whoever it wakes sees the new rows
                    break
        return inserted

    def _insert(self, msg: Message, now: float) -> Inserted:
        msg = valid_message(msg)
        ts = msg.ts or now
        root_ts = msg.root_ts or ts
        try:
            # fetchall, not fetchone: the statement must run to its end so that an autocommit
            # commits (and reports a failure) here, with SQLite's commit and WAL hooks, not when the
            # cursor is freed.
            rows = self._conn.execute(
                _INSERT_MESSAGE,
                (
                    msg.session_id,
                    # StrEnum members bind as their text; reading .value costs more than the bind.
                    msg.role,
                    msg.kind,
                    msg.status,
                    msg.sender,
                    msg.content,
                    msg.root_id,
                    msg.parent_id,
                    ts,
                    root_ts,
                    _EMPTY_JSON if msg.metadata is EMPTY_METADATA else _encode(msg.metadata),
                    msg.external_id,
                ),
            ).fetchall()
        except apsw.ConstraintError as exc:
            if self.get_session(msg.session_id) is None:
                raise UnknownSessionError(f"no session {msg.session_id!r}") from None
            raise exc
        if not rows:
            return Inserted(self._find_external(msg), self._session_adapter(msg.session_id), False)
        ((new_id, root_id, adapter),) = rows  # one row: a VALUES insert
        if msg.root_id == 0 and root_id != new_id:
            # Only if sqlite_sequence was edited by hand. Outside a batch this is a commit of its
            # own: a crash between the two would leave a wrong root_id, never a lost message.
            self._conn.execute("UPDATE messages SET root_id = id WHERE id = ?", (new_id,))
            root_id = new_id
        stored = msgspec.structs.replace(msg, id=new_id, ts=ts, root_ts=root_ts, root_id=root_id)
        return Inserted(stored, str(adapter), True)

    def _find_external(self, msg: Message) -> Message:
        row = self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages"
            " WHERE adapter = (SELECT adapter FROM sessions WHERE id = ?) AND external_id = ?",
            (msg.session_id, msg.external_id),
        ).fetchone()
        assert row is not None  # the conflict that skipped the insert is this row
        return _row_to_message(row)

    def _session_adapter(self, session_id: str) -> str:
        row = self._conn.execute(
            "SELECT adapter FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        return str(row[0]) if row else ""

    def get_message(self, message_id: int) -> Message | None:
        """Return the message with this id, or None."""
        row = self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)
        ).fetchone()
        return _row_to_message(row) if row else None

    def messages_after(self, after_id: int, flt: MessageFilter, *, limit: int) -> list[Message]:
        """Return up to ``limit`` messages with id > ``after_id`` that pass ``flt``, in id order.

        Args:
            after_id: A cursor: the last id already seen.
            flt: Which messages to return.
            limit: The most to return (a listener's memory bound).

        Returns:
            The messages, oldest first.
        """
        clause, bindings = flt.where()
        rows = self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE id > ? AND {clause}"
            " ORDER BY id LIMIT ?",
            (after_id, *bindings, limit),
        )
        return _to_messages(rows)

    def history(self, session_id: str) -> list[Message]:
        """Return a session's messages in logical order: (root_ts, ts, id).

        A turn's tool results stay with their turn even when another turn's messages were written in
        between (ARCHITECTURE.md, "Messages and sessions").
        """
        rows = self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ?"
            " ORDER BY root_ts, ts, id",
            (session_id,),
        )
        return _to_messages(rows, session_id)

    def open_user_messages(self, *, up_to: int, session_id: str | None = None) -> list[Message]:
        """Return the user messages still pending or processing with id <= ``up_to``, in id order.

        The runtime calls this once at start (crash recovery); with ``session_id``, that session's
        only (the daemon, when a chat attaches). Both read the partial index ``messages_open``
        (schema/0005), which holds only the open user messages.
        """
        where = "role = 'user' AND status IN ('pending', 'processing') AND id <= ?"
        if session_id is None:
            rows = self._conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE {where} ORDER BY id", (up_to,)
            )
        else:
            rows = self._conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE session_id = ? AND {where}"
                " ORDER BY id",
                (session_id, up_to),
            )
        return _to_messages(rows)

    def count_turns(self, session_id: str) -> int:
        """Count a session's user messages that were processed (done, interrupted or failed)."""
        row = self._conn.execute(
            "SELECT count(*) FROM messages WHERE session_id = ? AND role = 'user'"
            " AND status IN ('done', 'interrupted', 'failed')",
            (session_id,),
        ).fetchone()
        return int(row[0]) if row else 0

    @writes
    def set_status(self, message_ids: Iterable[int], status: Status) -> None:
        """Set the status of messages, in one transaction.

        Raises:
            StoreBusyError: Another connection held the write lock past the busy timeout.
        """
        with self._conn:
            self._conn.executemany(
                "UPDATE messages SET status = ? WHERE id = ?",
                ((status.value, i) for i in message_ids),
            )

    def last_message_id(self) -> int:
        """Return the highest message id ever assigned (0 for a new database)."""
        row = self._conn.execute(
            "SELECT seq FROM sqlite_sequence WHERE name = 'messages'"
        ).fetchone()
        return int(row[0]) if row else 0

    def _pragma_int(self, name: str) -> int:
        row = self._conn.execute(f"PRAGMA {name}").fetchone()
        return int(row[0]) if row else 0

    def data_version(self) -> int:
        """Return ``PRAGMA data_version``: it changes when another connection commits.

        Source: SQLite docs, "PRAGMA data_version" (this connection's own commits do not change it).
        """
        return self._pragma_int("data_version")

    # -- listener cursors -------------------------------------------------------------------------

    def get_cursor(self, name: str) -> int | None:
        """Return the saved cursor (last message id handled) of a listener, or None."""
        row = self._conn.execute(
            "SELECT message_id FROM cursors WHERE name = ?", (name,)
        ).fetchone()
        return int(row[0]) if row else None

    def cursor_done(self, name: str) -> list[int]:
        """The ids a listener handled above its saved cursor (see :meth:`set_cursor`), ascending."""
        rows = self._conn.execute(
            "SELECT message_id FROM cursors WHERE name >= ? AND name < ? ORDER BY message_id",
            _done_range(name),
        )
        return [int(row[0]) for row in rows]

    @writes
    def set_cursor(self, name: str, message_id: int, *, done: int | None = None) -> None:
        """Save a listener's cursor: the last message id handled, or a low watermark.

        A listener that handles messages out of id order (an adapter's delivery lanes) saves the
        id up to which every message is handled, and with ``done`` one id it handled above it. Those
        ids are rows of the same table named ``<name>/done/<id>`` (:meth:`cursor_done`); the ones
        at or below the cursor are removed in the same transaction.
        """
        now = time.time()
        with self._conn:
            self._conn.execute(
                "INSERT INTO cursors (name, message_id, updated_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO UPDATE SET message_id = excluded.message_id,"
                " updated_at = excluded.updated_at",
                (name, message_id, now),
            )
            self._conn.execute(
                "DELETE FROM cursors WHERE name >= ? AND name < ? AND message_id <= ?",
                (*_done_range(name), message_id),
            )
            if done is not None and done > message_id:
                self._conn.execute(
                    "INSERT OR IGNORE INTO cursors (name, message_id, updated_at) VALUES (?, ?, ?)",
                    (f"{name}{_DONE}{done}", done, now),
                )

    # -- taint ------------------------------------------------------------------------------------

    @writes
    def add_taint(self, session_id: str, sources: Iterable[TaintSource]) -> None:
        """Record taint sources of a session; a (kind, label) already recorded is kept as it was."""
        now = time.time()
        with self._conn:
            self._conn.executemany(
                "INSERT OR IGNORE INTO taint (session_id, kind, label, created_at)"
                " VALUES (?, ?, ?, ?)",
                [(session_id, s.kind, valid_text(s.label), now) for s in sources],
            )

    def taint_sources(self, session_id: str) -> list[TaintSource]:
        """Return a session's taint sources, oldest first."""
        rows = self._conn.execute(
            "SELECT kind, label FROM taint WHERE session_id = ? ORDER BY rowid", (session_id,)
        )
        return [TaintSource(kind, label) for kind, label in rows]

    def find_by_external_id(self, adapter: str, external_id: str) -> Message | None:
        """The message an adapter posted with this external id, or None."""
        row = self._conn.execute(
            f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE adapter = ? AND external_id = ?",
            (adapter, external_id),
        ).fetchone()
        return None if row is None else _row_to_message(row)

    # -- view states ------------------------------------------------------------------------------

    @writes
    def add_view_state(self, session_id: str, data: bytes) -> int:
        """Append a compaction view for a session; the newest one wins.

        Args:
            session_id: The session.
            data: The view, msgspec JSON.

        Returns:
            The view state's id.
        """
        row = self._conn.execute(
            "INSERT INTO view_states (session_id, created_at, data) VALUES (?, ?, ?) RETURNING id",
            (session_id, time.time(), data),
        ).fetchone()
        assert row is not None
        return int(row[0])

    def latest_view_state(self, session_id: str) -> bytes | None:
        """Return the newest compaction view of a session, or None."""
        row = self._conn.execute(
            "SELECT data FROM view_states WHERE session_id = ? ORDER BY id DESC LIMIT 1",
            (session_id,),
        ).fetchone()
        return bytes(row[0]) if row else None

    # -- inspection and forks (kesoku sessions, kesoku trace) -------------------------------------

    def resolve_session(self, id_or_prefix: str, *, min_prefix_chars: int = 4) -> Session:
        """Return the session with this id, or the only one whose id starts with it.

        Args:
            id_or_prefix: A whole id, or a prefix of at least ``min_prefix_chars`` characters.
            min_prefix_chars: The shortest prefix accepted (a shorter one must be a whole id).

        Returns:
            The session.

        Raises:
            UnknownSessionError: No session has this id or prefix; the message says when the prefix
                is too short to be tried.
            AmbiguousSessionError: Several sessions start with the prefix.
        """
        session = self.get_session(id_or_prefix)
        if session is not None:
            return session
        if len(id_or_prefix) < min_prefix_chars:
            # Say why: "8" may well be the start of an id the user sees listed.
            raise UnknownSessionError(
                f"no such session; give at least {min_prefix_chars} characters of the id"
            )
        rows = self._conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE substr(id, 1, ?) = ?"
            " ORDER BY created_at, id",
            (len(id_or_prefix), id_or_prefix),
        ).fetchall()
        if len(rows) == 1:
            return _row_to_session(rows[0])
        if rows:
            raise AmbiguousSessionError([_row_to_session(r) for r in rows])
        raise UnknownSessionError("no such session")

    @writes
    def fork_session(
        self,
        session_id: str,
        *,
        adapter: str,
        channel_id: str,
        workspace_root: str | os.PathLike[str],
        at_message_id: int | None = None,
    ) -> Session:
        """Create a session whose ``parent_id`` is ``session_id`` and copy its history into it.

        The copy is the history in logical order up to and including ``at_message_id`` (all of it
        when None), in one transaction. Copies get new ids; their ``root_id`` and ``parent_id``
        point at the copies; ``external_id`` is dropped (it belongs to the original's platform
        message); a user message still pending or processing becomes interrupted, since no turn will
        run it in the fork. The workspace folder is not copied.

        Args:
            session_id: The session to fork.
            adapter: The new session's adapter (``terminal`` makes it a ``kesoku chat --session``
                one).
            channel_id: The new session's channel, unique for the adapter.
            workspace_root: The sessions folder.
            at_message_id: The last message to copy.

        Returns:
            The new session.

        Raises:
            UnknownSessionError: No such session, or ``at_message_id`` is not one of its messages.
        """
        original = self.get_session(session_id)
        if original is None:
            raise UnknownSessionError(f"no session {session_id!r}")
        history = self.history(session_id)
        if at_message_id is not None:
            ends = [i for i, m in enumerate(history) if m.id == at_message_id]
            if not ends:
                raise UnknownSessionError(f"message {at_message_id} is not in session {session_id}")
            history = history[: ends[0] + 1]
        with self._conn:  # the fork appears with its whole history or not at all
            fork = self.create_session(
                adapter,
                channel_id,
                workspace_root=workspace_root,
                title=original.title,
                llm=original.llm,
                parent_id=original.id,
                metadata={"forked_at": at_message_id} if at_message_id is not None else {},
            )
            new_ids: dict[int, int] = {}
            now = time.time()
            for msg in history:
                status = (
                    Status.INTERRUPTED
                    if msg.status in (Status.PENDING, Status.PROCESSING)
                    else msg.status
                )
                # 0: it opens its turn (the store fills in its id)
                copy = msgspec.structs.replace(
                    msg,
                    id=0,
                    session_id=fork.id,
                    status=status,
                    root_id=new_ids.get(msg.root_id, 0),
                    parent_id=None if msg.parent_id is None else new_ids.get(msg.parent_id),
                    external_id=None,
                )
                new_ids[msg.id] = self._insert(copy, now).message.id
        return fork

    def view_states(self, session_id: str) -> list[ViewStateRecord]:
        """Return every compaction view of a session, oldest first.

        The trace shows each as a marker.
        """
        rows = self._conn.execute(
            "SELECT id, created_at, data FROM view_states WHERE session_id = ? ORDER BY id",
            (session_id,),
        )
        return [ViewStateRecord(int(i), float(t), bytes(d)) for i, t, d in rows]


class ViewStateRecord(NamedTuple):
    """One stored compaction view."""

    id: int
    created_at: float
    """UNIX seconds."""
    data: bytes
    """The view, msgspec JSON (its fields belong to kesoku's compaction)."""
