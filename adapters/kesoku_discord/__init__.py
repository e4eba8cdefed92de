"""The Discord adapter: discord.py inside trio-asyncio (extra: ``kesoku[discord]``).

Found through the ``kesoku.adapters`` entry point and imported only when ``[discord] enabled =
true``; discord.py itself (about 240 ms to import) is imported only inside :func:`serve`.

Modules: ``convert`` (pure rules: answering, chunking, rendering, the context prompt), ``client``
(the discord.py client and the trio/asyncio bridge), ``inbound`` (Discord → the gateway),
``delivery`` (the log → Discord, headers, typing), ``views`` (persistent buttons), ``restart``
(/restart), ``trace`` (📜), ``adapter`` (the task tree and the button actions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.host.adapters import AdapterContext


def enabled(config: Config) -> bool:
    """Run when ``[discord] enabled = true``."""
    return config.discord.enabled


async def serve(
    ctx: AdapterContext,
    config: Config,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the Discord bot until cancelled (see :class:`kesoku_discord.adapter.DiscordAdapter`)."""
    # discord.py's import is ~240 ms of CPU: off the event loop, in a worker thread.
    await trio.to_thread.run_sync(_load)
    from kesoku_discord.adapter import DiscordAdapter

    await DiscordAdapter(ctx, config).serve(task_status=task_status)


def _load() -> None:
    import kesoku_discord.adapter  # noqa: F401  (imports discord.py and trio-asyncio)
