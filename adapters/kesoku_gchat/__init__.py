"""The Google Chat adapter: Pub/Sub pull in (no inbound webhook, no public URL), Chat REST out.

Found through the ``kesoku.adapters`` entry point and imported only when ``[gchat] enabled``; the
Google libraries (the ``gchat`` extra) load in worker threads when the adapter starts.

Modules: ``events`` (the Chat event JSON), ``pubsub`` (streaming pull bridged into trio),
``chat_api`` (credentials and the REST calls), ``cards`` (Cards v2 JSON), ``delivery`` (log → Chat,
turn cards), ``inbound`` (events → messages, answers, stops), ``adapter`` (the task tree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.host.adapters import AdapterContext


async def serve(
    ctx: AdapterContext,
    config: Config,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the Google Chat app until cancelled (see :func:`kesoku_gchat.adapter.serve`)."""
    from kesoku_gchat.adapter import serve as serve_adapter

    await serve_adapter(ctx, config, task_status=task_status)
