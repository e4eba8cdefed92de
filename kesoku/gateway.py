"""The gateway: a durable pub/sub log of messages (ARCHITECTURE.md, "Gateway delivery").

``post()`` writes to SQLite first, then wakes listeners. ``listen()`` is an async iterator with a
cursor (the last message id it yielded): it never misses a message, whether the listener was slow,
restarted from a saved cursor, or the message was written by another process.

How delivery stays both fast and lossless:

- Fast path: a message posted in this process is handed straight to each matching listener's buffer.
- Each buffer is bounded (``listener_buffer``). A listener that falls further behind drops its
  buffer and becomes *stale*: it catches up by reading the store from its cursor, one bounded batch
  at a time. A slow listener therefore costs at most one buffer of memory.
- Ids come from SQLite's AUTOINCREMENT, so they only grow. When a freshly assigned id is not the
  previous one plus one, some other connection wrote in between (or a duplicate insert consumed an
  id): every listener turns stale and reads the store, which sees the other writer's rows in order.
- Messages from another process: while any listener waits, the gateway's one task holds the
  process's inbox (:mod:`kesoku.store.wakeup`), a FIFO to which every other process's store writes
  a byte after it commits messages (never our own: a process does not wake itself). Woken, the task
  wakes one waiting listener, which checks ``PRAGMA data_version`` (it changes when another
  connection commits); when it changed, every listener reads the store. The byte only says "look":
  the store says what is new. Looks are at least :data:`LOOK_GAP_S` apart, so another process's
  flood of posts costs one look per gap. A slow poll (``poll_interval_s``) remains for what can be
  missed (:mod:`kesoku.store.wakeup` lists it); without an inbox (its folder unusable) the poll runs
  every :data:`UNWATCHED_POLL_S`. The task is a trio system task started by the first listener that
  waits, so that the many listeners of a busy process do not each pay for a cancel scope with a
  deadline on every wait.

Everything here runs on the trio thread and never awaits between reading the store and updating a
listener, so a post cannot slip between a listener's catch-up query and its switch back to the fast
path.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import msgspec
import trio

from kesoku.config.redact import Redactor
from kesoku.store import MessageFilter, Store
from kesoku.store.locks import SessionLocks
from kesoku.store.store import Inserted
from kesoku.store.wakeup import SETTLE_S
from kesoku.vocab.errors import OperatorError, StoreBusyError, StoreError
from kesoku.vocab.model import Message, Session, check_message
from kesoku.vocab.schedule import Schedule

log = logging.getLogger(__name__)

BUSY_RETRY_S = 1.0
"""While another connection holds the database's write lock, the longest pause between a post's
tries (the first pauses are shorter: most locks are held for milliseconds)."""
BUSY_FIRST_PAUSE_S = 0.01
"""The pause after a post's first busy try; each next pause doubles, up to :data:`BUSY_RETRY_S`."""
BUSY_GIVE_UP_S = 30.0
"""How long a post keeps trying a locked database (after the store's busy timeout) before it fails
with one line."""
BUSY_TRY_MS = 50
"""How long each try waits for the lock (blocking the loop that long at most)."""

LISTENER_BUFFER = 1024
"""Messages a listener may hold in memory before it falls back to reading the store."""
POLL_INTERVAL_S = 1.0
"""How often a waiting listener checks for commits by other processes when it was not woken: the
safety net under the wake-ups (:mod:`kesoku.store.wakeup` says when it is needed)."""
LOOK_GAP_S = 0.001
"""The shortest time between two looks for other processes' commits: under another process's flood
of posts (a byte per commit) this process looks once per gap, not once per commit."""
UNWATCHED_POLL_S = 0.05
"""The poll interval of a process without an inbox (at most ``poll_interval_s``): delivery from
other processes within ~50 ms."""
POST_YIELD_S = 0.0005
"""A task that keeps posting yields to the other tasks at least this often (see
:meth:`Gateway.post`)."""


