"""Discord → Kesoku: who is answered, the conversation's thread, attachments, the user message.

A conversation is a session whose ``channel_id`` is the Discord thread (or, where threads are off,
the channel). In a regular channel every new conversation opens a thread from the user's message
("Start Thread from Message": the thread takes the message's id); a thread the user started is used
as it is. When several bots race to open the thread, the losers get HTTP 400 with JSON error code
160004 ("A thread has already been created for this message") and join the winner's thread, found
by the message's id.

Where Discord refuses the thread (403: the bot lacks Create Public Threads there), the conversation
goes on in the channel, said there once: its session is ``<channel id>/<first message id>``
(:func:`conversation_key`), and a reply (Discord's Reply) to one of its messages, up a chain of
replies, continues it; any other message starts a new one.

A message is taken in once: Discord may deliver it again (a replay after a restart, or after a
crash before it was stored), and its effects are keyed by its id so that a second take-in repeats
none. The thread of a message has the message's id, so it is looked up before one is opened; an
attachment already saved from it is found unchanged in the workspace
(:func:`~kesoku.tools.attachments.saved_copy`) and reused; the gateway stores the message once
(``external_id``), and what is told in the channel is told only when it was stored now.
"""

from __future__ import annotations

import logging
import mimetypes
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import trio
from kesoku.tools.attachments import display_name, save_attachment, saved_copy
from kesoku.tools.paths import os_problem
from kesoku.vocab.model import Attachment, Session, user_text
from kesoku.vocab.schedule import SCHEDULES_COMMAND, schedule_lines, schedules_reply
from kesoku.vocab.spend import BUDGET_GROUP_KEY
from kesoku.vocab.text import valid_text

from kesoku_discord._compat import discord
from kesoku_discord.client import aio, log_failure, tell
from kesoku_discord.convert import (
    Author,
    Place,
    attachment_note,
    channel_override,
    context_prompt,
    should_answer,
    split_message,
    strip_mention,
    thread_name,
)

if TYPE_CHECKING:
    from kesoku.config.settings import Config, DiscordChannel
    from kesoku.host.adapters import AdapterContext

log = logging.getLogger(__name__)

HISTORY_FOR_MEMBERS = 50
"""Recent channel messages read to find the active members for the context prompt."""
MAX_MEMBERS = 20
"""Active members listed in the context prompt."""
REPLY_HOPS = 4
"""Replies followed up a chain (a reply to a reply to …) to find the conversation a message
continues in a channel without threads."""
THREADS_REFUSED = (
    "⚠️ I can't open threads in this channel ({why}), so I answer here: reply to one of my "
    "messages to go on with its conversation; any other message starts a new one."
)
"""Told once per channel (while the adapter runs) when Discord refuses to open a thread."""


def conversation_key(channel_id: int, first_id: int) -> str:
    """The session key of a conversation held in a channel without a thread.

    Args:
        channel_id: The text channel's id.
        first_id: The id of the message that started the conversation (the id its thread would
            have had).

    Returns:
        ``"<channel id>/<first message id>"``.
    """
    return f"{channel_id}/{first_id}"


def channel_of_key(key: str) -> tuple[int, int | None]:
    """A Discord session key read back: the channel or thread to speak in, and the first message.

    Args:
        key: A session's ``channel_id``: a thread's or channel's id, or :func:`conversation_key`.

    Returns:
        The channel's (or thread's) id, and the id of the message that started a conversation held
        in the channel without a thread (None for a thread or a whole channel).

    Raises:
        ValueError: Not a Discord session key.
    """
    channel, _, first = key.partition("/")
    return int(channel), (int(first) if first else None)


@dataclass(frozen=True, slots=True)
class Conversation:
    """Where a message's conversation is held."""

    where: Any
    """The thread or channel to speak in (a discord.py Messageable)."""
    key: str
    """The session's ``channel_id``: the thread's or channel's id, or :func:`conversation_key`."""
    override: DiscordChannel | None
    """The ``[[discord.channels]]`` entry that applies."""


