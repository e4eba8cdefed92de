"""The bridge: a discord.py client running on trio-asyncio's loop, handing events to the trio side.

discord.py is an asyncio library. The adapter opens ``trio_asyncio.open_loop()`` (an asyncio loop
run by trio) and starts the client with ``aio_as_trio(client.start)``; trio code calls discord.py
coroutines through :func:`aio` and discord.py's callbacks reach trio through the inbox channel
(messages) or ``trio_as_aio`` (button and command callbacks). Everything runs on the one thread, so
plain synchronous calls (the store, ``send_nowait``) are safe on either side.

Intents (Discord API, "Gateway Intents"): GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES and the privileged
MESSAGE_CONTENT (enable it for the bot in the developer portal, or message texts arrive empty).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import trio
import yarl
from kesoku.config.settings import DISCORD_API_BASE_URL, DISCORD_GATEWAY_URL

from kesoku_discord._compat import app_commands, discord, trio_asyncio
from kesoku_discord.views import DYNAMIC_ITEMS, Actions

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


async def aio(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await a discord.py coroutine function from trio (on the adapter's trio-asyncio loop)."""
    result: T = await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
    return result


async def on_trio(fn: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """Await a trio function from discord.py's side (a button or command callback)."""
    result: T = await trio_asyncio.trio_as_aio(fn)(*args, **kwargs)
    return result


def intents() -> discord.Intents:
    """Guilds, guild and direct messages, and message content (privileged)."""
    chosen = discord.Intents.none()
    chosen.guilds = True
    chosen.guild_messages = True
    chosen.dm_messages = True
    chosen.message_content = True
    return chosen


NO_MASS_MENTIONS = discord.AllowedMentions(
    everyone=False, roles=False, users=True, replied_user=False
)
"""Model output may mention a member on purpose, but never @everyone, @here or a role
(Discord API, "Allowed Mentions Object")."""


def log_failure(logger: logging.Logger, exc: Exception, what: str, *args: object) -> None:
    """Log a failed event: a refusal by Discord (HTTPException) in a line, a bug with a traceback.

    Args:
        logger: The module's logger.
        exc: The failure.
        what: What failed, a %-format (``"message %s not taken in"``) of ``args``.
        args: Its arguments (the event's id).
    """
    if isinstance(exc, discord.HTTPException):
        logger.warning(f"discord: {what}: %s", *args, exc)
    else:
        logger.error(f"discord: {what}", *args, exc_info=exc)


async def tell(channel: Any, text: str) -> None:
    """Send one line (a notice about a failure) to a channel from trio; a failure is only logged."""
    try:
        await aio(channel.send, text, allowed_mentions=NO_MASS_MENTIONS)
    except Exception as exc:
        log.warning("discord: notice not sent to channel %s: %s", getattr(channel, "id", "?"), exc)


def use_endpoints(api_base_url: str, gateway_url: str) -> None:
    """Point discord.py at a Discord REST API root and gateway (Discord's own, a proxy, a fake).

    Process-global: discord.py 2.7 has no per-client setting. Every REST call, interaction
    responses and webhooks included, builds its URL from the class attribute
    ``discord.http.Route.BASE``, and ``Client.connect`` opens the gateway at
    ``DiscordWebSocket.DEFAULT_GATEWAY`` (later at the ``resume_gateway_url`` READY gives). Set on
    every client made, defaults included, so a process never keeps an earlier client's endpoints.

    Args:
        api_base_url: The REST root up to ``/api/v10`` (``[discord] api_base_url``).
        gateway_url: The gateway's ``ws://`` or ``wss://`` URL (``[discord] gateway_url``).
    """
    discord.http.Route.BASE = api_base_url.rstrip("/")
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)


class KesokuClient(discord.Client):
    """The Discord client: forwards messages to the inbox, registers the buttons and /restart.

    Args:
        actions: The adapter: button and command callbacks call it.
        inbox: Where incoming messages go (the trio side reads them in order).
        restart: Called by /restart after its ephemeral confirmation.
        guild_ready_timeout: How long READY waits for GUILD_CREATE events (discord.py's option).
        api_base_url: Discord's REST root (see :func:`use_endpoints`).
        gateway_url: Discord's gateway (see :func:`use_endpoints`).
    """

    def __init__(
        self,
        actions: Actions,
        inbox: trio.MemorySendChannel[discord.Message],
        restart: Callable[[], Awaitable[None]],
        *,
        guild_ready_timeout: float = 2.0,
        api_base_url: str = DISCORD_API_BASE_URL,
        gateway_url: str = DISCORD_GATEWAY_URL,
    ) -> None:
        use_endpoints(api_base_url, gateway_url)
        super().__init__(
            intents=intents(),
            allowed_mentions=NO_MASS_MENTIONS,
            guild_ready_timeout=guild_ready_timeout,
        )
        self.actions = actions
        self.inbox = inbox
        self.ready = trio.Event()
        self.tree = app_commands.CommandTree(self)
        self._restart = restart
        self.tree.add_command(
            app_commands.Command(
                name="restart", description="Restart the Kesoku service.", callback=self._on_restart
            )
        )

    async def setup_hook(self) -> None:
        """Register the persistent buttons and sync the slash commands.

        The sync is PUT /applications/{id}/commands.
        """
        self.add_dynamic_items(*DYNAMIC_ITEMS)
        try:
            await self.tree.sync()
        except discord.HTTPException as exc:  # the bot still answers messages without /restart
            log.warning("discord: cannot register slash commands: %s", exc)

    async def on_ready(self) -> None:
        """READY and the guilds arrived (also after a reconnect that needed a new session)."""
        log.info("discord: connected as %s (%s guilds)", self.user, len(self.guilds))
        self.ready.set()

    async def on_message(self, message: discord.Message) -> None:
        """Hand the message to the trio side, in arrival order.

        The buffer is bounded; a full one waits.
        """
        try:
            self.inbox.send_nowait(message)
        except trio.WouldBlock:
            await on_trio(self.inbox.send, message)

    async def _on_restart(self, interaction: discord.Interaction[Any]) -> None:
        await interaction.response.send_message("♻️ Restarting Kesoku…", ephemeral=True)
        log.info("discord: /restart by %s", interaction.user)
        await self._restart()
