"""Delivery: every message of the adapter's sessions, from the durable log to Discord, exactly once.

The adapter follows ``ctx.gateway.listen(after=cursor, adapter=chatbot_id)`` and delivers each
channel's messages in order in a lane of its own (:mod:`kesoku.delivery_lanes`), so a channel
Discord does not take holds up only itself. It saves its cursor (``adapter:<chatbot_id>`` in the
store: a watermark and the ids delivered above it) after each message is delivered, so a restart
resumes where it stopped: nothing lost, nothing sent twice (a crash in the middle of one message's
chunks can repeat that message only). Discord's websocket reconnects do not touch this path:
replies go out over REST.

Per turn (keyed by its root user message) the adapter keeps the header message, the intermediate
messages (thoughts, tool calls and results, which 🛑 deletes) and the typing indicator.

A turn no Discord message started (a scheduled run; any user message Kesoku posted itself) is
answered in its session's channel as it is, a text channel or a thread (nothing to open a thread
on, nothing to reply or react to); its header's first line says what started it
(:func:`~kesoku_discord.convert.trigger_line`: ``⏰ Scheduler: <first line of the prompt>``).

A heartbeat run (:func:`~kesoku.vocab.schedule.is_heartbeat_run`) speaks only when something needs
attention: its turn is held, no header and no typing, its messages kept back, until it ends. Ended
with the answer ``HEARTBEAT_OK`` it shows nothing at all; otherwise its header (with the figures)
and its messages go out then. A question of a tool cannot wait for the end: it shows the turn at
once, which then runs as any other.
"""

from __future__ import annotations

import io
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import trio
from kesoku.delivery_lanes import DeliveryLanes
from kesoku.gateway import DeliveryCursor
from kesoku.tools.attachments import display_name
from kesoku.tools.paths import check_share, os_problem, read_shared
from kesoku.vocab.markup import FilePart, QuestionPart, TextPart, parse_reply
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

from kesoku_discord._compat import discord, ui
from kesoku_discord.client import NO_MASS_MENTIONS, aio, log_failure, tell
from kesoku_discord.convert import (
    MORE_CHOICES,
    ended_unseen,
    header_text,
    question_content,
    render_thought,
    render_tool_call,
    render_tool_result,
    split_message,
    trigger_line,
)
from kesoku_discord.inbound import channel_of_key
from kesoku_discord.views import answer_view, choice_views, disabled_copy, header_view

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.host.adapters import AdapterContext
    from kesoku.vocab.metrics import TurnMetrics

log = logging.getLogger(__name__)

TYPING_TIMEOUT_S = 600.0
"""A typing indicator never runs longer than this (a turn that never ends must not type forever)."""
TYPING_REPEAT_S = 8.0
"""Discord shows typing for about 10 s per trigger (API, "Trigger Typing Indicator"): repeat
before."""
DEFAULT_UPLOAD_LIMIT = 10 * 1024 * 1024
"""Upload limit outside a guild (Discord API, "Uploading Files": 10 MiB without boosts)."""
RETRY_CAP_S = 60.0
"""Longest pause between two tries of a send while Discord cannot be reached."""
WORKING = "⏳ working…"
ANSWERED_LATER = "⤵️ answered with the next message"
UNMETERED_KEPT = 256
"""Headers of turns that had ended when delivered, kept so that a late end event still edits them
in (the oldest are forgotten)."""
NO_MENTIONS = discord.AllowedMentions.none()
"""A header quotes a prompt: it notifies no one."""


@dataclass
class TurnView:
    """What the adapter shows for one turn."""

    session_id: str
    root_id: int
    channel_id: int
    header: discord.Message | None = None
    intermediate: list[int] = field(default_factory=list)
    stopped: bool = False
    trigger: str = ""
    """The header's first line when no Discord message started the turn (else empty)."""


