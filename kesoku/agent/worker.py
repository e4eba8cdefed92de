"""SessionWorker: one session's queue of user messages, its running turn, interruption and stop.

Where it runs: ARCHITECTURE.md, "Task tree".

The dispatcher hands the worker every new user message of its session. While a turn runs, a new
message interrupts it (the model stream is cut; running tools finish) and the worker pivots: the
next turn answers every message still waiting, rooted on the newest, so the turn's messages sort
after all of them and the model sees the whole history.

A worker is idle when nothing waits for it: no turn running (a question to the user waits inside
its turn), no message queued, no ``/compact`` asked. After ``worker_idle_s`` idle it returns and its
session sheds what it held (the task, the history's listener, messages and transcript, the guard,
the lock: about 13 KB plus 1 KB a message); only what its compactor learned stays, with the
dispatcher (:meth:`SessionWorker.learned`). The dispatcher starts a new worker when the session
speaks again; it reloads the history, the compacted view and the taint from the store (about 25 µs
a message, on the event loop; ``bench/idle_bench.py``).
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING

import trio

from kesoku.agent.compaction.compactor import Compactor
from kesoku.agent.guard import SessionGuard
from kesoku.agent.history import SessionHistory
from kesoku.agent.turn import Turn, system_prompt
from kesoku.vocab.events import Compacted, TurnEnded, TurnStarted
from kesoku.vocab.metrics import TurnMetrics
from kesoku.vocab.model import Kind, Message, Role, Session, Status
from kesoku.vocab.spend import SpendKind

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime

log = logging.getLogger(__name__)

TITLE_MAX_CHARS = 48
"""Longest generated session title."""

Learned = tuple[float, float]
"""What a session's compactor learned, kept between its workers: the calibration ratio and the
summary cooldown's end (trio clock)."""


