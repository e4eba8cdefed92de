"""Delivery: the adapter's sessions, from the durable log to Google Chat, each message once.

The adapter follows ``ctx.gateway.listen(after=cursor, adapter=chatbot_id)`` and delivers each
space's messages in order in a lane of its own (:mod:`kesoku.delivery_lanes`), so a space Chat does
not take holds up only itself. It saves its cursor (``adapter:<chatbot_id>``: a watermark and the
ids delivered above it) after each message, so a restart resumes where it stopped.

Per turn (keyed by its root user message) there is one *turn card*: a status line and a collapsed
"Thoughts & Tools" section that collects the turn's thoughts, tool calls (with their outcome) and
system notices. It is created when the user message arrives and patched in place as the turn runs —
at most once per ``card_interval_s``, because Chat allows about one write per second per space
(Chat API, "Usage limits": 60 writes per minute per space, shared by all apps). When the turn ends
(``TurnEnded`` on the event hub) the card shows ``TurnMetrics.render()``. Answers are separate
Markdown cards; a tool's Allow/Deny question is a card with buttons.

A turn no Chat message started (a scheduled run; any user message Kesoku posted itself) has
nothing to react or reply to: its card's first line says what started it
(:func:`~kesoku_gchat.cards.trigger_line`: ``⏰ Scheduler: <first line of the prompt>``). In a
thread session its messages go to the thread; in a space session each turn keeps its own thread,
which its card starts (:func:`turn_place`).

A heartbeat run (:func:`~kesoku.vocab.schedule.is_heartbeat_run`) speaks only when something needs
attention: its turn is held, no card, its messages kept back, until it ends. Ended with the answer
``HEARTBEAT_OK`` it shows nothing at all; otherwise its card and its messages go out then. A
question of a tool cannot wait for the end: it shows the turn at once, which then runs as any other.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from kesoku.delivery_lanes import DeliveryLanes
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
from kesoku.vocab.schedule import HeldTurn, is_heartbeat_run
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
THREAD_KEY = "kesoku-{session}-{root}"
"""The thread key of a turn in a space session (Chat API ``Thread.threadKey``: up to 4,000
characters, the app's own)."""


def place(session: Session) -> tuple[str, str]:
    """``(space, thread)`` of a session.

    Its channel is a thread name, or a space name when threadless.
    """
    channel = session.channel_id
    space, sep, _ = channel.partition("/threads/")
    return space, channel if sep else ""


def turn_place(session: Session, root_id: int) -> tuple[str, str, str]:
    """``(space, thread, thread key)`` of the messages of a turn.

    A thread session's turns go to its thread. A space session's (a scheduled run into a space: no
    Chat message to answer) each keep a thread of their own, keyed by the session and the turn's
    root message (:data:`THREAD_KEY`): the card starts it and the answer and questions follow it,
    after a restart too. In a space without threads the key changes nothing.
    """
    space, thread = place(session)
    key = "" if thread else THREAD_KEY.format(session=session.id, root=root_id)
    return space, thread, key


@dataclass
class TurnCard:
    """One turn's card and what it shows."""

    session_id: str
    root_id: int
    space: str
    thread: str
    key: str = ""
    """The thread key of a turn in a space session (:func:`turn_place`)."""
    trigger: str = ""
    """The card's first line when no Chat message started the turn (else empty)."""
    name: str | None = None
    status: str = cards.WORKING
    running: bool = True
    waiting: bool = False
    """The turn had ended when its user message was delivered: the card takes the lines of its
    messages until the delivery has passed them, then shows its final state."""
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
            trigger=self.trigger,
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
        self.lanes = DeliveryLanes(self.cursor, self, name="gchat")
        """One lane per space (:meth:`lane_of`): a space Chat does not take holds up only itself."""
        self.cards: dict[int, TurnCard] = {}
        self.questions: dict[int, tuple[str, str]] = {}
        """An open question's id → (its Chat message name, its text)."""
        self.held: dict[int, HeldTurn] = {}
        """Heartbeat runs not shown (yet), by root message id."""
        self._nursery: trio.Nursery | None = None
        self._ours: dict[str, bool] = {}

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver messages and follow turn events until cancelled; ``started`` once listening.

        The first start begins after the newest stored message (older sessions are not replayed into
        Chat); later starts resume from the saved cursor.

        Messages are delivered in order in each space, the spaces independently
        (:class:`~kesoku.delivery_lanes.DeliveryLanes`, keyed by :meth:`lane_of`).

        Each message is its own failure domain: an error is logged with the message's id
        (:meth:`failed`), told in one line in its thread, and the cursor moves past it (the Chat
        client already retried what was worth retrying).
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
                await self.lanes.run(messages)

    def lane_of(self, session: Session) -> str:
        """The lane of a session's messages: its space.

        Not its thread: Chat's write quota is per space (60 a minute, shared by all apps), so lanes
        within one space would only compete for it, and an outage or a 429 there hits every thread
        of the space alike. One lane keeps each thread's order too (a card before its updates'
        lines, a question before the edit that records its answer).
        """
        return f"space {place(session)[0]}"

    def failed(self, message: Message, exc: Exception) -> bool:
        """Log a message not delivered, with its id.

        Returns:
            False when Chat could not be reached (the client's retries ran out); True for a refusal
            for good (a space gone, no permission) or a bug.
        """
        if isinstance(exc, ChatApiError):
            log.warning("gchat: message %d not delivered: %s", message.id, exc)
        else:
            log.error("gchat: message %d not delivered", message.id, exc_info=exc)
        return not (isinstance(exc, ChatApiError) and exc.retryable)

    async def notify(self, message: Message, text: str) -> None:
        """One line in the thread of a message's session; a failure is only logged."""
        try:
            session = self.gateway.get_session(message.session_id)
            if session is None:
                return
            space, thread, key = turn_place(session, message.root_id)
            for body in cards.answer_bodies([TextPart(text)]):
                await self.api.create_message(space, body, thread=thread, thread_key=key)
        except Exception as exc:
            log.warning("gchat: notice about message %d not sent: %s", message.id, exc)

    # -- the log ----------------------------------------------------------------------------------

    async def deliver(self, message: Message) -> None:
        """Show one message of the log in its session's thread."""
        session = self.gateway.get_session(message.session_id)
        if session is None:
            return  # deleted since it was posted
        if message.role is Role.USER:
            if is_heartbeat_run(message):
                self.hold(session, message)
            else:
                await self.open_turn(session, message.id, message)
            return
        held = self.held.get(message.root_id)
        if held is not None:
            if not is_question(message):
                held.messages.append(message)
                return
            del self.held[held.root.id]  # a question waits for the user: show the turn now
            await self.release(held, session)
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

    async def open_turn(
        self, session: Session, root_id: int, root: Message | None = None
    ) -> TurnCard:
        """A user message arrived: post its turn card (⏳ Working…) in the thread.

        Its first line names a prompt that no Chat message shows (:func:`cards.trigger_line`). A
        turn that had ended already (it ran while the adapter was not following the log: a
        scheduled run while the adapter was starting, a restart) gets a card without figures (its
        end event was not seen), which takes its lines until the delivery has passed them.

        Args:
            session: The turn's session.
            root_id: Its user message's id.
            root: That message, if at hand (else it is read from the log).
        """
        root = root if root is not None else self.gateway.get_message(root_id)
        space, thread, key = turn_place(session, root_id)
        trigger = cards.trigger_line(root) if root is not None else ""
        card = TurnCard(session.id, root_id, space, thread, key=key, trigger=trigger)
        self.cards[root_id] = card
        if root is not None and root.status not in (Status.PENDING, Status.PROCESSING):
            card.status, card.running, card.waiting = cards.ended_unseen(root.status), False, True
            if self._nursery is not None:
                self._nursery.start_soon(self._settle, card)
        try:
            card.name = await self.api.create_message(
                space, card.body(), thread=thread, thread_key=key
            )
        except ChatApiError as exc:
            log.warning("gchat: turn card of message %d not posted: %s", root_id, exc)
        if self._nursery is not None:
            self._nursery.start_soon(self._keep_updated, card)
        return card

    def hold(self, session: Session, root: Message) -> None:
        """Keep a heartbeat run's turn back (see the module's doc).

        One that had ended already is decided once the delivery has passed its messages.
        """
        self.held[root.id] = HeldTurn(session.id, root)
        if root.status not in (Status.PENDING, Status.PROCESSING) and self._nursery is not None:
            self._nursery.start_soon(self._settle_held, root.id, session.id)

    async def release(self, held: HeldTurn, session: Session) -> TurnCard:
        """Show a held turn (no longer in :attr:`held`): its card, then its messages kept back.

        The card is opened as running whatever the turn's state (a final one would close before
        the messages are in it); the caller that knows the end sets it.
        """
        running = msgspec.structs.replace(held.root, status=Status.PROCESSING)
        card = await self.open_turn(session, held.root.id, running)
        for message in held.messages:
            try:
                await self.deliver(message)
            except Exception:  # as in serve: one message never stops the rest
                log.exception("gchat: message %d not delivered", message.id)
        return card

    async def _settle_held(self, root_id: int, session_id: str) -> None:
        """A heartbeat run that had ended when delivered: shown or not once its messages are."""
        try:
            await self.cursor.delivered(session_id)
            held = self.held.pop(root_id, None)
            session = self.gateway.get_session(session_id)
            if held is None or held.quiet() or session is None:
                return
            card = await self.release(held, session)
            if self.cards.get(root_id) is card:
                del self.cards[root_id]
            card.status, card.running = cards.ended_unseen(held.root.status), False
            card.changed.set()
        except Exception:  # one turn: the delivery of every other message goes on
            log.exception("gchat: heartbeat run %d not shown", root_id)

    async def card_for(self, session: Session, root_id: int) -> TurnCard:
        """The card of a turn; one is opened when its user message came before a restart."""
        card = self.cards.get(root_id)
        return card if card is not None else await self.open_turn(session, root_id)

    async def send_answer(self, session: Session, message: Message) -> None:
        """Answer text: Markdown cards, split to fit.

        ``[question: …]`` is shown as a list, ``[file: …]`` as a note.
        """
        space, thread, key = turn_place(session, message.root_id)
        for body in cards.answer_bodies(await self.shown_parts(session, message.content)):
            await self.api.create_message(space, body, thread=thread, thread_key=key)

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
        space, thread, key = turn_place(session, message.root_id)
        if is_question(message):
            options = [str(o) for o in message.metadata.extra[QUESTION_KEY].get("options", ())]
            body = cards.question_body(message.id, message.content, options)
            name = await self.api.create_message(space, body, thread=thread, thread_key=key)
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
                await self.api.create_message(space, body, thread=thread, thread_key=key)

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
        """Once a turn's messages are delivered: its card shows the metrics and its final state.

        A held heartbeat run is shown now, unless it was quiet.
        """
        await self.cursor.delivered(metrics.session_id)
        held = self.held.pop(metrics.root_id, None)
        if held is not None and not held.quiet():
            session = self.gateway.get_session(metrics.session_id)
            if session is not None:
                await self.release(held, session)
        card = self.cards.pop(metrics.root_id, None)
        if card is not None:
            card.status, card.running, card.waiting = metrics.render(), False, False
            card.changed.set()
        # User messages answered together with this turn never get a turn of their own.
        for older in [c for c in self.cards.values() if c.session_id == metrics.session_id]:
            if older.root_id < metrics.root_id:
                del self.cards[older.root_id]
                older.status, older.running = "⤵️ answered with the next message", False
                older.waiting = False
                older.changed.set()
        # A heartbeat run answered with this turn never gets a turn of its own: nothing to show.
        for root_id in [
            r
            for r, h in self.held.items()
            if h.session_id == metrics.session_id and r < metrics.root_id and not h.messages
        ]:
            del self.held[root_id]

    async def _settle(self, card: TurnCard) -> None:
        """A turn that had ended when delivered: once its messages are, its card is final."""
        await self.cursor.delivered(card.session_id)
        if self.cards.get(card.root_id) is card:
            del self.cards[card.root_id]
        card.waiting = False
        card.changed.set()

    async def _keep_updated(self, card: TurnCard) -> None:
        """Patch a turn card whenever it changed, until it is final.

        It is patched at most once per ``card_interval_s``.
        """
        while not card.closed:
            await card.changed.wait()
            card.changed = trio.Event()
            final = not card.running and not card.waiting
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