class InChannel:
    """A conversation held in a text channel (no thread): what is sent replies to its first message.

    Discord refused the conversation's thread (:mod:`kesoku_discord.inbound`): a user's reply to
    any of these messages leads the inbound side back to the conversation's session. Everything
    else is the channel's.
    """

    def __init__(self, channel: discord.TextChannel, first_id: int) -> None:
        self.channel = channel
        self.reference = discord.MessageReference(
            message_id=first_id,
            channel_id=channel.id,
            guild_id=channel.guild.id,
            fail_if_not_exists=False,  # the first message deleted: sent all the same
        )

    async def send(self, content: str | None = None, **kwargs: Any) -> discord.Message:
        """``channel.send`` as a reply to the conversation's first message."""
        kwargs.setdefault("reference", self.reference)
        sent: discord.Message = await self.channel.send(content, **kwargs)
        return sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self.channel, name)


class Typing:
    """Typing indicators, one per channel, each bounded by :data:`TYPING_TIMEOUT_S`."""

    def __init__(self, nursery: trio.Nursery, *, timeout_s: float = TYPING_TIMEOUT_S) -> None:
        self.nursery = nursery
        self.timeout_s = timeout_s
        self.scopes: dict[int, trio.CancelScope] = {}

    def start(self, channel: discord.abc.Messageable, channel_id: int) -> None:
        """Show typing in a channel until :meth:`stop` (or the timeout); already typing: nothing."""
        if channel_id not in self.scopes:
            scope = self.scopes[channel_id] = trio.CancelScope()
            self.nursery.start_soon(self._run, channel, channel_id, scope)

    def poke(self, channel: discord.abc.Messageable, channel_id: int) -> None:
        """A message was just sent (which clears the indicator in clients): trigger it again now."""
        if channel_id in self.scopes:
            self.nursery.start_soon(_trigger_typing, channel)

    def stop(self, channel_id: int) -> None:
        """Stop typing in a channel."""
        scope = self.scopes.pop(channel_id, None)
        if scope is not None:
            scope.cancel()

    async def _run(
        self, channel: discord.abc.Messageable, channel_id: int, scope: trio.CancelScope
    ) -> None:
        with scope:
            scope.deadline = trio.current_time() + self.timeout_s
            while True:
                await _trigger_typing(channel)
                await trio.sleep(TYPING_REPEAT_S)
        if self.scopes.get(channel_id) is scope:
            del self.scopes[channel_id]


async def _send(
    channel: discord.abc.Messageable, content: str | None, kwargs: dict[str, Any]
) -> discord.Message:
    return await channel.send(content, **kwargs)


async def _trigger_typing(channel: discord.abc.Messageable) -> None:
    async def once() -> None:
        await channel.typing()  # one POST /channels/{id}/typing

    try:
        await aio(once)
    except Exception as exc:  # a nicety: never worth more than a debug line
        log.debug("discord: typing failed: %s", exc)


