"""A session's history kept in memory by its worker, so each model call costs what is new, not all of it.

The store is the truth; this is a cache that only ever reads rows with ids above the last one it saw
(``Store.messages_after``), inserts them in history order ``(root_ts, ts, id)``, and folds them into an
incremental :class:`~kesoku.transcript.Transcript`. Almost every new message sorts last (a turn's own
posts, a new user message), so folding is an append; one that sorts earlier (an interrupted turn's
late tool result) makes the transcript rebuild from the cached list, never from the store.
"""

from __future__ import annotations

import bisect

from kesoku.llm.ir import LLMTurn
from kesoku.model import Kind, Message
from kesoku.store import MessageFilter, Store
from kesoku.transcript import Transcript, TurnChecker

READ_BATCH = 1024
"""Rows read from the store per query while catching up."""


def _key(msg: Message) -> tuple[float, float, int]:
    return (msg.root_ts, msg.ts, msg.id)


class SessionHistory:
    """One session's messages in history order, with request turns built incrementally.

    Args:
        store: The store (used from the trio thread).
        session_id: The session.
    """

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.messages: list[Message] = []
        self._keys: list[tuple[float, float, int]] = []
        self._filter = MessageFilter.from_kwargs({"session_id": session_id})
        self._last_id = 0
        self._transcript: Transcript | None = None
        self._folded = 0  # messages[:_folded] are in the transcript
        self._unanswered: dict[int, Message] = {}  # tool calls without a result, by id
        self.checker = TurnChecker()
        """Checks this session's requests, re-checking only what changed (see TurnChecker)."""

    def sync(self) -> int:
        """Read the session's messages written since the last sync.

        Returns:
            How many were new.
        """
        count = 0
        while True:
            rows = self.store.messages_after(self._last_id, self._filter, limit=READ_BATCH)
            for msg in rows:
                self._insert(msg)
            count += len(rows)
            if len(rows) < READ_BATCH:
                return count

    def _insert(self, msg: Message) -> None:
        self._last_id = max(self._last_id, msg.id)
        key = _key(msg)
        if not self._keys or key > self._keys[-1]:
            self.messages.append(msg)
            self._keys.append(key)
        else:
            at = bisect.bisect(self._keys, key)
            self.messages.insert(at, msg)
            self._keys.insert(at, key)
            if at < self._folded:
                self._transcript = None  # it sorts inside what was folded: rebuild
        if msg.kind is Kind.TOOL_CALL:
            self._unanswered[msg.id] = msg
        elif msg.kind is Kind.TOOL_RESULT and msg.parent_id is not None:
            self._unanswered.pop(msg.parent_id, None)

    def unanswered(self) -> list[Message]:
        """Tool calls that have no result, in id order."""
        return [self._unanswered[i] for i in sorted(self._unanswered)]

    def turns(self, root: Message) -> list[LLMTurn]:
        """The request turns of the history up to ``root``'s turn.

        Later user messages are left out: they interrupt this turn and open the next one. Call
        :meth:`sync` first so the turn's own posts are in.
        """
        end = bisect.bisect(self._keys, (root.root_ts, float("inf"), 0))
        folded = self._transcript is not None and end >= self._folded
        if folded and end > self._folded and self._transcript is not None:
            folded = self._transcript.extend(self.messages[self._folded : end])
        if not folded or self._transcript is None:
            self._transcript = Transcript(self.messages[:end])
        self._folded = end
        return self._transcript.turns()
