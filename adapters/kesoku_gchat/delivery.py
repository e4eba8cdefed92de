"""Delivery: the adapter's sessions, from the durable log to Google Chat, each message once.

The adapter follows ``ctx.gateway.listen(after=cursor, adapter=chatbot_id)`` and saves its cursor
(``adapter:<chatbot_id>``) after each message, so a restart resumes where it stopped.

Per turn (keyed by its root user message) there is one *turn card*: a status line and a collapsed
"Thoughts & Tools" section that collects the turn's thoughts, tool calls (with their outcome) and
system notices. It is created when the user message arrives and patched in place as the turn runs —
at most once per ``card_interval_s``, because Chat allows about one write per second per space
(Chat API, "Usage limits": 60 writes per minute per space, shared by all apps). When the turn ends
(``TurnEnded`` on the event hub) the card shows ``TurnMetrics.render()``. Answers are separate
Markdown cards; a tool's Allow/Deny question is a card with buttons.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from kesoku.gateway import DeliveryCursor
from kesoku.tools.attachments import display_name
from kesoku.tools.paths import check_share
from kesoku.vocab.events import Compacted, ToolStarted, TurnEnded
from kesoku.vocab.markup import FilePart, Part, TextPart, parse_reply
from kesoku.vocab.model import (
    ANSWER_KEY,
    QUESTION_KEY,
    Kind,
    Message,
    Role,
    Session,
    Status,
    is_answer,
    is_question,
)
from kesoku_gchat import cards
from kesoku_gchat.chat_api import ChatApi, ChatApiError

if TYPE_CHECKING:
    from kesoku.host.adapters import AdapterContext
    from kesoku.vocab.metrics import TurnMetrics

log = logging.getLogger(__name__)

CARD_INTERVAL_S = 2.0
"""Least time between two updates of one turn card (Chat: about one write per second per space)."""
EVENT_BUFFER = 1024
"""Hub events the delivery may fall behind before some are lost (they only refine the cards)."""
FILE_NOTE = "📎 `{name}` (files are not sent to Google Chat; it stays in the session folder)"
RUNNING_MARK = "⏳"


def place(session: Session) -> tuple[str, str]:
    """``(space, thread)`` of a session.

    Its channel is a thread name, or a space name when threadless.
    """
    channel = session.channel_id
    space, sep, _ = channel.partition("/threads/")
    return space, channel if sep else ""


@dataclass
class TurnCard:
    """One turn's card and what it shows."""

    session_id: str
    root_id: int
    space: str
    thread: str
    name: str | None = None
    status: str = cards.WORKING
    running: bool = True
    entries: list[str] = field(default_factory=list)
    hidden: int = 0
    calls: dict[int, tuple[int, Message]] = field(default_factory=dict)
    """A tool call's message id → (its entry's index, the call)."""
    finished: set[int] = field(default_factory=set)
    """Tool calls whose outcome is shown."""
    changed: trio.Event = field(default_factory=trio.Event)
    closed: bool = False
    """The final state was pushed: no more updates."""

    def add(self, entry: str) -> int:
        """Append a line, dropping the oldest beyond :data:`cards.MAX_ENTRIES`.

        Returns:
            The line's index.
        """
        self.entries.append(entry)
        if len(self.entries) > cards.MAX_ENTRIES:
            self.entries.pop(0)
            self.hidden += 1
            self.calls = {k: (i - 1, m) for k, (i, m) in self.calls.items() if i > 0}
        self.changed.set()
        return len(self.entries) - 1

    def mark_call(self, call_id: int, mark: str) -> None:
        """Put ``mark`` (⏳, or an outcome) at the end of a tool call's line.

        The ⏳ of a call whose outcome is already shown is ignored: the tool-started event and the
        result message come by separate streams, and the event can be the later one.
        """
        if mark == RUNNING_MARK and call_id in self.finished:
            return
        if mark != RUNNING_MARK:
            self.finished.add(call_id)
        found = self.calls.get(call_id)
        if found is not None:
            index, call = found
            meta = call.metadata
            self.entries[index] = cards.tool_entry(
                meta.tool_name or "tool", meta.tool_arguments, mark
            )
            self.changed.set()

    def body(self) -> dict[str, Any]:
        """The card as a message body."""
        return cards.turn_card(
            status=self.status,
            entries=self.entries,
            hidden=self.hidden,
            session_id=self.session_id,
            running=self.running,
        )


