"""Discord → Kesoku: who is answered, the conversation's thread, attachments, the user message.

A conversation is a session whose ``channel_id`` is the Discord thread (or, where threads are off,
the channel). In a regular channel every new conversation opens a thread from the user's message
("Start Thread from Message": the thread takes the message's id); a thread the user started is used
as it is. When several bots race to open the thread, the losers get HTTP 400 with JSON error code
160004 ("A thread has already been created for this message") and join the winner's thread, found
by the message's id.
"""

from __future__ import annotations

import logging
import mimetypes
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import trio
from kesoku.tools.attachments import display_name, save_attachment
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

        The conversation is the thread or channel of the message. One that is no session yet (a
        first message in a channel that would open a thread for it) still lists the schedules that
        run in that channel (``discord:<id>``).
        """
        gateway = self.ctx.gateway
        key = str(message.channel.id)
        session = gateway.find_session(self.adapter, key) or Session(
            id="", adapter=self.adapter, channel_id=key, created_at=0.0, workspace=""
        )
        lines = schedule_lines(gateway.schedules_of(session), now=time.time())
        for chunk in split_message(schedules_reply(lines, f"discord:{key}")):
            await aio(message.channel.send, chunk, allowed_mentions=discord.AllowedMentions.none())

    async def take_in(self, message: discord.Message) -> None:
        """Find the conversation, save the attachments, post the message (see :meth:`handle`)."""
        talk, override = await self.conversation(message)
        session = await self.session_for(message, talk, override)
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
        await self.ctx.gateway.post(post)
        if notes:
            await tell(talk, "\n".join(f"⚠️ {note}" for note in notes))

    def text(self, message: discord.Message) -> str:
        """The message's text, with the bot's own mention as ``@name`` (readable for the model)."""
        me = self.client.user
        text = message.content
        if me is not None:
            text = text.replace(f"<@{me.id}>", f"@{me.name}").replace(f"<@!{me.id}>", f"@{me.name}")
        return text.strip()

    # -- the conversation -------------------------------------------------------------------------

    async def conversation(self, message: discord.Message) -> tuple[Any, DiscordChannel | None]:
        """Where to talk (thread or channel) and the ``[[discord.channels]]`` entry that applies."""
        overrides = self.config.discord.channels
        channel = message.channel
        if isinstance(channel, discord.Thread):
            parent = channel.parent
            override = channel_override(overrides, channel.id, channel.name)
            if override is None and parent is not None:
                override = channel_override(overrides, parent.id, parent.name)
            return channel, override
        if isinstance(channel, discord.TextChannel):
            override = channel_override(overrides, channel.id, channel.name)
            if override is not None and not override.auto_thread:
                return channel, override
            thread = await self.open_thread(message)
            return (thread if thread is not None else channel), override
        return channel, None

    async def open_thread(self, message: discord.Message) -> discord.Thread | None:
        """Open a thread from the message, or join the one a peer bot opened first."""
        name = thread_name(valid_text(message.content))  # Discord's JSON may hold a lone surrogate
        try:
            # A day without messages archives it (Discord allows 60, 1440, 4320 or 10080 minutes).
            thread: discord.Thread = await aio(
                message.create_thread, name=name, auto_archive_duration=1440
            )
            return thread
        except discord.HTTPException as exc:
            # 160004: another bot won the race; its thread has the message's id.
            found = message.guild.get_thread(message.id) if message.guild is not None else None
            if found is None:
                try:
                    fetched = await aio(self.client.fetch_channel, message.id)
                except discord.HTTPException:
                    log.warning(
                        "discord: cannot open a thread on %s (%s); answering in the channel",
                        message.id,
                        exc,
                    )
                    return None
                found = fetched if isinstance(fetched, discord.Thread) else None
            if found is None:
                return None
            await aio(found.join)
            log.info("discord: joined thread %s opened by a peer", found.id)
            return found

    async def session_for(
        self, message: discord.Message, talk: Any, override: DiscordChannel | None
    ) -> Session:
        """The conversation's session.

        A new one is dated by the message and carries the context prompt.
        """
        gateway = self.ctx.gateway
        key = str(talk.id)
        session = gateway.find_session(self.adapter, key)
        if session is not None:
            # open_session makes the workspace folder if it is gone.
            return gateway.open_session(self.adapter, key)
        context = await self.context(message, talk)
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

        Returns:
            The saved attachments, and a note for each one that could not be downloaded or saved
            (told to the user and the model: never dropped silently).
        """
        saved: list[Attachment] = []
        notes: list[str] = []
        for item in message.attachments:
            name = display_name(item.filename)
            try:
                data: bytes = await aio(item.read)
            except (discord.HTTPException, aiohttp.ClientError, OSError) as exc:
                log.warning("discord: attachment %s of %s not fetched: %s", name, message.id, exc)
                notes.append(f"attachment {name} could not be downloaded ({exc})")
                continue
            try:
                path = await trio.to_thread.run_sync(save_attachment, folder, item.filename, data)
            except OSError as exc:
                log.warning("discord: attachment %s of %s not saved: %s", name, message.id, exc)
                notes.append(f"attachment {name} could not be saved ({os_problem(exc)})")
                continue
            guessed = mimetypes.guess_type(path.name)[0]
            mime = item.content_type or guessed or "application/octet-stream"
            saved.append(
                Attachment(path=str(path), mime_type=mime.split(";")[0].strip(), filename=path.name)
            )
        return saved, notes