def make_workspace(path: str | os.PathLike[str]) -> None:
    """Create a session's workspace folder (and its parents) if it is missing.

    Raises:
        OperatorError: The folder cannot be made (a parent is a file, no permission, a full disk):
            one line naming it, for the person who set ``workspace.sessions_dir``, not a traceback.
    """
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperatorError(
            f"cannot create the session folder {path}: {exc.strerror or exc} "
            "(workspace.sessions_dir)"
        ) from None


class Gateway:
    """Post messages durably and deliver them to listeners.

    Posting and waking happen in the caller's task, and each listener does its own catching up; the
    gateway's only task watches for other processes' commits (see the module docstring). Create one
    per process over one :class:`~kesoku.store.Store`.

    Args:
        store: The store; the gateway uses it from the trio thread only.
        sessions_dir: The folder that holds session workspaces (``<sessions_dir>/<session_id>/``).
        listener_buffer: The memory bound of each listener, in messages.
        poll_interval_s: How often a waiting listener looks for other processes' commits when not
            woken (the safety poll under the wake-ups of :mod:`kesoku.store.wakeup`).
        post_yield_s: How long posts may follow each other without yielding to other tasks; 0 makes
            every post yield.
        redactor: Masks secrets in every message before it is stored and delivered
            (:mod:`kesoku.config.redact`); None stores messages as they are.
    """

    def __init__(
        self,
        store: Store,
        sessions_dir: str | os.PathLike[str],
        *,
        listener_buffer: int = LISTENER_BUFFER,
        poll_interval_s: float = POLL_INTERVAL_S,
        post_yield_s: float = POST_YIELD_S,
        redactor: Redactor | None = None,
    ) -> None:
        if listener_buffer < 1:
            raise ValueError("listener_buffer must be at least 1")
        self.store = store
        self.sessions_dir = Path(sessions_dir)
        self.locks = SessionLocks(self.sessions_dir / ".locks")
        """The sessions this process runs (one process at a time runs a session)."""
        self.listener_buffer = listener_buffer
        self.poll_interval_s = poll_interval_s
        self.post_yield_s = post_yield_s
        self._try_ms = min(BUSY_TRY_MS, store.busy_timeout_ms)  # a post's wait per try for the lock
        self.redactor = redactor
        """What masks the secrets of messages (and of the turn logs and prompts that use them)."""
        self._yielded_at = 0.0  # time.perf_counter() when a post last yielded
        # Weak: a listener dropped without being closed unregisters itself when it is collected.
        self._listeners: weakref.WeakSet[Listener] = weakref.WeakSet()
        # The same listeners as tuples of weak references, for _deliver: iterating a WeakSet costs
        # more than the rest of a hand-over. Rebuilt on listen() and close(); a dead reference is
        # skipped. Listeners of given sessions (every worker's history) are kept by session, so a
        # post wakes only its own session's: with thousands of live sessions a scan of all would
        # cost O(sessions).
        self._fanout: tuple[weakref.ref[Listener], ...] = ()
        self._by_session: dict[str, tuple[weakref.ref[Listener], ...]] = {}
        self._last_id = store.last_message_id()
        self._data_version = store.data_version()
        self._stop_handler: Callable[..., bool] | None = None
        self._watch_token: trio.lowlevel.TrioToken | None = None  # the run whose watch task runs
        self._watch_idle: trio.Event | None = None  # set to restart the watch once a listener waits

    # -- posting ----------------------------------------------------------------------------------

    async def post(self, message: Message) -> Message:
        """Persist a message, then wake the listeners it matches.

        A message whose ``(adapter, external_id)`` is already stored is not written again: the
        stored message is returned and no listener is woken. With a ``redactor``, what is stored,
        delivered and returned is the masked message (see :meth:`post_many`).

        Args:
            message: A new message (``id == 0``) of an existing session.

        Returns:
            The stored message with its id, ``ts``, ``root_ts`` and ``root_id`` filled in.

        Raises:
            MessageError: The message breaks the role, kind or sender rules (nothing is written).
            UnknownSessionError: Its session does not exist (nothing is written).

        Cancellation:
            If the caller is already cancelled, nothing is written and ``trio.Cancelled`` is raised.
            Once the write starts the post completes and returns: it is never half done.

        Scheduling:
            A post yields to the other tasks (the listeners it woke among them) unless a post
            yielded less than ``post_yield_s`` ago. A lone post therefore behaves as a full
            checkpoint, while a task posting in a loop lets the listeners run once per
            ``post_yield_s`` and take all the messages of that slice in one step each, instead of
            three trips through the scheduler per post. The store is written and the listeners'
            buffers filled before ``post()`` returns either way; only when the listener tasks run
            changes.
        """
        (stored,) = await self.post_many((message,))
        return stored

    async def post_many(self, messages: Sequence[Message]) -> list[Message]:
        """Persist several messages in one transaction, then wake listeners once per message.

        The runtime uses this to post all tool calls (or all tool results) of a model step together.
        With a ``redactor``, each message's ``content`` and the strings of its
        ``metadata.tool_arguments`` are masked first (:meth:`Redactor.mask_message`): the masked
        message is what is checked, stored, delivered to listeners and returned, so the model's next
        request (built from what listeners got) never holds the secret either.

        Args:
            messages: New messages, in the order their ids should follow.

        Returns:
            The stored messages, in order (duplicates as already stored).

        Raises:
            MessageError: A message breaks the rules (nothing is written).
            UnknownSessionError: A session does not exist (nothing is written).

        Cancellation:
            As :meth:`post`: all or nothing, never cancelled half way.

        Scheduling:
            As :meth:`post`.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self.redactor is not None:
            messages = [self.redactor.mask_message(message) for message in messages]
        for message in messages:
            check_message(message)
        try:
            # The first try inline, not in a coroutine of its own: one fewer coroutine per post.
            results = self.store.insert_messages(messages, busy_timeout_ms=self._try_ms)
        except StoreBusyError:
            results = await self._insert_when_busy(messages)
        for inserted in results:
            if inserted.new:
                self._deliver(inserted.message, inserted.adapter)
        # Wall time, not trio's clock: under a test's autojump clock trio time stands still while
        # tasks run.
        if time.perf_counter() - self._yielded_at >= self.post_yield_s:
            # Shielded: the rows are committed, so the caller must get them back rather than
            # Cancelled.
            await trio.lowlevel.cancel_shielded_checkpoint()
            self._yielded_at = time.perf_counter()
        return [inserted.message for inserted in results]

    async def _insert_when_busy(self, messages: Sequence[Message]) -> list[Inserted]:
        """Store messages after a busy first try, waiting out the lock without blocking the loop.

        Each try waits at most :data:`BUSY_TRY_MS` for the lock, and the post sleeps between tries
        (from :data:`BUSY_FIRST_PAUSE_S` doubling to :data:`BUSY_RETRY_S`), so other sessions, the
        terminal and signals go on. Once the wait passes the store's busy timeout it is visible: one
        warning naming the database and the lock's holder when known; :data:`BUSY_GIVE_UP_S` later a
        one-line :class:`~kesoku.vocab.errors.StoreError`.

        Raises:
            StoreError: The database stayed locked past the busy timeout and :data:`BUSY_GIVE_UP_S`.

        Cancellation:
            A busy try wrote nothing, so a cancelled wait leaves nothing half done.
        """
        started = trio.current_time() - self._try_ms / 1000  # the first try waited that long
        warned_at: float | None = None
        pause = BUSY_FIRST_PAUSE_S
        while True:
            await trio.sleep(pause)
            pause = min(pause * 2, BUSY_RETRY_S)
            try:
                return self.store.insert_messages(messages, busy_timeout_ms=self._try_ms)
            except StoreBusyError as exc:
                now, by = trio.current_time(), f"held by {exc.holder}"
                if warned_at is None and now - started >= self.store.busy_timeout_ms / 1000:
                    warned_at = now
                    log.warning("database busy (%s), waiting… (%s)", by, self.store.path)
                elif warned_at is not None and now - warned_at >= BUSY_GIVE_UP_S:
                    raise StoreError(
                        f"{self.store.path}: the database stayed locked for "
                        f"{BUSY_GIVE_UP_S:g} s ({by}); the message was not stored"
                    ) from None

    def _deliver(self, message: Message, adapter: str) -> None:
        """Hand a message just stored to each listener it matches (its buffer, then a wake-up).

        Runs once per message and listener: kept to plain comparisons, no calls it can avoid (the
        filter is asked only for a listener that does not take everything of its session, or of the
        log; the first message of a post slice reschedules a waiting listener's task).
        """
        if message.id != self._last_id + 1:
            # Another connection wrote the ids in between: only the store knows them, in order.
            self._resync_all()
        else:
            bound = self.listener_buffer
            for refs in (self._fanout, self._by_session.get(message.session_id, ())):
                for ref in refs:
                    listener = ref()
                    if listener is None or listener._stale:  # a stale one reads the store anyway
                        continue
                    if not listener._takes_all and not listener.filter.matches(message, adapter):
                        continue
                    buffer = listener._buffer
                    held = len(buffer)
                    if held >= bound:
                        listener._mark_stale()
                        continue
                    buffer.append(message)
                    if held >= listener.max_buffered:
                        listener.max_buffered = held + 1
                    if listener._task is not None:
                        listener._wake()
        if message.id > self._last_id:
            self._last_id = message.id

    def _resync_all(self) -> None:
        self._data_version = self.store.data_version()
        self._last_id = max(self._last_id, self.store.last_message_id())
        for listener in self._listeners:
            listener._mark_stale()

    def _check_other_writers(self) -> None:
        """Resync every listener if another connection committed since we last looked."""
        if self.store.data_version() != self._data_version:
            self._resync_all()

    def _forget(self, listener: Listener) -> None:
        self._listeners.discard(listener)
        sessions = listener.filter.session_id
        if sessions is None:
            self._fanout = tuple(ref for ref in self._fanout if ref() not in (listener, None))
            return
        for session_id in sessions:
            refs = tuple(
                ref for ref in self._by_session.get(session_id, ()) if ref() not in (listener, None)
            )
            if refs:
                self._by_session[session_id] = refs
            else:
                self._by_session.pop(session_id, None)

    def _watch_needed(self) -> None:
        """Start this run's commit watch if it is not running; a listener calls this to wait."""
        token = trio.lowlevel.current_trio_token()
        if token is not self._watch_token:
            # A system task: it lives as long as this trio.run, not as long as some caller's
            # nursery. (A gateway may outlive a run: the previous run's task ended with it.)
            self._watch_token = token
            self._watch_idle = None
            trio.lowlevel.spawn_system_task(self._watch_commits, name="kesoku gateway commit watch")
        elif self._watch_idle is not None:
            self._watch_idle.set()
            self._watch_idle = None

    async def _watch_commits(self) -> None:
        """While listeners wait, look for other processes' commits each time they wake us.

        Looks when a byte arrives in the inbox, :data:`~kesoku.store.wakeup.SETTLE_S` after opening
        it (a sender may not list it yet), and every ``poll_interval_s`` when not woken. The inbox
        lives as long as this task (one trio run).

        It wakes a waiting listener to look rather than reading the store itself: a store error then
        surfaces in that listener's task, where a system task would crash the whole run; and a store
        closed in a worker thread at shutdown is never used from two threads.
        """
        wakeups = self.store.wakeups
        inbox = wakeups.open_inbox() if wakeups is not None else None
        poll_s = self.poll_interval_s
        if inbox is None:
            poll_s = min(poll_s, UNWATCHED_POLL_S)
        timeout = SETTLE_S if inbox is not None else poll_s
        looked_at = -LOOK_GAP_S
        try:
            while True:
                if not any(listener._task is not None for listener in self._listeners):
                    # No deadline while nothing waits: an idle process stays asleep. Bytes sent
                    # meanwhile wait in the inbox.
                    event = self._watch_idle = trio.Event()
                    await event.wait()
                with trio.move_on_after(timeout):
                    if inbox is None:
                        await trio.sleep_forever()
                    else:
                        await inbox.wait()
                        pause = looked_at + LOOK_GAP_S - trio.current_time()
                        if pause > 0:
                            await trio.sleep(pause)
                            inbox.take()  # the look below comes after these commits too
                timeout = poll_s
                looked_at = trio.current_time()
                waiting = next(
                    (listener for listener in self._listeners if listener._task is not None), None
                )
                if waiting is not None:
                    waiting._poll()
                else:
                    timeout = 0  # none waits any more: the next listener that waits looks first
        finally:
            if inbox is not None:
                inbox.close()

    # -- listening --------------------------------------------------------------------------------

    def listen(self, *, after: int | None = None, **filters: Any) -> Listener:
        """Iterate over messages as they are posted, from a cursor on.

        Use it as ``async for msg in gateway.listen(role="user"):`` or, to unregister at a known
        point, ``with gateway.listen(...) as messages:``. Save ``msg.id`` as the cursor of a
        listener that must resume after a restart (:meth:`Store.set_cursor`).

        Args:
            after: Yield messages with an id greater than this; None starts after the newest message
                now stored (only new messages); 0 replays the whole log.
            **filters: session_id, role, kind, status, sender, adapter; each a string (or enum) or a
                collection of them.

        Returns:
            The listener, an async iterator of :class:`~kesoku.vocab.model.Message` in id order.

        Raises:
            TypeError: An unknown filter.
            ValueError: A filter value that matches nothing.
        """
        flt = MessageFilter.from_kwargs(filters)
        cursor = self.store.last_message_id() if after is None else after
        listener = Listener(self, flt, cursor)
        self._listeners.add(listener)
        ref = weakref.ref(listener)
        if flt.session_id is None:
            self._fanout = (*self._fanout, ref)
        else:
            for session_id in flt.session_id:
                self._by_session[session_id] = (*self._by_session.get(session_id, ()), ref)
        return listener

    # -- sessions ---------------------------------------------------------------------------------

    def open_session(
        self,
        adapter: str,
        channel_id: str,
        *,
        created_at: float | None = None,
        title: str | None = None,
        llm: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Session:
        """Return the session of a platform thread or space, creating it and its workspace folder.

        Args:
            adapter: The adapter's chatbot id.
            channel_id: The platform's thread or space id.
            created_at: UNIX seconds of the first platform message; now when None.
            title: A title, if known.
            llm: A backend override.
            metadata: Of a new session: ``{"context": text}`` adds the platform's context (server,
                channel, members) to the system prompt.

        Returns:
            The session; its workspace folder exists.

        Raises:
            OperatorError: The workspace folder cannot be made; a session this call created is
                removed.
        """
        existing = self.store.find_session(adapter, channel_id)
        session = existing or self.store.create_session(
            adapter,
            channel_id,
            workspace_root=self.sessions_dir,
            created_at=created_at,
            title=title,
            llm=llm,
            metadata=metadata,
        )
        try:
            make_workspace(session.workspace)
        except OperatorError:
            if (
                existing is None
            ):  # else every list would show an empty "untitled" session no one can use
                self.store.delete_session(session.id)
            raise
        return session

    # -- the queries adapters need (the store stays behind the gateway) ------------------------

    @property
    def db_path(self) -> str:
        """The database file (for work done in another thread, such as rendering a trace page)."""
        return self.store.path

    def get_session(self, session_id: str) -> Session | None:
        """The session, or None if there is no such session (deleted, or never made)."""
        return self.store.get_session(session_id)

    def find_session(self, adapter: str, channel_id: str) -> Session | None:
        """The session of a platform thread or space, or None when there is none yet."""
        return self.store.find_session(adapter, channel_id)

    def schedules_of(self, session: Session) -> list[Schedule]:
        """The schedules a conversation made or runs in (``/schedules``), by name.

        A schedule runs in it when its target names the session, or its chat channel
        (``discord:<id>``, ``gchat:<space>``).
        """
        here = {f"session:{session.id}", f"discord:{session.channel_id}"}
        here.add(f"gchat:{session.channel_id}")
        return [
            s for s in self.store.list_schedules() if s.created_by == session.id or s.target in here
        ]

    def resolve_session(self, id_or_prefix: str) -> Session:
        """The session whose id is ``id_or_prefix`` or the only one starting with it.

        Raises:
            UnknownSessionError: No session matches.
            AmbiguousSessionError: Several sessions start with the prefix.
        """
        return self.store.resolve_session(id_or_prefix)

    def get_message(self, message_id: int) -> Message | None:
        """The stored message, or None (its session was deleted)."""
        return self.store.get_message(message_id)

    def last_message_id(self) -> int:
        """The highest message id ever assigned (0 for a new database)."""
        return self.store.last_message_id()

    async def delete_session(self, session_id: str) -> bool:
        """Delete a session: its messages, view states and workspace folder.

        Args:
            session_id: The session.

        Returns:
            True if it existed.

        Cancellation:
            The database rows go first, in one transaction; if cancelled while the folder is being
            removed, the folder may remain, holding no messages.
        """
        session = self.store.delete_session(session_id)
        if session is None:
            await trio.lowlevel.checkpoint()
            return False
        # A workspace can hold many files: remove it off the event loop.
        await trio.to_thread.run_sync(shutil.rmtree, session.workspace, True)
        return True

    # -- turn control ---------------------------------------------------------------------------

    def set_stop_handler(self, handler: Callable[..., bool] | None) -> None:
        """Register the runtime that can stop turns (the dispatcher does this while it serves)."""
        self._stop_handler = handler

    def stop(self, session_id: str, *, force: bool = False) -> bool:
        """Stop the running turn of a session.

        Any adapter may call this (a stop button, /stop, Ctrl-C).

        The model stream is cut and the turn ends without pivoting to another message; a running
        tool finishes (or hits its timeout). A second stop, or ``force=True``, kills running tools:
        their results say ``killed``.

        Args:
            session_id: The session.
            force: Kill running tools now.

        Returns:
            False when no turn of that session runs in this process.
        """
        handler = self._stop_handler
        return handler(session_id, force=force) if handler is not None else False


class Listener:
    """One listener's cursor, filter and bounded buffer; an async iterator of messages.

    Created by :meth:`Gateway.listen`. Iteration yields messages in id order, each exactly once.

    Scheduling: a message already in the buffer is returned without yielding to other tasks (only
    cancellation is checked), so a listener drains what was handed to it without a trip through the
    scheduler per message. It yields whenever it waits and before every read of the store, so at
    least once per ``listener_buffer`` messages.
    """

    def __init__(self, gateway: Gateway, flt: MessageFilter, cursor: int) -> None:
        self.filter = flt
        self.cursor = cursor
        """The id of the last message yielded (or the starting point)."""
        self.max_buffered = 0
        """The most messages this listener has held in memory at once (a test and bench figure)."""
        self.store_reads = 0
        """How many times it read the store to catch up (the first read included)."""
        self._gateway = gateway
        # Whether every message the gateway considers for it passes the filter: none of it but the
        # session (a listener of given sessions is only offered their messages), so the gateway
        # skips the filter's call.
        self._takes_all = msgspec.structs.replace(flt, session_id=None) == MessageFilter()
        self._buffer: deque[Message] = deque()
        self._stale = True  # start by reading the store from the cursor
        self._task: trio.lowlevel.Task | None = None  # the task waiting in __anext__, to reschedule
        self._poll_due = False  # the watch task asks this listener to check for other writers
        self._closed = False

    def _mark_stale(self) -> None:
        self._stale = True
        self._buffer.clear()  # everything in it is past the cursor and will be read again
        self._wake()

    def _wake(self) -> None:
        task = self._task
        if task is not None:
            self._task = None  # rescheduled exactly once: by this, or by _abort on cancellation
            trio.lowlevel.reschedule(task)

    def _poll(self) -> None:  # the watch task asks this listener to look for other writers
        self._poll_due = True
        self._wake()

    def _abort(self, _: object) -> trio.lowlevel.Abort:
        self._task = None
        return trio.lowlevel.Abort.SUCCEEDED

    def _catch_up(self) -> None:
        limit = self._gateway.listener_buffer
        self._stale = False
        self._buffer.clear()
        self.store_reads += 1
        rows = self._gateway.store.messages_after(self.cursor, self.filter, limit=limit)
        self._buffer.extend(rows)
        self.max_buffered = max(self.max_buffered, len(self._buffer))
        # A full batch means more may wait in the store: stay stale until it is drained.
        self._stale = len(rows) == limit

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        """Return the next message after the cursor, waiting for one if needed.

        Raises:
            StopAsyncIteration: After :meth:`close`.

        Cancellation:
            Safe at any point: the cursor only moves when a message is returned. A cancelled caller
            gets ``trio.Cancelled`` even when a message is buffered; the message stays for the next
            call.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        buffer = self._buffer
        while True:
            while buffer:
                message = buffer.popleft()
                if message.id > self.cursor:
                    self.cursor = message.id
                    return message
            if self._closed:
                raise StopAsyncIteration
            await self._refill()

    async def _refill(self) -> None:
        """Wait one step for messages, the buffer being empty.

        The step reads the store (stale), looks for other writers' commits (asked to by the watch
        task), or parks until the gateway hands a message over or the listener is closed.
        """
        if self._stale:
            # A full checkpoint per store read: replaying a long backlog yields once per batch.
            await trio.lowlevel.checkpoint()
            if not self._closed:
                self._catch_up()
        elif self._poll_due:
            self._poll_due = False
            self._gateway._check_other_writers()
        else:
            self._gateway._watch_needed()
            # Parked without an Event or a cancel scope: _wake() reschedules this task directly.
            self._task = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort)

    def _drain(self) -> list[Message]:
        """Empty the buffer: the messages past the cursor, which moves past them."""
        ready: list[Message] = []
        buffer, cursor = self._buffer, self.cursor
        while buffer:
            message = buffer.popleft()
            if message.id > cursor:
                cursor = message.id
                ready.append(message)
        self.cursor = cursor
        return ready

    def take_ready(self) -> list[Message]:
        """Return, without waiting, every message after the cursor that can be had now, in id order.

        What the gateway handed over is returned from memory. Commits of other connections are
        looked for first (``PRAGMA data_version``, a few microseconds): when there are any, the
        listener reads the store (in batches of ``listener_buffer``) as :meth:`__anext__` would. The
        cursor moves past what is returned. For a reader that owns a listener but never waits on it
        (a session's history, synced before each model call).
        """
        self._gateway._check_other_writers()
        ready = self._drain()
        while self._stale and not self._closed:
            self._catch_up()
            ready += self._drain()
        return ready

    def close(self) -> None:
        """Stop receiving messages: a waiting or later iteration ends (StopAsyncIteration)."""
        self._closed = True
        self._gateway._forget(self)
        self._buffer.clear()
        self._wake()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


DELIVERED_WAIT_S = 600.0
"""How long :meth:`DeliveryCursor.delivered` waits at most. Minutes: a channel the platform does
not take for a while (its sends back off up to 60 s) holds only its own lane, and the end of its
turn must still come after its messages (a header edited, not posted anew before them)."""


class DeliveryCursor:
    """An adapter's durable place in the log, so each reply is delivered once across restarts.

    An adapter delivers its channels concurrently (:mod:`kesoku.delivery_lanes`), so messages
    finish out of id order. The place is therefore a low watermark, :attr:`position` (every message
    up to it handled), plus :attr:`done`, the ids handled above it; both are kept in the store after
    each message (:meth:`Store.set_cursor`). The reader follows
    ``gateway.listen(after=cursor.start(), adapter=...)``, calls :meth:`begin` for each message it
    reads (in id order) and :meth:`advance` once that message is delivered (or given up on for
    good). A restart listens after the watermark, and :meth:`begin` says which ids to skip. A reader
    that handles one message at a time may call :meth:`advance` alone.

    Args:
        gateway: The gateway whose log it follows (the cursor is kept in its store).
        name: The cursor's name, ``adapter:<chatbot_id>``.
    """

    def __init__(self, gateway: Gateway, name: str) -> None:
        self.store = gateway.store
        self.name = name
        self.position = 0
        """The low watermark: every message with an id up to it is handled."""
        self.done: set[int] = set()
        """Ids above :attr:`position` already handled (after a restart: some not read yet)."""
        self._open: deque[int] = deque()  # ids read past the watermark, ascending, done or not
        self._unread: set[int] = set()  # ids of done saved before a restart, not read again yet
        self._progress = trio.Event()

    @property
    def open(self) -> int:
        """How many messages were read past the watermark (being handled, or done out of order)."""
        return len(self._open)

    @property
    def oldest_open(self) -> int | None:
        """The id of the oldest message read and not handled yet, which holds the watermark."""
        return next((i for i in self._open if i not in self.done), None)

    def start(self) -> int:
        """The id to listen after: the saved watermark, or the newest stored message.

        An adapter's very first start begins after the newest message: older sessions are not
        replayed into a chat that never saw them.
        """
        saved = self.store.get_cursor(self.name)
        self.position = self.store.last_message_id() if saved is None else saved
        if saved is None:
            self.store.set_cursor(self.name, self.position)
        self.done = {i for i in self.store.cursor_done(self.name) if i > self.position}
        self._unread = set(self.done)
        self._open.clear()
        return self.position

    def begin(self, message_id: int) -> bool:
        """Record that the reader read ``message_id`` (ids come in increasing order).

        Returns:
            False when it was handled before (a restart): skip it. True: deliver it, then
            :meth:`advance`.
        """
        if message_id <= self.position:
            return False
        self._open.append(message_id)
        if message_id in self.done:
            self._unread.discard(message_id)
            self._settle()  # nothing to write: the store already says it is handled
            return False
        return True

    def advance(self, message_id: int) -> None:
        """Record that ``message_id`` was handled, save the place, and wake :meth:`delivered`."""
        if message_id <= self.position:
            return
        if not self._open or message_id > self._open[-1]:
            self._open.append(message_id)  # a reader that did not call begin()
        self.done.add(message_id)
        self._settle()
        above = message_id if message_id > self.position else None
        self.store.set_cursor(self.name, self.position, done=above)
        self._progress.set()
        self._progress = trio.Event()

    def _settle(self) -> None:
        """Move the watermark over the handled ids at the front."""
        moved = False
        while self._open and self._open[0] in self.done:
            self.position = self._open.popleft()
            self.done.discard(self.position)
            moved = True
        if moved and self._unread:
            # Ids saved before a restart whose messages were not read again (a session deleted).
            gone = {i for i in self._unread if i <= self.position}
            self._unread -= gone
            self.done -= gone

    async def delivered(self, session_id: str, *, timeout_s: float = DELIVERED_WAIT_S) -> None:
        """Wait until every stored message of a session is handled (bounded by ``timeout_s``)."""
        flt = MessageFilter.from_kwargs({"session_id": session_id})
        with trio.move_on_after(timeout_s):
            while True:
                # At most len(done) of them are handled: one more row shows whether any is not.
                ahead = self.store.messages_after(self.position, flt, limit=len(self.done) + 1)
                if all(m.id in self.done for m in ahead):
                    return
                await self._progress.wait()