class Inbound:
    """Turns Discord messages into Kesoku user messages.

    Args:
        ctx: The adapter port (gateway, event hub, questions, path gates).
        config: The loaded config.
        client: The connected client.
    """

    def __init__(self, ctx: AdapterContext, config: Config, client: discord.Client) -> None:
        self.ctx = ctx
        self.config = config
        self.client = client
        self.adapter = config.discord.chatbot_id
        self.told_no_threads: set[int] = set()
        """Channels told that threads cannot be opened there (once each while the adapter runs)."""

    def author(self, message: discord.Message) -> Author:
        """The facts :func:`should_answer` needs."""
        me = self.client.user
        assert me is not None  # only called once connected
        my_roles = set()
        if message.guild is not None and message.guild.me is not None:
            my_roles = {r.id for r in message.guild.me.roles if not r.is_default()}
        by_role = any(r.id in my_roles for r in message.role_mentions)
        others = [u for u in message.mentions if u.id != me.id]
        other_roles = [r for r in message.role_mentions if r.id not in my_roles]
        author = message.author
        return Author(
            names=(author.name, author.display_name, str(author.id)),
            is_bot=author.bot or author.id == me.id,
            mentions_bot=any(u.id == me.id for u in message.mentions) or by_role,
            mentions_others=bool(message.mention_everyone or others or other_roles),
            direct=isinstance(message.channel, discord.DMChannel),
        )

    async def handle(self, message: discord.Message) -> None:
        """Take one message in: decide, find the conversation, save attachments, post it.

        A message to answer is its own failure domain: an error is logged with its id and told in
        one line in its channel, and nothing else is affected.
        """
        if not should_answer(self.author(message), self.config.discord.user_allowlist):
            return
        try:
            if self.is_schedules_command(message):
                await self.list_schedules(message)
            else:
                await self.take_in(message)
        except Exception as exc:
            log_failure(log, exc, "message %s not taken in", message.id)
            what = type(exc).__name__
            notice = f"⚠️ I could not take this message in ({what}); please send it again."
            await tell(message.channel, notice)

    def is_schedules_command(self, message: discord.Message) -> bool:
        """Whether the message is ``/schedules`` (the bot's mention aside)."""
        me = self.client.user
        text = strip_mention(message.content, me.id) if me is not None else message.content
        return text.strip() == SCHEDULES_COMMAND

    async def list_schedules(self, message: discord.Message) -> None:
        """Answer ``/schedules`` where it was written; no turn, nothing stored.

        The conversation is the thread or channel of the message, or the one held in the channel
        that it replies to (where threads are refused: :meth:`continued`). One that is no session
        yet (a first message in a channel that would open a thread for it) still lists the
        schedules that run in that channel (``discord:<id>``).
        """
        gateway = self.ctx.gateway
        key = str(message.channel.id)
        if isinstance(message.channel, discord.TextChannel):
            key = await self.continued(message) or key
        session = gateway.find_session(self.adapter, key) or Session(
            id="", adapter=self.adapter, channel_id=key, created_at=0.0, workspace=""
        )
        lines = schedule_lines(gateway.schedules_of(session), now=time.time())
        for chunk in split_message(schedules_reply(lines, f"discord:{key}")):
            await aio(message.channel.send, chunk, allowed_mentions=discord.AllowedMentions.none())

    async def take_in(self, message: discord.Message) -> None:
        """Find the conversation, save the attachments, post the message (see :meth:`handle`).

        Taken in again (the module's doc), it reuses the thread and the saved files, and tells
        nothing a second time.
        """
        talk = await self.conversation(message)
        session = await self.session_for(message, talk)
        attachments, notes = await self.save_attachments(message, Path(session.workspace))
        lines = [attachment_note((a.filename, a.path) for a in attachments)] if attachments else []
        lines += [f"[{note}]" for note in notes]  # the model learns of what it cannot see
        text = "\n\n".join(filter(None, [self.text(message), "\n".join(lines)]))
        post = user_text(
            session.id,
            text or "(an empty message)",
            sender=message.author.name,
            external_id=str(message.id),
            attachments=tuple(attachments),
        )
        newest = self.ctx.gateway.last_message_id()
        stored = await self.ctx.gateway.post(post)
        if stored.id <= newest:
            log.info("discord: message %s was taken in before (message %d)", message.id, stored.id)
            return  # what there was to tell was told then
        if notes:
            await tell(talk.where, "\n".join(f"⚠️ {note}" for note in notes))

    def text(self, message: discord.Message) -> str:
        """The message's text, with the bot's own mention as ``@name`` (readable for the model)."""
        me = self.client.user
        text = message.content
        if me is not None:
            text = text.replace(f"<@{me.id}>", f"@{me.name}").replace(f"<@!{me.id}>", f"@{me.name}")
        return text.strip()

    # -- the conversation -------------------------------------------------------------------------

    async def conversation(self, message: discord.Message) -> Conversation:
        """Where the message's conversation is held (see the module's doc)."""
        overrides = self.config.discord.channels
        channel = message.channel
        if isinstance(channel, discord.Thread):
            parent = channel.parent
            override = channel_override(overrides, channel.id, channel.name)
            if override is None and parent is not None:
                override = channel_override(overrides, parent.id, parent.name)
            return Conversation(channel, str(channel.id), override)
        if isinstance(channel, discord.TextChannel):
            override = channel_override(overrides, channel.id, channel.name)
            if override is not None and not override.auto_thread:
                return Conversation(channel, str(channel.id), override)
            key = await self.continued(message)
            if key is not None:
                return Conversation(channel, key, override)
            thread = await self.open_thread(message)
            if thread is not None:
                return Conversation(thread, str(thread.id), override)
            return Conversation(channel, conversation_key(channel.id, message.id), override)
        return Conversation(channel, str(channel.id), None)

    async def continued(self, message: discord.Message) -> str | None:
        """The key of the conversation without a thread that the message is part of, if any.

        It is one when the message started it (taken in before), or when it replies to a message of
        it: the chain of replies is followed up at most :data:`REPLY_HOPS` messages (the first from
        the event, the others fetched) until a message that started a conversation.
        """
        channel = message.channel
        current: discord.Message | None = message
        message_id = message.id
        for hop in range(REPLY_HOPS + 1):
            key = conversation_key(channel.id, message_id)
            if self.ctx.gateway.find_session(self.adapter, key) is not None:
                return key
            if hop == REPLY_HOPS:
                break
            if current is None:
                try:
                    current = await aio(channel.fetch_message, message_id)
                except discord.HTTPException as exc:  # deleted, or no history permission
                    log.debug("discord: replies of %s end at %s: %s", message.id, message_id, exc)
                    return None
            reference = current.reference
            if reference is None or reference.message_id is None:
                return None
            if reference.channel_id != channel.id:
                return None  # a reply to another channel's message (a forward, a crosspost)
            message_id = reference.message_id
            resolved = reference.resolved
            current = resolved if isinstance(resolved, discord.Message) else None
        return None

    async def open_thread(self, message: discord.Message) -> discord.Thread | None:
        """The message's thread: opened before, else opened now, else a peer bot's.

        Returns:
            The thread; None when Discord refuses one (told once in the channel: see
            :meth:`threads_refused`).
        """
        found = await self.thread_of(message, fetch=False)
        if found is not None:
            return found  # taken in before (a replay): not opened again
        name = thread_name(valid_text(message.content))  # Discord's JSON may hold a lone surrogate
        try:
            # A day without messages archives it (Discord allows 60, 1440, 4320 or 10080 minutes).
            thread: discord.Thread = await aio(
                message.create_thread, name=name, auto_archive_duration=1440
            )
            return thread
        except discord.Forbidden as exc:  # 403: no Create Public Threads permission here
            await self.threads_refused(message, exc)
            return None
        except discord.HTTPException as exc:
            # 160004: another bot won the race; its thread has the message's id.
            found = await self.thread_of(message, fetch=True)
            if found is None:
                await self.threads_refused(message, exc)
            return found

    async def thread_of(self, message: discord.Message, *, fetch: bool) -> discord.Thread | None:
        """The thread opened from the message (it has the message's id), if there is one.

        Looked up in the client's cache (a thread that is not archived), then, when ``fetch`` or
        when a session for it exists (it was opened before, and may be archived since), with
        ``GET /channels/{id}``. A peer bot's thread found there is joined (Discord sends a bot the
        messages of the threads it is a member of).
        """
        guild = message.guild
        if guild is None:
            return None
        found = guild.get_thread(message.id)
        opened = self.ctx.gateway.find_session(self.adapter, str(message.id)) is not None
        if found is None and (fetch or opened):
            try:
                fetched = await aio(self.client.fetch_channel, message.id)
            except discord.HTTPException as exc:
                log.debug("discord: no thread for message %s: %s", message.id, exc)
                return None
            found = fetched if isinstance(fetched, discord.Thread) else None
        me = self.client.user
        if found is not None and me is not None and found.owner_id != me.id:
            await aio(found.join)  # PUT: joining a thread twice changes nothing
            log.info("discord: joined thread %s opened by a peer", found.id)
        return found

    async def threads_refused(self, message: discord.Message, exc: discord.HTTPException) -> None:
        """Discord refused the message's thread: the conversation is held in the channel.

        Said in the channel once while the adapter runs (:data:`THREADS_REFUSED`), not on every
        message; logged every time.
        """
        channel = message.channel
        log.warning(
            "discord: cannot open a thread on %s in channel %s (%s); answering in the channel",
            message.id,
            channel.id,
            exc,
        )
        if channel.id in self.told_no_threads:
            return
        self.told_no_threads.add(channel.id)
        await tell(channel, THREADS_REFUSED.format(why=f"{exc.status} {exc.text}".strip()))

    async def session_for(self, message: discord.Message, talk: Conversation) -> Session:
        """The conversation's session.

        A new one is dated by the message and carries the context prompt.
        """
        gateway = self.ctx.gateway
        key = talk.key
        override = talk.override
        session = gateway.find_session(self.adapter, key)
        if session is not None:
            # open_session makes the workspace folder if it is gone.
            return gateway.open_session(self.adapter, key)
        context = await self.context(message, talk.where)
        # The store makes the context's names valid UTF-8 (kesoku.vocab.text).
        return gateway.open_session(
            self.adapter,
            key,
            created_at=message.created_at.timestamp(),
            llm=override.llm if override is not None else None,
            metadata={"context": context}
            | ({BUDGET_GROUP_KEY: override.label} if override is not None else {}),
        )

    async def context(self, message: discord.Message, talk: Any) -> str:
        """The context prompt: server, channel, thread, the bot, active members and their ids."""
        me = self.client.user
        assert me is not None
        base = (
            talk.parent
            if isinstance(talk, discord.Thread) and talk.parent is not None
            else message.channel
        )
        members: dict[int, tuple[str, str, int]] = {}
        author = message.author
        members[author.id] = (author.display_name, author.name, author.id)

        async def recent() -> list[discord.Message]:
            if not isinstance(base, discord.abc.Messageable):
                return []
            return [m async for m in base.history(limit=HISTORY_FOR_MEMBERS)]

        try:
            for seen in await aio(recent):
                if seen.author.id != me.id and len(members) < MAX_MEMBERS:
                    members.setdefault(
                        seen.author.id, (seen.author.display_name, seen.author.name, seen.author.id)
                    )
        except (discord.HTTPException, AttributeError) as exc:  # no history permission, or a DM
            log.debug("discord: no channel history for the context: %s", exc)
        guild = message.guild
        place = Place(
            server=guild.name if guild is not None else None,
            server_id=guild.id if guild is not None else None,
            channel=getattr(base, "name", None) or "direct message",
            channel_id=base.id,
            topic=getattr(base, "topic", None),
            thread=talk.name if isinstance(talk, discord.Thread) else None,
            thread_id=talk.id if isinstance(talk, discord.Thread) else None,
            bot=(me.name, me.id),
            members=tuple(members.values()),
        )
        return context_prompt(place)

    # -- attachments ------------------------------------------------------------------------------

    async def save_attachments(
        self, message: discord.Message, folder: Path
    ) -> tuple[list[Attachment], list[str]]:
        """Download each attachment into the session's workspace under a safe, unique name.

        One saved by an earlier take-in of the message, still unchanged, is reused
        (:func:`~kesoku.tools.attachments.saved_copy`).

        Returns:
            The saved attachments, and a note for each one that could not be downloaded or saved
            (told to the user and the model: never dropped silently).
        """
        saved: list[Attachment] = []
        notes: list[str] = []
        used: set[Path] = set()
        for item in message.attachments:
            name = display_name(item.filename)
            try:
                data: bytes = await aio(item.read)
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning("discord: attachment %s of %s not fetched: %s", name, message.id, exc)
                notes.append(f"attachment {name} could not be downloaded ({exc})")
                continue
            try:
                path = await trio.to_thread.run_sync(_save_once, folder, item.filename, data, used)
            except OSError as exc:
                log.warning("discord: attachment %s of %s not saved: %s", name, message.id, exc)
                notes.append(f"attachment {name} could not be saved ({os_problem(exc)})")
                continue
            used.add(path)
            guessed = mimetypes.guess_type(path.name)[0]
            mime = item.content_type or guessed or "application/octet-stream"
            saved.append(
                Attachment(path=str(path), mime_type=mime.split(";")[0].strip(), filename=path.name)
            )
        return saved, notes


def _save_once(folder: Path, filename: str, data: bytes, used: set[Path]) -> Path:
    """The copy an earlier take-in saved (not one of ``used``), else a new one (blocking)."""
    again = saved_copy(folder, filename, data, exclude=used)
    return again if again is not None else save_attachment(folder, filename, data)
