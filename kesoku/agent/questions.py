"""Questions to the user: a tool asks Allow or Deny and waits; an adapter shows choices and answers.

A question is a ``system`` message of the turn whose ``metadata.extra["question"]`` holds the
choices, so every adapter sees it through the gateway like any other message (and a trajectory shows
it). The answer comes back in-process through :meth:`Questions.answer` (a button, a typed ``y``),
and is written as a second system message whose ``metadata.extra["answer_to"]`` names the question.
Neither is shown to the model: the tool's result says what the user decided.

No answer within ``agent.question_timeout_s`` counts as Deny; so does a stop of the turn or a new
user message (the user moved on), and so does a question nobody can answer after a restart: open
questions live in memory only, and the tool that asked is then ``lost`` anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from kesoku.tools.base import Approval
from kesoku.vocab.events import QuestionAsked
from kesoku.vocab.model import (
    ALLOW,
    ANSWER_KEY,
    DENY,
    QUESTION_KEY,
    Kind,
    Message,
    Metadata,
    Role,
    in_turn,
    parse_answer,
)

if TYPE_CHECKING:
    from kesoku.gateway import Gateway
    from kesoku.vocab.events import EventHub

log = logging.getLogger(__name__)

QUESTION_TIMEOUT_S = 300.0
"""``agent.question_timeout_s``: no answer within this long counts as Deny."""
RECORD_BOUND_S = 5.0
"""How long writing the answer record may take when the asking tool is being cancelled."""


@dataclass
class _Open:
    message: Message
    done: trio.Event = field(default_factory=trio.Event)
    choice: str | None = None
    note: str = ""


class Questions:
    """The open questions of this process.

    Args:
        gateway: Where questions and answer records are posted.
        hub: Where :class:`~kesoku.vocab.events.QuestionAsked` is published (adapters show it at
            once).
        timeout_s: Default wait for an answer.
    """

    def __init__(
        self, gateway: Gateway, hub: EventHub, *, timeout_s: float = QUESTION_TIMEOUT_S
    ) -> None:
        self.gateway = gateway
        self.hub = hub
        self.timeout_s = timeout_s
        self._open: dict[int, _Open] = {}

    async def ask(self, root: Message, text: str, *, timeout_s: float | None = None) -> Approval:
        """Post a question in the turn of ``root`` and wait for Allow or Deny.

        Args:
            root: The turn's root message (the question belongs to that turn).
            text: The question, one or two lines: what will happen and why it needs consent.
            timeout_s: Wait at most this long; None: the default.

        Returns:
            The answer; ``allowed`` only when someone chose Allow.

        Cancellation:
            The question is closed as dismissed (the record is written within a short shielded
            bound) and Cancelled propagates.
        """
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        meta = Metadata(extra={QUESTION_KEY: {"options": [ALLOW, DENY]}})
        message = await self.gateway.post(
            in_turn(root, Role.SYSTEM, Kind.TEXT, f"❓ {text}", metadata=meta)
        )
        entry = self._open[message.id] = _Open(message)
        self.hub.publish(QuestionAsked(message.session_id, message))
        timed_out = False
        try:
            with trio.move_on_after(wait_s) as waited:
                await entry.done.wait()
            timed_out = waited.cancelled_caught
        finally:
            self._open.pop(message.id, None)
            if entry.choice is None:
                entry.choice = DENY
                entry.note = (
                    f"no answer within {wait_s:g} s"
                    if timed_out
                    else "dismissed: the tool was stopped"
                )
            # Shielded and bounded: the record closes the question for the adapters even while the
            # asking tool is being cancelled (a forced stop).
            with trio.CancelScope(shield=True), trio.move_on_after(RECORD_BOUND_S):
                await self._record(message, entry.choice, entry.note)
        return Approval(entry.choice == ALLOW, entry.note)

    def answer(self, question_id: int, choice: str, *, by: str = "the user") -> bool:
        """Answer an open question.

        Args:
            question_id: The question message's id.
            choice: ``Allow`` or ``Deny`` (any case; ``y``/``n`` too).
            by: Who answered, for the record (a user name).

        Returns:
            False when the question is no longer open (answered, timed out, or from before a
            restart).

        Raises:
            ValueError: ``choice`` is neither Allow nor Deny.
        """
        parsed = parse_answer(choice)
        if parsed is None:
            raise ValueError(f"an answer is {ALLOW!r} or {DENY!r}, not {choice!r}")
        entry = self._open.get(question_id)
        if entry is None or entry.done.is_set():
            return False
        entry.choice = parsed
        entry.note = f"{'allowed' if parsed == ALLOW else 'denied'} by {by}"
        entry.done.set()
        return True

    def open_questions(self, session_id: str) -> list[Message]:
        """The questions of a session still waiting for an answer, oldest first."""
        return [
            e.message
            for e in self._open.values()
            if e.message.session_id == session_id and not e.done.is_set()
        ]

    def dismiss(self, session_id: str, reason: str) -> int:
        """Deny every open question of a session (a stop, or a new message: the user moved on).

        Returns:
            How many questions were closed.
        """
        closed = 0
        for entry in self._open.values():
            if entry.message.session_id == session_id and not entry.done.is_set():
                entry.choice, entry.note = DENY, reason
                entry.done.set()
                closed += 1
        return closed

    async def _record(self, question: Message, choice: str, note: str) -> None:
        meta = Metadata(extra={ANSWER_KEY: question.id, "choice": choice})
        mark = "✔" if choice == ALLOW else "✘"
        await self.gateway.post(
            in_turn(question, Role.SYSTEM, Kind.TEXT, f"{mark} {choice}: {note}", metadata=meta)
        )
