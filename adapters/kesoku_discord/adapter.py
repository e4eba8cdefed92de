"""The Discord adapter: connect, take messages in, follow the turns, and answer the buttons.

Task tree (all inside ``trio_asyncio.open_loop()``)::

    DiscordAdapter.serve ─┬─ the discord.py client (asyncio; shielded: closed, not torn down)
                          └─ work ─┬─ Delivery.serve   (the durable log → Discord)
                                   ├─ inbound loop     (Discord → the gateway, in arrival order)
                                   ├─ turn watcher     (TurnEnded → the header's metrics)
                                   └─ typing indicators
"""

from __future__ import annotations

import io
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio
from kesoku.observe.trace import render_turn_page
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.events import Subscription, TurnEnded
from kesoku.vocab.markup import QuestionPart, parse_reply
from kesoku.vocab.model import QUESTION_KEY, user_text

from kesoku_discord._compat import discord, trio_asyncio
from kesoku_discord.client import KesokuClient, aio, log_failure, on_trio
from kesoku_discord.delivery import Delivery, no_view
from kesoku_discord.inbound import Inbound
from kesoku_discord.restart import restart_process
from kesoku_discord.views import disabled_copy

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.host.adapters import AdapterContext

log = logging.getLogger(__name__)

INBOX_BUFFER = 256
"""Incoming messages waiting for the inbound loop (a burst in many channels); a full inbox makes
discord.py's event task wait, it never drops a message."""
CLOSE_TIMEOUT_S = 10.0
"""Longest wait for the Discord client to close (websocket and HTTP session) at shutdown."""
SEEN_IDS = 4096
"""Recent Discord message ids remembered, so a replayed MESSAGE_CREATE is dropped before any REST
call. The durable guard is the inbound side's: a message taken in again (after a restart) reuses
its thread and files, and the gateway stores it once (kesoku_discord.inbound)."""


def bot_token(config: Config, env: Mapping[str, str] | None = None) -> str:
    """The bot token: ``[discord] bot_token``, else ``DISCORD_TOKEN`` (load_config applies it too).

    Raises:
        OperatorError: Neither is set.
    """
    env = os.environ if env is None else env
    token = config.discord.bot_token or env.get("DISCORD_TOKEN")
    if not token:
        raise OperatorError(
            "discord: no bot token: set [discord] bot_token or the DISCORD_TOKEN variable"
        )
    return token


