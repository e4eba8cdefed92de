"""A session's history kept in memory by its worker, so each model call costs only what is new.

The store is the truth; this is a cache of it. The first :meth:`SessionHistory.sync` reads the
session in history order (one query along the store's history index, no sort); from then on a
gateway listener of the session feeds it (what this process posts arrives from memory, anything else
from the store, in id order, exactly once). It inserts each message in history order
``(root_ts, ts, id)`` and folds it into an incremental
:class:`~kesoku.vocab.transcript.Transcript`. Almost every new message sorts last (a turn's own
posts, a new user message), so folding is an append; one that sorts earlier (an interrupted turn's
late tool result) makes the transcript rebuild from the cached list, never from the store.

The session's compacted view (the newest ``view_state``, see :mod:`kesoku.vocab.view`) is
applied here: archived messages are left out, evicted tool results shown as stubs, and the archives'
text leads the first user turn.
"""

from __future__ import annotations

import bisect
import operator

from kesoku.gateway import Gateway, Listener
from kesoku.vocab.ir import LLMTurn
from kesoku.vocab.model import Kind, Message
from kesoku.vocab.transcript import Transcript, TurnChecker, gc_paused
from kesoku.vocab.view import ViewState, archive_start, key, with_head

_ID = operator.attrgetter("id")


class SessionHistory:
    """One session's messages in history order, with request turns built incrementally.

    Args:
        gateway: The gateway (used from the trio thread); the first :meth:`sync` reads the session
            from its store, and the history listens to it after what that read.
        session_id: The session.
    """

    def __init__(self, gateway: Gateway, session_id: str) -> None:
        self.session_id = session_id
        # Searched by their history-order key (bisect's key=): a list of keys would be one more
        # object per message, made on the first sync and kept by the worker.
        self.messages: list[Message] = []
        self._gateway = gateway
        self._listener: Listener | None = None  # from the first sync
        self._closed = False
        self._transcript: Transcript | None = None
        self._folded = 0  # messages[:_folded] are in the transcript
        self._unanswered: dict[int, Message] = {}  # tool calls without a result, by id
        self.checker = TurnChecker()
        """Checks this session's requests, re-checking only what changed (see TurnChecker)."""
        stored = gateway.store.latest_view_state(session_id)
        self.view: ViewState | None = ViewState.decode(stored) if stored is not None else None
        """The compacted view requests are built under (None: the whole history)."""
        self._start = 0  # messages[_start:] are sent (the rest is archived)
        self._head: tuple[LLMTurn, LLMTurn] | None = (
            None  # (first turn, the same with the archives' text)
        )

    def set_view(self, view: ViewState) -> None:
        """Build requests under a new view from now on (after a compaction stored it)."""
        self.view = view
        self._transcript = None
        self._head = None

    def sync(self) -> int:
        """Take in the session's messages posted since the last sync.

        Returns:
            How many were new.
        """
        if self._listener is None:
            return self._read() if not self._closed else 0
        rows = self._listener.take_ready()
        for msg in rows:
            self._insert(msg)
        return len(rows)

    def _read(self) -> int:
        """The first sync: the whole session from the store, then a listener after what it held.

        One query in history order instead of a listener's replay from message 0 (id order, in
        batches the store sorts one by one). No message is missed between the two: a commit after
        the read's snapshot (by this process or another) has a larger id than any it holds, and the
        listener starts from the largest.
        """
        with gc_paused():
            rows = self._gateway.store.history(self.session_id)
        last = max(map(_ID, rows), default=0)
        self._listener = self._gateway.listen(after=last, session_id=self.session_id)
        self.messages = rows
        # What _track makes of them in id order, without the sort: a call stays unanswered unless a
        # result with a larger id names it (a result before its call in id order answers nothing).
        # One pass, the members in locals (read from their enum class, each costs ~90 ns on 3.11).
        call, result = Kind.TOOL_CALL, Kind.TOOL_RESULT
        unanswered: dict[int, Message] = {}
        results: list[Message] = []
        for msg in rows:
            kind = msg.kind
            if kind is call:
                unanswered[msg.id] = msg
            elif kind is result:
                results.append(msg)
        for msg in results:
            parent = msg.parent_id
            if parent is not None and msg.id > parent:
                unanswered.pop(parent, None)
        self._unanswered = unanswered
        return len(rows)

    def close(self) -> None:
        """Stop following the session (the worker that owns the history is done)."""
        self._closed = True
        if self._listener is not None:
            self._listener.close()

    def _insert(self, msg: Message) -> None:
        messages = self.messages
        where = key(msg)
        if not messages or where > key(messages[-1]):
            messages.append(msg)
        else:
            at = bisect.bisect(messages, where, key=key)
            messages.insert(at, msg)
            if at < self._folded:
                self._transcript = None  # it sorts inside what was folded: rebuild
        self._track(msg)

    def _track(self, msg: Message) -> None:
        """Keep the calls without a result up to date; messages come in id order."""
        if msg.kind is Kind.TOOL_CALL:
            self._unanswered[msg.id] = msg
        elif msg.kind is Kind.TOOL_RESULT and msg.parent_id is not None:
            self._unanswered.pop(msg.parent_id, None)

    def unanswered(self) -> list[Message]:
        """Tool calls that have no result, in id order."""
        return [self._unanswered[i] for i in sorted(self._unanswered)]

    def up_to(self, root: Message) -> list[Message]:
        """The messages up to the end of ``root``'s turn (later user messages open later turns)."""
        return self.messages[: self._end(root)]

    def _end(self, root: Message) -> int:
        return bisect.bisect(self.messages, (root.root_ts, float("inf"), 0), key=key)

    def turns(self, root: Message) -> list[LLMTurn]:
        """The request turns of the history up to ``root``'s turn, under the compacted view.

        Later user messages are left out: they interrupt this turn and open the next one. Call
        :meth:`sync` first so the turn's own posts are in.
        """
        end = self._end(root)
        view = self.view
        start = min(archive_start(self.messages, view), end)
        if start != self._start:
            self._transcript, self._start = None, start
        folded = self._transcript is not None and end >= self._folded
        if folded and end > self._folded and self._transcript is not None:
            folded = self._transcript.extend(self._shown(self._folded, end))
        if not folded or self._transcript is None:
            with gc_paused():  # the whole history (but for the archived part)
                self._transcript = Transcript(self._shown(start, end))
        self._folded = end
        turns = self._transcript.turns()
        head = view.head_text() if view is not None else None
        if head is None or not turns:
            return turns
        # The first turn with the archives' text is built once per first turn, so the request's
        # turns stay the same objects from one call to the next (the checker and turn log rely on
        # it).
        if self._head is None or self._head[0] != turns[0]:
            self._head = (turns[0], with_head(turns[:1], head)[0])
        return [self._head[1], *turns[1:]]

    def _shown(self, start: int, end: int) -> list[Message]:
        view = self.view
        part = self.messages[start:end]
        if view is None or (view.evict_before is None and not view.shortened):
            return part
        return [view.shown(m) for m in part]
