"""The Google Chat adapter's task tree: Pub/Sub pull in, the durable log out.

```
GChatAdapter.serve ── nursery ─┬─ Delivery.serve (log → Chat; hub events → cards; card updaters)
                               ├─ Puller.serve (streaming pull; callbacks on the library's threads)
                               ├─ reactions and notes (short tasks)
                               └─ this task: one pulled event at a time → Inbound.handle → ack
```
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from kesoku.vocab.errors import OperatorError
from kesoku_gchat.chat_api import CHAT_BOT_SCOPE, ChatApi, app_credentials, user_credentials
from kesoku_gchat.delivery import CARD_INTERVAL_S, Delivery
from kesoku_gchat.inbound import Inbound
from kesoku_gchat.pubsub import (
    CHANNEL_BUFFER,
    PUBSUB_SCOPE,
    PulledMessage,
    Puller,
    default_subscriber,
    subscription_path,
)

if TYPE_CHECKING:
    from kesoku.config.settings import Config, GChatConfig
    from kesoku.host.adapters import AdapterContext

log = logging.getLogger(__name__)


class GChatAdapter:
    """The Google Chat app of one process.

    Args:
        ctx: The adapter port (gateway, event hub, questions, path gates).
        gchat: ``[gchat]``.
        api: The Chat client.
        puller: The streaming pull of ``[gchat] subscription``.
        card_interval_s: Least time between two updates of a turn card.
    """

    def __init__(
        self,
        ctx: AdapterContext,
        gchat: GChatConfig,
        api: ChatApi,
        puller: Puller,
        *,
        card_interval_s: float = CARD_INTERVAL_S,
    ) -> None:
        self.ctx = ctx
        self.gchat = gchat
        self.api = api
        self.puller = puller
        self.delivery = Delivery(ctx, gchat.chatbot_id, api, card_interval_s=card_interval_s)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Pull events and deliver replies until cancelled; ``started`` once both directions run.

        Cancellation:
            Events received but not yet handled are nacked (Pub/Sub delivers them again).
        """
        async with trio.open_nursery() as nursery:
            await nursery.start(self.delivery.serve)
            inbound = Inbound(self.ctx, self.gchat, self.api, nursery)
            send, receive = trio.open_memory_channel[PulledMessage](CHANNEL_BUFFER)
            with receive:
                await nursery.start(self.puller.serve, send)
                task_status.started()
                try:
                    async for pulled in receive:
                        await inbound.handle(pulled)
                finally:
                    _nack_waiting(receive)
            # the stream ended: stop delivering too (the daemon reports it)
            nursery.cancel_scope.cancel()


def _nack_waiting(receive: trio.MemoryReceiveChannel[PulledMessage]) -> None:
    """Nack what the callbacks handed over but nobody handled (closing then refuses the rest)."""
    while True:
        try:
            receive.receive_nowait().nack()
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return


async def serve(
    ctx: AdapterContext,
    config: Config,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The daemon's entry: credentials from ``[gchat]``, the Chat API and Pub/Sub.

    The Chat API and the IAM Credentials API are reached at ``[gchat] chat_api_endpoint`` and
    ``iam_endpoint``; Pub/Sub at Google, or at the emulator ``PUBSUB_EMULATOR_HOST`` names (the
    client library's own switch).

    Raises:
        OperatorError: No subscription configured, or no usable credentials.
    """
    gchat = config.gchat
    if not gchat.subscription:
        raise OperatorError(
            "gchat: set [gchat] subscription (the Pub/Sub subscription the Chat app publishes to)"
        )
    try:
        path = subscription_path(gchat.subscription, gchat.project_id)
    except ValueError as exc:
        raise OperatorError(f"gchat: {exc}") from None
    credentials = await trio.to_thread.run_sync(
        app_credentials, gchat, [CHAT_BOT_SCOPE, PUBSUB_SCOPE]
    )
    user = None
    if gchat.reaction_emoji:
        try:
            user = await trio.to_thread.run_sync(user_credentials)
        except OperatorError as exc:  # reactions are a nicety: the adapter works without them
            log.warning("%s; no reactions", exc)
    api = await ChatApi.connect(credentials, endpoint=gchat.chat_api_endpoint, user=user)
    puller = Puller(path, default_subscriber(credentials))
    await GChatAdapter(ctx, gchat, api, puller).serve(task_status=task_status)