class SessionWorker:
    """Runs the turns of one session, one at a time.

    Args:
        rt: The runtime.
        session: The session.
        learned: What the session's previous worker learned about compacting it (see
            :meth:`learned`); None: nothing yet.
    """

    def __init__(self, rt: Runtime, session: Session, learned: Learned | None = None) -> None:
        self.rt = rt
        self.session = session
        self.turn: Turn | None = None
        """The running turn, if any."""
        self.pending: dict[int, Message] = {}
        """User messages waiting for the next turn, by id (their text is in the store too)."""
        self.current_roots: list[Message] = []
        """The user messages of the turn being prepared or run (what a crash marks failed)."""
        self.metrics: list[TurnMetrics] = []
        """Metrics of the last turns this worker ran (at most ten)."""
        self.history = SessionHistory(rt.gateway, session.id)
        """The session's history, read once per worker and then kept up to date incrementally."""
        self.guard = SessionGuard(rt.store, rt.questions, session.id)
        """The session's taint sources and the questions its tools ask."""
        self.compactor = Compactor(rt.store, rt.compaction)
        """The session's compaction state (calibration, summary cooldown)."""
        if learned is not None:
            self.compactor.calibration.ratio, self.compactor.cooldown_until = learned
        self.compact_requested = False
        """``/compact`` asked; runs when no turn is running."""
        self._wakeup = trio.Event()
        self._session_turns: int | None = None
        self.retiring = False
        """:meth:`retire` was called: return as soon as idle."""

    def learned(self) -> Learned | None:
        """What the next worker of the session needs of this one's compactor, once it returned.

        The provider's token ratio (an estimate off by it would overflow the window before
        compacting) and the summary cooldown while it runs. None when both are at their defaults,
        so a session that taught nothing keeps nothing.
        """
        ratio, cooldown = self.compactor.calibration.ratio, self.compactor.cooldown_until
        if ratio == 1.0 and cooldown <= trio.current_time():
            return None
        return (ratio, cooldown)

    def submit(self, message: Message) -> None:
        """Queue a user message; if a turn is running, interrupt it.

        A ``processing`` message (a turn a crash left open) queues without interrupting: it resumes.
        """
        if message.id in self.pending or (
            self.turn is not None and message.id in {r.id for r in self.turn.roots}
        ):
            return
        self.pending[message.id] = message
        if self.turn is not None and message.status is Status.PENDING:
            self.turn.interrupt()
        self._wakeup.set()

    def request_compaction(self) -> None:
        """Compact the session as soon as no turn runs (``/compact``).

        The result is a Compacted event.
        """
        self.compact_requested = True
        self._wakeup.set()

    def retire(self) -> None:
        """Return (letting the session's lock go) once no turn runs and nothing waits.

        The daemon calls it when the ``kesoku chat`` it answered for leaves: the session is the
        terminal's again, not held until ``worker_idle_s`` runs out.
        """
        self.retiring = True
        self._wakeup.set()

    def stop(self, *, force: bool = False) -> bool:
        """Stop the running turn (a second stop, or ``force``, kills running tools).

        Returns:
            False when no turn was running.
        """
        if self.turn is None:
            return False
        self.turn.stop(force=force)
        return True

    def kill_tools(self, reason: str) -> bool:
        """Kill the running turn's tools without stopping it (a shutdown).

        See :meth:`Turn.kill_tools`.

        Returns:
            False when no turn was running.
        """
        if self.turn is None:
            return False
        self.turn.kill_tools(reason)
        return True

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run turns while messages wait; return after ``worker_idle_s`` without any.

        Raises:
            Exception: A bug in a turn; the dispatcher marks the turn failed and tells the user.

        Cancellation:
            Cancelling (daemon shutdown) leaves the running turn ``processing``; it resumes at the
            next start.
        """
        # A session opened by another process (or whose folder was removed) may have no workspace
        # yet: its tools run there, and a shell cannot start in a folder that does not exist. The
        # common case (it exists) is one stat on the loop; a thread hop per session start would cost
        # more, and under a test's autojump clock it lets virtual time jump ahead before the first
        # turn starts.
        if not _is_dir(self.session.workspace):
            await trio.Path(self.session.workspace).mkdir(parents=True, exist_ok=True)
        task_status.started()
        while True:
            if self.compact_requested:
                self.compact_requested = False
                await self._compact()
            if not self.pending:
                if self.retiring:
                    return
                self._wakeup = trio.Event()
                with trio.move_on_after(self.rt.worker_idle_s):
                    await self._wakeup.wait()
                if not self.pending and not self.compact_requested:
                    return
                continue
            roots = [self.pending.pop(i) for i in sorted(self.pending)]
            await self._run_turn(roots)

    async def _run_turn(self, roots: list[Message]) -> None:
        self.current_roots = roots
        roots = self._drop_answered(roots)
        if not roots:
            return
        self._ensure_title(roots[0])
        if self._session_turns is None:  # counted once per worker, then kept up to date
            self._session_turns = self.rt.store.count_turns(self.session.id)
        llm = self.rt.llm_for(self.session)
        turn = Turn(
            self.rt,
            self.session,
            roots,
            llm,
            history=self.history,
            session_turns=self._session_turns,
            guard=self.guard,
            compactor=self.compactor,
        )
        self.turn = turn
        try:
            self.rt.hub.publish(TurnStarted(self.session.id, turn.root))
            metrics = await turn.run()
        finally:
            self.turn = None
        self.current_roots = []
        self._session_turns = metrics.session_turns
        self.metrics = [*self.metrics[-9:], metrics]
        self.rt.hub.publish(TurnEnded(self.session.id, metrics))

    async def _compact(self) -> None:
        """``/compact`` between turns: everything but the last turn may be compacted."""
        self.history.sync()
        messages = self.history.messages
        last_user = next((m for m in reversed(messages) if m.role is Role.USER), None)
        view = None
        if last_user is not None:
            llm = self.rt.llm_for(self.session)
            specs = [t.spec for t in self.rt.current_tools()]
            view = await self.compactor.compact(
                messages,
                last_user.root_ts,
                llm,
                current=self.history.view,
                fixed_tokens=llm.head_tokens(system_prompt(self.rt, self.session), specs),
                reason="/compact",
                force=True,
                meter=self.rt.budget.meter(self.session, SpendKind.COMPACTION),
            )
        if view is not None:
            self.history.set_view(view)
        self.rt.hub.publish(Compacted(self.session.id, view, "/compact"))

    def _drop_answered(self, roots: list[Message]) -> list[Message]:
        """Mark done the resumed roots whose turn already ended with an answer.

        Such roots are left by a crash after answering. Only ``processing`` roots (left open by a
        crash) are checked, so a normal turn costs no read.
        """
        resumed = [r for r in roots if r.status is Status.PROCESSING]
        if not resumed:
            return roots
        last_of_turn: dict[int, Message] = {}
        self.history.sync()
        for msg in self.history.messages:
            if msg.role is not Role.USER:
                last_of_turn[msg.root_id] = msg
        answered = {
            r.id
            for r in resumed
            if (last := last_of_turn.get(r.id)) is not None
            and last.role is Role.ASSISTANT
            and last.kind is Kind.TEXT
            and last.status is Status.DONE
        }
        if answered:
            log.info(
                "session %s: %d resumed turn(s) had already been answered",
                self.session.id,
                len(answered),
            )
            self.rt.store.set_status(answered, Status.DONE)
        return [r for r in roots if r.id not in answered]

    def _ensure_title(self, first: Message) -> None:
        """Give a new session a short title from its first message.

        No model call: free and instant.
        """
        if self.session.title:
            return
        current = self.rt.store.get_session(self.session.id)
        if current is not None and current.title:
            self.session = current
            return
        title = make_title(first.content)
        self.rt.store.set_session_title(self.session.id, title)
        self.session = self.rt.store.get_session(self.session.id) or self.session


def _is_dir(path: str) -> bool:
    """Whether ``path`` is a folder: one stat, microseconds when cached, so done on the loop."""
    return os.path.isdir(path)


def make_title(text: str) -> str:
    """A short title: the first line of ``text``, whitespace collapsed.

    Cut at a word near 48 characters.
    """
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    words = re.sub(r"\s+", " ", line).strip()
    if not words:
        return "Untitled"
    if len(words) <= TITLE_MAX_CHARS:
        return words
    cut = words[: TITLE_MAX_CHARS - 1].rsplit(" ", 1)[0] or words[: TITLE_MAX_CHARS - 1]
    return cut.rstrip(" ,.;:") + "…"