class Delivery:
    """Sends the log's messages to Discord.

    Keeps each turn's header, typing and intermediate messages.

    Args:
        ctx: The adapter port (gateway, event hub, questions, path gates).
        config: The loaded config.
        client: The connected Discord client.
        nursery: Where typing tasks run.
    """

    def __init__(
        self, ctx: AdapterContext, config: Config, client: discord.Client, nursery: trio.Nursery
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.client = client
        self.gateway = ctx.gateway
        self.adapter = config.discord.chatbot_id
        self.cursor = DeliveryCursor(self.gateway, f"adapter:{self.adapter}")
        self.lanes = DeliveryLanes(self.cursor, self, name="discord")
        """One lane per channel: a channel Discord does not take holds up only itself."""
        self.nursery = nursery
        self.typing = Typing(nursery)
        self.turns: dict[int, TurnView] = {}
        self.held: dict[int, HeldTurn] = {}
        """Heartbeat runs not shown (yet), by root message id."""
        self.unmetered: OrderedDict[int, TurnView] = OrderedDict()
        """Turns that had ended when their user message was delivered (see :meth:`open_turn`)."""
        self.questions: dict[int, discord.Message] = {}

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver messages until cancelled; ``started`` once listening.

        The first start of an adapter begins after the newest stored message (older sessions are not
        replayed into Discord); later starts resume from the saved cursor.

        Messages are delivered in order in each channel, the channels independently
        (:class:`~kesoku.delivery_lanes.DeliveryLanes`, keyed by :meth:`lane_of`): a channel whose
        sends :meth:`send` keeps retrying holds up only its own replies.

        Each message is its own failure domain: :meth:`send` waits out network failures, and any
        other error (Discord refusing it for good, a bug) is logged with the message's id
        (:meth:`failed`), told in one line in its channel, and the cursor moves past it: one message
        never stops the rest.
        """
        with self.ctx.gateway.listen(after=self.cursor.start(), adapter=self.adapter) as messages:
            task_status.started()
            await self.lanes.run(messages)

    def lane_of(self, session: Session) -> str:
        """The lane of a session's messages: its channel or thread (shared by its conversations)."""
        return f"channel {channel_of_key(session.channel_id)[0]}"

    def failed(self, message: Message, exc: Exception) -> bool:
        """Log a message Discord refused for good (channel gone, no permission), or a bug.

        Returns:
            True: Discord answered (:meth:`send` never gives up on an unreachable Discord).
        """
        log_failure(log, exc, "message %d not delivered", message.id)
        return True

    async def notify(self, message: Message, text: str) -> None:
        """One line in the channel of a message's session; a failure is only logged."""
        try:
            session = self.gateway.get_session(message.session_id)
            channel = await self.channel_of(session) if session is not None else None
        except Exception as exc:
            log.warning("discord: no channel for a notice about message %d: %s", message.id, exc)
            return
        if channel is not None:
            await tell(channel, text)

    # -- channels -------------------------------------------------------------------------------

    async def channel_of(self, session: Session) -> discord.abc.Messageable | None:
        """The Discord channel or thread of a session (from the cache, else GET /channels/{id}).

        A conversation held in a text channel without a thread is the channel as
        :class:`InChannel`.
        """
        channel_id, first = channel_of_key(session.channel_id)
        channel = self.client.get_channel(channel_id)
        if channel is None:
            try:
                channel = await aio(self.client.fetch_channel, channel_id)
            except discord.HTTPException as exc:
                log.warning(
                    "discord: channel %s of session %s is gone: %s", channel_id, session.id, exc
                )
                return None
        if first is not None and isinstance(channel, discord.TextChannel):
            return cast("discord.abc.Messageable", InChannel(channel, first))
        return channel if isinstance(channel, discord.abc.Messageable) else None

    async def send(
        self, channel: discord.abc.Messageable, content: str | None = None, **kwargs: Any
    ) -> discord.Message:
        """``channel.send`` with mass mentions off; waits out network failures and Discord's 5xx.

        discord.py already retries 429 and 5xx a few times (honouring Retry-After); past that, and
        on connection errors, the message waits (backoff up to :data:`RETRY_CAP_S`) rather than
        being skipped: a reply must not be lost because the network was down for a minute.

        Raises:
            discord.HTTPException: Discord refused the message for good (4xx: no permission, gone).
        """
        kwargs.setdefault("allowed_mentions", NO_MASS_MENTIONS)
        delay_s = 1.0
        while True:
            try:
                sent: discord.Message = await aio(_send, channel, content, kwargs)
                return sent
            except (aiohttp.ClientError, OSError, discord.DiscordServerError) as exc:
                log.warning("discord: send failed (%s); retrying in %g s", exc, delay_s)
                await trio.sleep(delay_s)
                delay_s = min(delay_s * 2, RETRY_CAP_S)
            for value in kwargs.values():
                if isinstance(value, discord.File):
                    value.reset()  # a retried upload starts from the first byte again

    async def send_text(
        self, channel: discord.abc.Messageable, text: str, **kwargs: Any
    ) -> list[discord.Message]:
        """Send text as one or more messages (split at 2,000 characters).

        ``kwargs`` go with the last one.
        """
        chunks = split_message(text)
        sent = []
        for i, chunk in enumerate(chunks):
            sent.append(await self.send(channel, chunk, **(kwargs if i == len(chunks) - 1 else {})))
        return sent

    # -- delivering -----------------------------------------------------------------------------

    async def deliver(self, message: Message) -> None:
        """Show one message of the log in its session's channel."""
        session = self.gateway.get_session(message.session_id)
        if session is None:
            return  # deleted (♻️) since it was posted
        channel = await self.channel_of(session)
        if channel is None:
            return
        channel_id = channel_of_key(session.channel_id)[0]
        if message.role is Role.USER:
            if is_heartbeat_run(message):
                self.hold(session, message)
            else:
                await self.open_turn(session, channel, message)
            return
        held = self.held.get(message.root_id)
        if held is not None:
            if not is_question(message):
                held.messages.append(message)
                return
            del self.held[held.root.id]  # a question waits for the user: show the turn now
            await self.release(held, session, channel)
        turn = self.turns.get(message.root_id)
        if message.role is Role.ASSISTANT and message.kind is Kind.TEXT:
            await self.send_answer(session, channel, message)
        elif message.role is Role.SYSTEM:
            await self.send_system(channel, message)
        else:
            if turn is not None and turn.stopped:
                return  # 🛑 cleared this turn's progress: do not bring it back
            if message.kind is Kind.THOUGHT:
                text = render_thought(message.content)
            elif message.kind is Kind.TOOL_CALL:
                text = render_tool_call(message)
            else:
                text = render_tool_result(message)
            sent = await self.send_text(channel, text)
            if turn is not None and turn.stopped:  # 🛑 was clicked while this was on its way
                for late in sent:
                    await aio(late.delete)
            elif turn is not None:
                turn.intermediate += [m.id for m in sent]
        self.typing.poke(channel, channel_id)

    async def open_turn(
        self, session: Session, channel: discord.abc.Messageable, root: Message
    ) -> None:
        """A user message arrived: post the turn's header (with its buttons) and start typing.

        The header's first line names a prompt that no Discord message shows
        (:func:`~kesoku_discord.convert.trigger_line`). A turn that had ended already (it ran while
        the adapter was not following the log: a scheduled run while Discord was connecting, a
        restart) gets its header in its final form, without figures: its end event was not seen.
        One that comes late after all still edits them in (:meth:`finish_turn`).
        """
        channel_id = channel_of_key(session.channel_id)[0]
        in_thread = isinstance(channel, discord.Thread)
        turn = TurnView(session.id, root.id, channel_id, trigger=trigger_line(root))
        if root.status not in (Status.PENDING, Status.PROCESSING):
            view = header_view(session.id, root.id, clear=not in_thread, running=False)
            status = ended_unseen(root.status)
            turn.header = await self.send_header(channel, header_text(turn.trigger, status), view)
            self.unmetered[root.id] = turn
            while len(self.unmetered) > UNMETERED_KEPT:
                self.unmetered.popitem(last=False)
            return
        self.typing.start(channel, channel_id)
        view = header_view(session.id, root.id, clear=not in_thread)
        turn.header = await self.send_header(channel, header_text(turn.trigger, WORKING), view)
        self.turns[root.id] = turn

    def hold(self, session: Session, root: Message) -> None:
        """Keep a heartbeat run's turn back (see the module's doc).

        One that had ended already is decided once the delivery has passed its messages.
        """
        self.held[root.id] = HeldTurn(session.id, root)
        if root.status not in (Status.PENDING, Status.PROCESSING):
            self.nursery.start_soon(self._settle, root.id, session.id)

    async def release(
        self,
        held: HeldTurn,
        session: Session,
        channel: discord.abc.Messageable,
        header: str | None = None,
    ) -> None:
        """Show a held turn: its header, then its messages kept back.

        Args:
            held: The turn, no longer in :attr:`held`.
            session: Its session.
            channel: Its channel.
            header: The header's final text (the turn ended); None: as :meth:`open_turn` posts it.
        """
        if header is None:
            await self.open_turn(session, channel, held.root)
        else:
            in_thread = isinstance(channel, discord.Thread)
            view = header_view(session.id, held.root.id, clear=not in_thread, running=False)
            await self.send_header(channel, header, view)
        for message in held.messages:
            try:
                await self.deliver(message)
            except Exception as exc:  # as in serve: one message never stops the rest
                log_failure(log, exc, "message %d not delivered", message.id)

    async def _settle(self, root_id: int, session_id: str) -> None:
        """A heartbeat run that had ended when delivered: shown or not once its messages are."""
        try:
            await self.cursor.delivered(session_id)
            held = self.held.pop(root_id, None)
            if held is None or held.quiet():
                return
            session = self.gateway.get_session(session_id)
            channel = await self.channel_of(session) if session is not None else None
            if session is not None and channel is not None:
                await self.release(held, session, channel)
        except Exception as exc:
            log_failure(log, exc, "heartbeat run %d not shown", root_id)

    async def send_header(
        self, channel: discord.abc.Messageable, content: str, view: ui.View
    ) -> discord.Message:
        """Post a turn header (no mention in a quoted prompt notifies anyone)."""
        return await self.send(channel, content, view=view, allowed_mentions=NO_MENTIONS)

    async def send_answer(
        self, session: Session, channel: discord.abc.Messageable, message: Message
    ) -> None:
        """Send answer text part by part, in order.

        Its parts: markdown chunks, ``[file: …]`` uploads and ``[question: …]`` buttons.
        """
        for index, part in enumerate(parse_reply(message.content)):
            if isinstance(part, TextPart):
                await self.send_text(channel, part.text)
            elif isinstance(part, FilePart):
                await self.send_file(session, channel, part.path)
            elif isinstance(part, QuestionPart):
                await self.send_question(channel, message.id, index, part)

    async def send_question(
        self, channel: discord.abc.Messageable, message_id: int, index: int, part: QuestionPart
    ) -> None:
        """A ``[question: …]``: its text with the choices' buttons or menus; no choice left out.

        Choices too many or too long for buttons are listed in full in the text, and carried by
        select menus, 125 per message (:func:`~kesoku_discord.views.choice_views`); the menus past
        the first 125 go in messages of their own, after the text.
        """
        content = question_content(part.text, part.choices)
        first, *more = choice_views(message_id, index, part.choices)
        await self.send_text(channel, content, view=first)
        for view in more:
            await self.send(channel, MORE_CHOICES, view=view)

    async def send_file(
        self, session: Session, channel: discord.abc.Messageable, path: str
    ) -> None:
        """Upload a file the answer named, if the sharing rule allows it and it fits the limit.

        A refusal is one line naming why (:func:`~kesoku.tools.paths.check_share`): the config, the
        database and secrets are never sent, whatever ``shareable_roots`` says.
        """
        name = display_name(os.path.basename(path) or path)
        workspace = Path(session.workspace)
        checked = await trio.to_thread.run_sync(check_share, path, workspace, self.ctx.gates)
        if isinstance(checked, str):
            await self.send(channel, f"⚠️ I can't share `{name}`: {checked}.")
            return
        guild = getattr(channel, "guild", None)
        limit = guild.filesize_limit if guild is not None else DEFAULT_UPLOAD_LIMIT
        try:
            data = await trio.to_thread.run_sync(read_shared, checked, limit)
        except OSError as exc:
            await self.send(channel, f"⚠️ I can't share `{name}`: {os_problem(exc)}.")
            return
        if isinstance(data, int):
            mib = 1024 * 1024
            over = f"over Discord's upload limit ({limit / mib:.0f} MiB)"
            await self.send(channel, f"⚠️ `{name}` is {data / mib:.1f} MiB, {over}.")
            return
        upload = discord.File(io.BytesIO(data), filename=display_name(checked.name))
        await self.send(channel, file=upload)

    async def send_system(self, channel: discord.abc.Messageable, message: Message) -> None:
        """A tool's question (Allow/Deny buttons), the record of its answer, or a notice."""
        if is_question(message):
            options = [str(o) for o in message.metadata.extra[QUESTION_KEY].get("options", ())]
            sent = await self.send_text(
                channel, message.content, view=answer_view(message.id, options)
            )
            self.questions[message.id] = sent[-1]
        elif is_answer(message):
            question = self.questions.pop(int(message.metadata.extra[ANSWER_KEY]), None)
            if question is not None:  # not answered by a click (a timeout, a stop, a new message)
                choice = str(message.metadata.extra.get("choice", ""))
                await aio(
                    question.edit,
                    content=f"{question.content}\n→ **{choice}**",
                    view=disabled_copy(question),
                )
        elif message.content.strip():
            await self.send_text(channel, message.content)

    # -- the end of a turn ----------------------------------------------------------------------

    async def finish_turn(self, metrics: TurnMetrics) -> None:
        """After a turn's messages are delivered: edit its header with the metrics, stop typing.

        A held heartbeat run is shown now, its header with the metrics, unless it was quiet.
        """
        await self.cursor.delivered(metrics.session_id)
        session = self.gateway.get_session(metrics.session_id)
        held = self.held.pop(metrics.root_id, None)
        turn = self.turns.pop(metrics.root_id, None) or self.unmetered.pop(metrics.root_id, None)
        if session is None:
            return
        channel = await self.channel_of(session)
        if channel is None:
            return
        in_thread = isinstance(channel, discord.Thread)
        view = header_view(session.id, metrics.root_id, clear=not in_thread, running=False)
        if held is not None:
            if not held.quiet():
                header = header_text(trigger_line(held.root), metrics.render())
                await self.release(held, session, channel, header)
        else:
            if turn is not None:
                trigger = turn.trigger
            else:
                root = self.gateway.get_message(metrics.root_id)
                trigger = trigger_line(root) if root is not None else ""
            content = header_text(trigger, metrics.render())
            if turn is not None and turn.header is not None:
                await aio(
                    turn.header.edit, content=content, view=view, allowed_mentions=NO_MENTIONS
                )
            else:  # the header was posted before a restart: post the metrics anew
                await self.send_header(channel, content, view)
        # A heartbeat run answered with this turn never gets a turn of its own: nothing to show.
        for root_id in [
            r
            for r, h in self.held.items()
            if h.session_id == session.id and r < metrics.root_id and not h.messages
        ]:
            del self.held[root_id]
        # User messages answered together with this turn never get a turn of their own.
        for older in [
            t
            for t in self.turns.values()
            if t.session_id == session.id and t.root_id < metrics.root_id
        ]:
            del self.turns[older.root_id]
            if older.header is not None:
                done = header_view(session.id, older.root_id, clear=not in_thread, running=False)
                await aio(
                    older.header.edit,
                    content=header_text(older.trigger, ANSWERED_LATER),
                    view=done,
                    allowed_mentions=NO_MENTIONS,
                )
        channel_id = channel_of_key(session.channel_id)[0]
        if not any(t.channel_id == channel_id for t in self.turns.values()):
            self.typing.stop(channel_id)  # conversations held in one channel type there together

    def forget(self, session_id: str) -> Sequence[TurnView]:
        """Drop a deleted session's turns (♻️); returns them."""
        gone = [t for t in self.turns.values() if t.session_id == session_id]
        for turn in gone:
            del self.turns[turn.root_id]
            self.typing.stop(turn.channel_id)
        ended = [t for t in self.unmetered.values() if t.session_id == session_id]
        for turn in ended:
            del self.unmetered[turn.root_id]
        for root_id in [r for r, h in self.held.items() if h.session_id == session_id]:
            del self.held[root_id]
        return gone + ended


def no_view() -> ui.View:
    """An empty view: removes a message's buttons when edited in."""
    return ui.View(timeout=None)