class DiscordAdapter:
    """The Discord adapter of one daemon.

    Args:
        ctx: The adapter port (gateway, event hub, questions, path gates).
        config: The loaded config (``[discord]``, ``[workspace]``).
        restart: What /restart does once the client is closed; default: :func:`restart_process`.
        guild_ready_timeout: discord.py's wait for GUILD_CREATE events after READY.
    """

    def __init__(
        self,
        ctx: AdapterContext,
        config: Config,
        *,
        restart: Callable[[], Awaitable[None]] = restart_process,
        guild_ready_timeout: float = 2.0,
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.gateway = ctx.gateway
        self.restart_hook = restart
        self.guild_ready_timeout = guild_ready_timeout
        self.client: KesokuClient | None = None
        self.delivery: Delivery | None = None
        self.seen: deque[int] = deque(maxlen=SEEN_IDS)
        self.answered: set[tuple[int, int]] = set()
        self.restarted = trio.Event()
        self._outer: trio.Nursery | None = None
        self._work: trio.CancelScope | None = None

    def token(self) -> str:
        """The bot token (see :func:`bot_token`)."""
        return bot_token(self.config)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then deliver and receive until cancelled (or /restart).

        Raises:
            OperatorError: No token.
            discord.LoginFailure: Discord refused the token.

        Cancellation:
            The client is closed first (shielded, bounded by :data:`CLOSE_TIMEOUT_S`), so its
            websocket and HTTP session end cleanly.
        """
        token = self.token()
        send, receive = trio.open_memory_channel[discord.Message](INBOX_BUFFER)
        async with trio_asyncio.open_loop(), trio.open_nursery() as outer:
            self._outer = outer
            discord_config = self.config.discord
            client = self.client = KesokuClient(
                self,
                send,
                self._on_restart,
                guild_ready_timeout=self.guild_ready_timeout,
                api_base_url=discord_config.api_base_url,
                gateway_url=discord_config.gateway_url,
            )
            client_scope = trio.CancelScope(shield=True)
            outer.start_soon(self._run_client, client, token, client_scope)
            try:
                with trio.CancelScope() as self._work:
                    async with trio.open_nursery() as work:
                        await client.ready.wait()
                        delivery = self.delivery = Delivery(self.ctx, self.config, client, work)
                        # Subscribed before the delivery reads the log: a turn whose user message
                        # it reads as running ends after this, so its end is seen (one that had
                        # ended is shown as such: Delivery.open_turn).
                        ends = self.ctx.hub.subscribe()
                        work.start_soon(self._watch_turns, delivery, work, ends)
                        await work.start(delivery.serve)
                        inbound = Inbound(self.ctx, self.config, client)
                        work.start_soon(self._inbound_loop, inbound, receive)
                        task_status.started()
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                    await aio(client.close)
                client_scope.shield = False
                client_scope.cancel()
            if self.restarted.is_set():
                await self.restart_hook()

    async def _run_client(self, client: KesokuClient, token: str, scope: trio.CancelScope) -> None:
        # Shielded: cancelling discord.py's task mid-way would leave its websocket and HTTP session
        # open; serve() closes the client instead, which makes start() return.
        with scope:
            await aio(client.start, token)
        if not client.ready.is_set():
            raise OperatorError("discord: the client stopped before it was ready")

    async def _inbound_loop(
        self, inbound: Inbound, receive: trio.MemoryReceiveChannel[discord.Message]
    ) -> None:
        async for message in receive:
            if message.id in self.seen:
                continue  # replayed by Discord after a reconnect
            self.seen.append(message.id)
            try:
                await inbound.handle(message)
            except Exception:  # before it was known whether to answer (handle tells the user after)
                log.exception("discord: message %s not taken in", message.id)

    async def _watch_turns(
        self, delivery: Delivery, nursery: trio.Nursery, events: Subscription
    ) -> None:
        adapter = self.config.discord.chatbot_id
        with events:
            async for event in events:
                if not isinstance(event, TurnEnded):
                    continue
                try:
                    session = self.gateway.get_session(event.session_id)
                except Exception:  # the store failing once must not stop the headers of later turns
                    log.exception("discord: end of turn %d not shown", event.metrics.root_id)
                    continue
                if session is not None and session.adapter == adapter:
                    nursery.start_soon(self._finish, delivery, event)

    async def _finish(self, delivery: Delivery, event: TurnEnded) -> None:
        try:
            await delivery.finish_turn(event.metrics)
        except Exception as exc:
            log_failure(log, exc, "header of turn %d not updated", event.metrics.root_id)

    async def _on_restart(self) -> None:
        """/restart (after its ephemeral reply): stop the listeners and the client, then restart."""
        self.restarted.set()
        if self._work is not None:
            self._work.cancel()

    # -- buttons (called by discord.py on the asyncio side) ----------------------------------------

    async def on_trace(
        self, interaction: discord.Interaction[Any], session_id: str, root_id: int
    ) -> None:
        """📜: send the turn's trajectory as an HTML file (ephemeral).

        The page is rendered in a worker thread.
        """
        await interaction.response.defer(ephemeral=True, thinking=True)
        page = await on_trio(
            trio.to_thread.run_sync, render_turn_page, self.gateway.db_path, session_id, root_id
        )
        if page is None:
            await interaction.followup.send("This session is gone.", ephemeral=True)
            return
        html, name = page
        await interaction.followup.send(
            file=discord.File(io.BytesIO(html.encode()), filename=name), ephemeral=True
        )

    async def on_stop(
        self, interaction: discord.Interaction[Any], session_id: str, root_id: int
    ) -> None:
        """🛑: stop the turn and delete its thoughts and tool messages.

        The runtime marks the turn's prompt interrupted.
        """
        # Marked before any await: the turn may end (and leave delivery's table) during the defer.
        turn = self.delivery.turns.get(root_id) if self.delivery is not None else None
        if turn is not None:
            turn.stopped = True
        stopped = self.ctx.gateway.stop(session_id)
        await interaction.response.defer()
        if turn is not None:
            ids, turn.intermediate = turn.intermediate, []
            channel = interaction.channel
            for message_id in ids:
                if isinstance(channel, discord.abc.Messageable) and hasattr(
                    channel, "get_partial_message"
                ):
                    try:
                        await channel.get_partial_message(message_id).delete()
                    except discord.HTTPException as exc:
                        log.debug("discord: cannot delete %s: %s", message_id, exc)
        if not stopped:
            await interaction.followup.send("Nothing is running.", ephemeral=True)

    async def on_clear(self, interaction: discord.Interaction[Any], session_id: str) -> None:
        """♻️: delete the session, its messages and its workspace; the next message starts anew."""
        await interaction.response.defer()
        self.ctx.gateway.stop(session_id, force=True)
        if self.delivery is not None:
            for turn in self.delivery.forget(session_id):
                if (
                    turn.header is not None
                    and interaction.message is not None
                    and turn.header.id != interaction.message.id
                ):
                    await turn.header.edit(view=no_view())
        deleted = await on_trio(self.ctx.gateway.delete_session, session_id)
        text = (
            "♻️ Session cleared: the next message starts a new conversation."
            if deleted
            else "♻️ Already cleared."
        )
        if interaction.message is not None:
            await interaction.message.edit(content=text, view=no_view())

    async def on_choice(
        self, interaction: discord.Interaction[Any], message_id: int, part: int, choice: int
    ) -> None:
        """A ``[question: …]`` choice: disable the buttons and say who chose what.

        The choice is then posted as the user's message.
        """
        stored = self.gateway.get_message(message_id)
        parts = parse_reply(stored.content) if stored is not None else []
        question = parts[part] if part < len(parts) else None
        if (
            stored is None
            or not isinstance(question, QuestionPart)
            or choice >= len(question.choices)
        ):
            await interaction.response.send_message("This question is gone.", ephemeral=True)
            return
        if (message_id, part) in self.answered:
            await interaction.response.send_message("Already answered.", ephemeral=True)
            return
        self.answered.add((message_id, part))
        text = question.choices[choice]
        await self._chosen(interaction, choice, text)
        user = interaction.user
        post = user_text(
            stored.session_id, text, sender=user.name, external_id=f"choice:{interaction.id}"
        )
        await on_trio(self.ctx.gateway.post, post)

    async def on_answer(
        self, interaction: discord.Interaction[Any], question_id: int, choice: int
    ) -> None:
        """Allow/Deny on a tool's question: answered through ``ctx.questions``.

        Not through a user message: one would deny the question.
        """
        stored = self.gateway.get_message(question_id)
        options = (
            [str(o) for o in stored.metadata.extra.get(QUESTION_KEY, {}).get("options", ())]
            if stored
            else []
        )
        if choice >= len(options):
            await interaction.response.send_message("This question is gone.", ephemeral=True)
            return
        label = options[choice]
        if not self.ctx.questions.answer(question_id, label, by=interaction.user.name):
            await interaction.response.send_message(
                "This question is closed already.", ephemeral=True
            )
            return
        if self.delivery is not None:
            self.delivery.questions.pop(question_id, None)
        await self._chosen(interaction, choice, label)

    async def _chosen(self, interaction: discord.Interaction[Any], choice: int, text: str) -> None:
        if interaction.message is not None:
            await interaction.response.edit_message(view=disabled_copy(interaction.message, choice))
        else:
            await interaction.response.defer()
        channel = interaction.channel
        if isinstance(channel, discord.abc.Messageable):
            await channel.send(
                f"<@{interaction.user.id}> selected: **{text}**",
                allowed_mentions=discord.AllowedMentions.none(),
            )
