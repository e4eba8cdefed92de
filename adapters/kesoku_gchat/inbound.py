"""Google Chat → Kesoku: events pulled from Pub/Sub become user messages, answers and stops.

An event is acked only once what it carries is persisted (the user message posted through the
gateway) or done (a question answered): a crash before that leaves it unacked, Pub/Sub delivers it
again, and the gateway drops the repeat by its external id, the Chat message's resource name
(unique per adapter). An event that cannot be read is acked and dropped with a warning, so it does
not come back forever.

Each event is its own failure domain: one whose handling fails is nacked and tried again (Pub/Sub
delivers it anew) up to :data:`EVENT_TRIES` times, then acked and dropped, logged with its id and
told in one line in its thread; the adapter goes on with the next event either way.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from kesoku.tools.attachments import display_name, save_attachment
from kesoku.tools.paths import os_problem
from kesoku.vocab.markup import TextPart
from kesoku.vocab.model import Attachment, Session, parse_answer, user_text
from kesoku.vocab.schedule import SCHEDULES_COMMAND, schedule_lines, schedules_reply
from kesoku.vocab.spend import BUDGET_GROUP_KEY
from kesoku_gchat import cards
from kesoku_gchat.chat_api import ChatApi, ChatApiError
from kesoku_gchat.delivery import place
from kesoku_gchat.events import (
    ANSWER_FUNCTION,
    CARD_CLICKED,
    MESSAGE,
    STOP_FUNCTION,
    ChatAttachment,
    ChatEvent,
    EventError,
    parse_event,
)

if TYPE_CHECKING:
    from kesoku.config.settings import GChatConfig, GChatSpace
    from kesoku.host.adapters import AdapterContext
    from kesoku_gchat.pubsub import PulledMessage

log = logging.getLogger(__name__)

EVENT_TRIES = 3
"""Handlings of one Pub/Sub message that failed before it is dropped (a poison message)."""
FAILURES_KEPT = 1024
"""Pub/Sub message ids whose failed tries are counted (the oldest are forgotten)."""
EVENT_WAIT_WARN_S = 5.0
"""An event handled (stored) longer than this after the puller received it is logged: a chat
normally sees its message taken in within a second; a longer wait means the queue in front of it
was slow."""


class Inbound:
    """Turns Chat events into Kesoku messages and actions.

    Args:
        ctx: The adapter port (gateway, event hub, questions, path gates).
        gchat: ``[gchat]``.
        api: The Chat client (attachments, reactions, notes).
        nursery: Where reactions run (they never delay an ack).
    """

    def __init__(
        self, ctx: AdapterContext, gchat: GChatConfig, api: ChatApi, nursery: trio.Nursery
    ) -> None:
        self.ctx = ctx
        self.gchat = gchat
        self.adapter = gchat.chatbot_id
        self.api = api
        self.nursery = nursery
        self.failures: OrderedDict[str, int] = OrderedDict()
        """Failed handlings by Pub/Sub message id."""

    async def handle(self, pulled: PulledMessage) -> None:
        """Handle one pulled message; ack it once handled, nack it if handling did not finish.

        Never raises but Cancelled: a failed handling is nacked (tried again), or after
        :data:`EVENT_TRIES` failures acked, logged and told to the user.

        Cancellation:
            A cancelled handling nacks the message: Pub/Sub delivers it again (to this process after
            a restart, or to another subscriber).
        """
        try:
            event = parse_event(pulled.data)
        except EventError as exc:
            log.warning("gchat: Pub/Sub message %s dropped: %s", pulled.message_id, exc)
            pulled.ack()
            return
        done = False
        try:
            try:
                if event.type == MESSAGE:
                    await self.message(event)
                elif event.type == CARD_CLICKED:
                    self.click(event)
                else:
                    log.info("gchat: %s event in %s ignored", event.type, event.space)
                done = True
                self.failures.pop(pulled.message_id, None)
                self.note_wait(pulled, event)
            except Exception as exc:
                done = self.failed(pulled.message_id, event, exc)
        finally:
            if done:
                pulled.ack()
            else:
                pulled.nack()

    def note_wait(self, pulled: PulledMessage, event: ChatEvent) -> None:
        """One warning when the event waited over :data:`EVENT_WAIT_WARN_S` since its receipt."""
        waited_s = trio.current_time() - pulled.received_at
        if waited_s > EVENT_WAIT_WARN_S:
            log.warning(
                "gchat: Pub/Sub message %s (%s) handled %.1f s after it was received",
                pulled.message_id,
                event.message_name or event.type,
                waited_s,
            )

    def failed(self, message_id: str, event: ChatEvent, exc: Exception) -> bool:
        """Count a failed handling; True: drop (ack) the event now, False: nack it to retry."""
        tries = self.failures.pop(message_id, 0) + 1
        if tries < EVENT_TRIES:
            self.failures[message_id] = tries
            while len(self.failures) > FAILURES_KEPT:
                self.failures.popitem(last=False)
            log.warning(
                "gchat: Pub/Sub message %s (%s) failed, try %d of %d: %s: %s",
                message_id,
                event.message_name or event.type,
                tries,
                EVENT_TRIES,
                type(exc).__name__,
                exc,
            )
            return False
        log.error(
            "gchat: Pub/Sub message %s (%s) dropped after %d tries",
            message_id,
            event.message_name or event.type,
            tries,
            exc_info=exc,
        )
        if event.space and event.sender_type != "BOT":
            what = type(exc).__name__
            text = f"⚠️ I could not take this message in ({what}); please send it again."
            self.nursery.start_soon(self.tell_at, event.space, event.thread, text)
        return True

    # -- messages ---------------------------------------------------------------------------------

    async def message(self, event: ChatEvent) -> None:
        """A user wrote: answer an open question with it, or post it (attachments saved first)."""
        if event.sender_type == "BOT" or not event.channel_id or not event.message_name:
            return
        if event.text == SCHEDULES_COMMAND:
            await self.list_schedules(event)
            return
        entry = space_override(self.gchat.spaces, event.space, event.space_display_name)
        session = self.ctx.gateway.open_session(
            self.adapter,
            event.channel_id,
            created_at=event.created_at,
            llm=entry.llm if entry is not None and entry.llm else self.gchat.llm,
            metadata={BUDGET_GROUP_KEY: entry.label} if entry is not None else None,
        )
        if self.answers_question(session, event):
            return
        saved, notes = await self.save_attachments(event.attachments, Path(session.workspace))
        text = event.text
        lines = [f"[attachment: {a.filename} → {a.path}]" for a in saved] + [
            f"[{note}]" for note in notes
        ]
        if lines:
            text = "\n\n".join(filter(None, [text, "\n".join(lines)]))
        before = self.ctx.gateway.last_message_id()
        stored = await self.ctx.gateway.post(
            user_text(
                session.id,
                text or "(an empty message)",
                sender=event.sender or "User",
                external_id=event.message_name,
                attachments=tuple(saved),
            )
        )
        if stored.id <= before:
            return  # a redelivery: already posted, reacted to and told
        if self.gchat.reaction_emoji and self.api.user_client is not None:
            self.nursery.start_soon(self.react, event.message_name, self.gchat.reaction_emoji)
        if notes:
            self.nursery.start_soon(self.tell, session, "\n".join(f"⚠️ {n}" for n in notes))

    async def list_schedules(self, event: ChatEvent) -> None:
        """Answer ``/schedules`` in its thread (or space); no turn, nothing stored.

        The conversation is the thread's session, else the space's (a new thread in a space, where
        scheduled runs into the space go). None yet: the schedules that run in the space
        (``gchat:<space>``).
        """
        gateway = self.ctx.gateway
        session = gateway.find_session(self.adapter, event.channel_id) or gateway.find_session(
            self.adapter, event.space
        )
        if session is None:
            session = Session(
                id="", adapter=self.adapter, channel_id=event.space, created_at=0.0, workspace=""
            )
        lines = schedule_lines(gateway.schedules_of(session), now=time.time())
        text = schedules_reply(lines, f"gchat:{session.channel_id}")
        for body in cards.answer_bodies([TextPart(text)]):
            await self.api.create_message(event.space, body, thread=event.thread)

    def answers_question(self, session: Session, event: ChatEvent) -> bool:
        """A typed ``allow``/``deny`` while a tool waits answers it instead of being posted."""
        open_questions = self.ctx.questions.open_questions(session.id)
        choice = parse_answer(event.text) if open_questions else None
        if choice is None:
            return False
        return self.ctx.questions.answer(
            open_questions[0].id, choice, by=event.sender or "the user"
        )

    async def save_attachments(
        self, attachments: tuple[ChatAttachment, ...], folder: Path
    ) -> tuple[list[Attachment], list[str]]:
        """Download uploaded attachments into the session folder; a note for each that was not."""
        saved: list[Attachment] = []
        notes: list[str] = []
        for item in attachments:
            name = display_name(item.content_name)
            if not item.resource_name:
                kind = "a Google Drive file" if item.drive_file_id else "not uploaded content"
                why = f"{kind}, which the app cannot read"
                notes.append(f"attachment {name} was not downloaded: {why}")
                continue
            try:
                data = await self.api.download(item.resource_name)
            except ChatApiError as exc:
                notes.append(f"attachment {name} could not be downloaded ({exc})")
                continue
            try:
                save = save_attachment
                path = await trio.to_thread.run_sync(save, folder, item.content_name, data)
            except OSError as exc:
                log.warning("gchat: attachment %s not saved: %s", name, exc)
                notes.append(f"attachment {name} could not be saved ({os_problem(exc)})")
                continue
            mime = item.content_type.split(";")[0].strip()
            saved.append(Attachment(path=str(path), mime_type=mime, filename=path.name))
        return saved, notes

    async def react(self, message_name: str, emoji: str) -> None:
        """Add ``[gchat] reaction_emoji`` to a user's message, as the user.

        A failure is only logged.
        """
        try:
            await self.api.create_reaction(message_name, emoji)
        except Exception as exc:  # a nicety: never more than a warning
            log.warning("gchat: no reaction on %s: %s", message_name, exc)

    async def tell(self, session: Session, text: str) -> None:
        """A short note in the session's thread (attachments that could not be read)."""
        await self.tell_at(*place(session), text)

    async def tell_at(self, space: str, thread: str, text: str) -> None:
        """A short note in a thread (or a space); a failure to send it is only logged."""
        try:
            for body in cards.answer_bodies([TextPart(text)]):
                await self.api.create_message(space, body, thread=thread)
        except Exception as exc:
            log.warning("gchat: note not sent to %s: %s", thread or space, exc)

    # -- card clicks ------------------------------------------------------------------------------

    def click(self, event: ChatEvent) -> None:
        """A button of one of our cards: Allow/Deny a question, or stop a turn.

        The click's thread must be the session's: a button cannot act on another conversation.
        """
        if event.function == ANSWER_FUNCTION:
            try:
                question_id = int(event.parameters.get("question_id", ""))
            except ValueError:
                return
            question = self.ctx.gateway.get_message(question_id)
            if question is None or not self._same_place(question.session_id, event):
                log.warning(
                    "gchat: a click on question %s from another conversation ignored", question_id
                )
                return
            try:
                self.ctx.questions.answer(
                    question_id, event.parameters.get("choice", ""), by=event.sender or "the user"
                )
            except ValueError as exc:
                log.warning("gchat: %s", exc)
        elif event.function == STOP_FUNCTION:
            session_id = event.parameters.get("session_id", "")
            if self._same_place(session_id, event):
                self.ctx.gateway.stop(session_id)

    def _same_place(self, session_id: str, event: ChatEvent) -> bool:
        session = self.ctx.gateway.get_session(session_id)
        return (
            session is not None
            and session.adapter == self.adapter
            and session.channel_id in {event.thread, event.space} - {""}
        )


def space_override(
    entries: Sequence[GChatSpace], space: str, display_name: str
) -> GChatSpace | None:
    """The first ``[[gchat.spaces]]`` entry naming this space by resource name or display name."""
    wanted = {space, display_name.casefold()} - {""}
    for entry in entries:
        if any(s in wanted or s.casefold() in wanted for s in entry.spaces):
            return entry
    return None
