"""A session's trust state: its taint sources and the questions its tools ask (table ``taint``).

When a tool brings in content from outside the workspace's trust (a file read outside the workspace,
an attachment, a URL named in a shell line, an MCP server), the session records a taint source, once
per (kind, label). While a session is tainted the tools ask the user before a shell line outside the
allowlist and before run_code; a write outside the workspace asks in any case.

Sources are kept in memory at once (a tool in a worker thread may add one) and written to the store
by :meth:`SessionGuard.flush`, which the turn calls on the trio thread after each step's tool batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kesoku.tools.base import Approval, TaintSources
from kesoku.vocab.model import TaintSource

if TYPE_CHECKING:
    from kesoku.agent.questions import Questions
    from kesoku.store import Store
    from kesoku.vocab.model import Message

LABEL_MAX_CHARS = 300
"""A longer taint label (a URL, a path) is cut: it is for people to read, not to match."""


class SessionGuard(TaintSources):
    """The :class:`~kesoku.tools.base.Guard` of one session, shared by its turns.

    Args:
        store: Where taint sources are kept.
        questions: Where questions to the user go.
        session_id: The session.
    """

    def __init__(self, store: Store, questions: Questions, session_id: str) -> None:
        super().__init__(store.taint_sources(session_id))
        self.store = store
        self.questions = questions
        self.session_id = session_id
        self.root: Message | None = None
        """The running turn's root: questions are posted in its turn (set by the turn)."""
        self._unsaved: list[TaintSource] = []

    def add_taint(self, kind: str, label: str) -> None:
        """Record a taint source unless it is known.

        Thread-safe; written to the store by :meth:`flush`.
        """
        super().add_taint(
            kind, label if len(label) <= LABEL_MAX_CHARS else label[: LABEL_MAX_CHARS - 1] + "…"
        )

    def _added(self, source: TaintSource) -> None:
        self._unsaved.append(source)

    def flush(self) -> None:
        """Write the sources recorded since the last flush (call on the trio thread)."""
        with self._lock:
            unsaved, self._unsaved = self._unsaved, []
        if unsaved:
            self.store.add_taint(self.session_id, unsaved)

    async def confirm(self, question: str) -> Approval:
        """Ask the session's user to Allow or Deny.

        See :meth:`kesoku.agent.questions.Questions.ask`.

        Returns:
            The answer; denied at once when no turn is running (nobody to post the question to).

        Cancellation:
            The question is closed as dismissed and Cancelled propagates.
        """
        if self.root is None:
            return Approval(False, "no turn is running to ask in")
        return await self.questions.ask(self.root, question)