class Delivery:
    """Sends the log's messages to Chat and keeps each turn's card.

    Args:
        ctx: The adapter port (gateway, event hub, questions, path gates).
        chatbot_id: ``[gchat] chatbot_id``: the adapter name of its sessions.
        api: The Chat client.
        card_interval_s: Least time between two updates of a turn card.
    """

    def __init__(
        self,
        ctx: AdapterContext,
        chatbot_id: str,
        api: ChatApi,
        *,
        card_interval_s: float = CARD_INTERVAL_S,
    ):
        self.ctx = ctx
        self.gateway = ctx.gateway
        self.adapter = chatbot_id
        self.api = api
        self.card_interval_s = card_interval_s
        self.cursor = DeliveryCursor(self.gateway, f"adapter:{chatbot_id}")
        self.cards: dict[int, TurnCard] = {}
        self.questions: dict[int, tuple[str, str]] = {}
        """An open question's id → (its Chat message name, its text)."""
        self._nursery: trio.Nursery | None = None
        self._ours: dict[str, bool] = {}

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver messages and follow turn events until cancelled; ``started`` once listening.

        The first start begins after the newest stored message (older sessions are not replayed into
        Chat); later starts resume from the saved cursor.

        Each message is its own failure domain: an error is logged with the message's id, told in
        one line in its thread, and the cursor moves past it (the Chat client already retried what
        was worth retrying).
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            with (
                self.ctx.hub.subscribe(buffer=EVENT_BUFFER) as events,
                self.ctx.gateway.listen(
                    after=self.cursor.start(), adapter=self.adapter
                ) as messages,
            ):
                nursery.start_soon(self._follow_events, events)
                task_status.started()
                async for message in messages:
                    try:
                        await self.deliver(message)
                    except Exception as exc:
                        # A ChatApiError is a refusal for good (a space gone, no permission).
                        if isinstance(exc, ChatApiError):
                            log.warning("gchat: message %d not delivered: %s", message.id, exc)
                        else:
                            log.exception("gchat: message %d not delivered", message.id)
                        notice = f"⚠️ Part of this reply could not be shown ({type(exc).__name__})."
                        await self.notify(message, notice)
                    self.cursor.advance(message.id)

    async def notify(self, message: Message, text: str) -> None:
        """One line in the thread of a message's session; a failure is only logged."""
        try:
            session = self.gateway.get_session(message.session_id)
            if session is None:
                return
            space, thread = place(session)
            for body in cards.answer_bodies([TextPart(text)]):
                await self.api.create_message(space, body, thread=thread)
        except Exception as exc:
            log.warning("gchat: notice about message %d not sent: %s", message.id, exc)

    # -- the log ----------------------------------------------------------------------------------

    async def deliver(self, message: Message) -> None:
        """Show one message of the log in its session's thread."""
        session = self.gateway.get_session(message.session_id)
        if session is None:
            return  # deleted since it was posted
        if message.role is Role.USER:
            if message.status in (Status.PENDING, Status.PROCESSING):
                await self.open_turn(session, message.id)
            return
        if message.role is Role.ASSISTANT and message.kind is Kind.TEXT:
            await self.send_answer(session, message)
        elif message.role is Role.SYSTEM:
            await self.send_system(session, message)
        elif message.role is Role.ASSISTANT and message.kind is Kind.THOUGHT:
            if message.content.strip():
                (await self.card_for(session, message.root_id)).add(
                    cards.thought_entry(message.content)
                )
        elif message.kind is Kind.TOOL_CALL:
            card = await self.card_for(session, message.root_id)
            meta = message.metadata
            index = card.add(cards.tool_entry(meta.tool_name or "tool", meta.tool_arguments))
            card.calls[message.id] = (index, message)
        elif message.role is Role.TOOL and message.parent_id is not None:
            card = await self.card_for(session, message.root_id)
            outcome = message.metadata.outcome
            card.mark_call(
                message.parent_id, cards.OUTCOME_MARKS.get(outcome.value if outcome else "", "")
            )

    async def open_turn(self, session: Session, root_id: int) -> TurnCard:
        """A user message arrived: post its turn card (⏳ Working…) in the thread."""
        space, thread = place(session)
        card = self.cards[root_id] = TurnCard(session.id, root_id, space, thread)
        try:
            card.name = await self.api.create_message(space, card.body(), thread=thread)
        except ChatApiError as exc:
            log.warning("gchat: turn card of message %d not posted: %s", root_id, exc)
        if self._nursery is not None:
            self._nursery.start_soon(self._keep_updated, card)
        return card

    async def card_for(self, session: Session, root_id: int) -> TurnCard:
        """The card of a turn; one is opened when its user message came before a restart."""
        card = self.cards.get(root_id)
        return card if card is not None else await self.open_turn(session, root_id)

    async def send_answer(self, session: Session, message: Message) -> None:
        """Answer text: Markdown cards, split to fit.

        ``[question: …]`` is shown as a list, ``[file: …]`` as a note.
        """
        space, thread = place(session)
        for body in cards.answer_bodies(await self.shown_parts(session, message.content)):
            await self.api.create_message(space, body, thread=thread)

    async def shown_parts(self, session: Session, text: str) -> list[Part]:
        """The parts of a reply with each ``[file: …]`` as the note Chat shows for it.

        Files are not sent to Chat, but the note goes through the same sharing rule as an upload
        (:func:`~kesoku.tools.paths.check_share`): a path that could not be shared is refused with
        its reason, so the note never confirms a secret or trips over a hostile path.
        """
        parts = parse_reply(text)
        gates = self.ctx.gates
        for index, part in enumerate(parts):
            if isinstance(part, FilePart):
                name = display_name(os.path.basename(part.path) or part.path)
                workspace = Path(session.workspace)
                checked = await trio.to_thread.run_sync(check_share, part.path, workspace, gates)
                refused = f"⚠️ I can't share `{name}`: {checked}."
                note = refused if isinstance(checked, str) else FILE_NOTE.format(name=name)
                parts[index] = TextPart(note)
        return parts

    async def send_system(self, session: Session, message: Message) -> None:
        """A tool's question (buttons), the record of its answer, or a notice.

        A notice is a line of the turn card.
        """
        space, thread = place(session)
        if is_question(message):
            options = [str(o) for o in message.metadata.extra[QUESTION_KEY].get("options", ())]
            name = await self.api.create_message(
                space, cards.question_body(message.id, message.content, options), thread=thread
            )
            self.questions[message.id] = (name, message.content)
            return
        if is_answer(message):
            question_id = int(message.metadata.extra[ANSWER_KEY])
            asked = self.questions.pop(question_id, None)
            if asked is not None:
                choice = str(message.metadata.extra.get("choice", ""))
                note = message.content.partition(": ")[2]
                await self.api.update_message(
                    asked[0], cards.answered_body(question_id, asked[1], choice, note)
                )
        if not message.content.strip():
            return
        card = self.cards.get(message.root_id)
        if card is not None and not card.closed:
            card.add(cards.system_entry(message.content))
        elif not is_answer(message):  # a notice of its own turn (a restart, a compaction record)
            for body in cards.answer_bodies(await self.shown_parts(session, message.content)):
                await self.api.create_message(space, body, thread=thread)

    # -- turn events ------------------------------------------------------------------------------

    def ours(self, session_id: str) -> bool:
        """Whether a session belongs to this adapter (cached: the answer never changes)."""
        known = self._ours.get(session_id)
        if known is None:
            session = self.gateway.get_session(session_id)
            known = self._ours[session_id] = session is not None and session.adapter == self.adapter
        return known

    async def _follow_events(self, events: Any) -> None:
        async for event in events:
            try:
                self._follow(event)
            except Exception:  # one event only refines the cards: the next ones still count
                kind = type(event).__name__
                log.exception("gchat: %s event of session %s not shown", kind, event.session_id)

    def _follow(self, event: Any) -> None:
        """One hub event: a turn ended, a tool started, or the session was compacted."""
        if not self.ours(event.session_id):
            return
        if isinstance(event, TurnEnded):
            assert self._nursery is not None
            self._nursery.start_soon(self._finish, event.metrics)
        elif isinstance(event, ToolStarted):
            card = self.cards.get(event.call.root_id)
            if card is not None:
                card.mark_call(event.call.id, RUNNING_MARK)
        elif isinstance(event, Compacted):
            for card in self.cards.values():
                if card.session_id == event.session_id and card.running:
                    card.add(cards.system_entry(event.render()))

    async def _finish(self, metrics: TurnMetrics) -> None:
        try:
            await self.finish_turn(metrics)
        except Exception:  # one turn's card: the delivery of every other message goes on
            log.exception("gchat: end of turn %d not shown", metrics.root_id)

    async def finish_turn(self, metrics: TurnMetrics) -> None:
        """Once a turn's messages are delivered: its card shows the metrics and its final state."""
        await self.cursor.delivered(metrics.session_id)
        card = self.cards.pop(metrics.root_id, None)
        if card is not None:
            card.status, card.running = metrics.render(), False
            card.changed.set()
        # User messages answered together with this turn never get a turn of their own.
        for older in [c for c in self.cards.values() if c.session_id == metrics.session_id]:
            if older.root_id < metrics.root_id:
                del self.cards[older.root_id]
                older.status, older.running = "⤵️ answered with the next message", False
                older.changed.set()

    async def _keep_updated(self, card: TurnCard) -> None:
        """Patch a turn card whenever it changed, until it is final.

        It is patched at most once per ``card_interval_s``.
        """
        while not card.closed:
            await card.changed.wait()
            card.changed = trio.Event()
            final = not card.running
            if card.name is not None:
                try:
                    await self.api.update_message(card.name, card.body())
                except ChatApiError as exc:
                    log.warning("gchat: turn card %s not updated: %s", card.name, exc)
                except Exception:  # this update is lost; the next change tries again
                    log.exception("gchat: turn card %s not updated", card.name)
            if final:
                card.closed = True
                return
            await trio.sleep(self.card_interval_s)
