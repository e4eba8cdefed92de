"""Pub/Sub streaming pull, bridged into trio: Chat events in with no inbound webhook or public URL.

google-cloud-pubsub's ``SubscriberClient.subscribe`` keeps a gRPC stream open and calls back on its
own threads. Each callback hands its message to trio with ``trio.from_thread.run(send.send, ...)``:
the bounded memory channel plus the library's ``FlowControl`` are the backpressure (a full channel
blocks the callback thread; past ``max_messages`` outstanding messages the library pauses the
stream). A message is acked by its consumer only once it is persisted; one that cannot be handed
over (the channel closed, the trio run over) is nacked, so Pub/Sub delivers it again.

Ack and nack are safe from the trio thread: they only queue a request for the library's dispatcher
thread (google-cloud-pubsub, ``subscriber.message.Message.ack``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import trio

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

log = logging.getLogger(__name__)

MAX_OUTSTANDING = 16
"""``FlowControl.max_messages``: events pulled but not yet acked (a chat's burst, not a backlog)."""
MAX_OUTSTANDING_BYTES = 16 * 1024 * 1024
"""``FlowControl.max_bytes``: a Chat event is a few KB; this only bounds a pathological backlog."""
CHANNEL_BUFFER = 8
"""Messages waiting between the callback threads and the trio consumer; half the flow-control
window."""
CLOSE_TIMEOUT_S = 10.0
"""How long stopping the stream may take at shutdown (the library's threads join in the
background)."""
PUBSUB_SCOPE = "https://www.googleapis.com/auth/pubsub"


class PulledMessage(Protocol):
    """What Kesoku uses of ``google.cloud.pubsub_v1.subscriber.message.Message``."""

    @property
    def data(self) -> bytes:
        """The payload: a Chat event's JSON."""
        ...

    @property
    def message_id(self) -> str:
        """Pub/Sub's id of the message (the same on every redelivery)."""
        ...

    def ack(self) -> None:
        """Done with it: Pub/Sub will not deliver it again."""

    def nack(self) -> None:
        """Not handled: Pub/Sub delivers it again soon."""


SubscriberFactory = Callable[[], Any]
"""Builds a ``SubscriberClient`` (called in a worker thread: the import and the gRPC channel are
slow)."""


def subscription_path(subscription: str, project_id: str | None) -> str:
    """The full subscription name: ``projects/P/subscriptions/S``.

    Args:
        subscription: ``[gchat] subscription``, either the full name or the short one.
        project_id: ``[gchat] project_id`` (needed with a short name).

    Raises:
        ValueError: A short name without a project.
    """
    if subscription.startswith("projects/"):
        return subscription
    if not project_id:
        raise ValueError(
            "[gchat] subscription is a short name: set [gchat] project_id (or GOOGLE_CLOUD_PROJECT)"
        )
    return f"projects/{project_id}/subscriptions/{subscription}"


def default_subscriber(credentials: Credentials | None) -> SubscriberFactory:
    """A factory of the real client: the emulator when ``PUBSUB_EMULATOR_HOST`` is set, else Google.

    The library itself switches to an insecure channel and anonymous credentials when
    ``PUBSUB_EMULATOR_HOST`` is set (google-cloud-pubsub, "Testing apps locally with the emulator").
    """

    def make() -> Any:
        from google.cloud import pubsub_v1  # type: ignore[import-untyped]

        if os.environ.get("PUBSUB_EMULATOR_HOST") or credentials is None:
            return pubsub_v1.SubscriberClient()
        return pubsub_v1.SubscriberClient(credentials=credentials)

    return make


@dataclass
class Puller:
    """One streaming pull of a subscription, feeding a trio memory channel.

    Args:
        subscription: The full subscription name.
        make_subscriber: Builds the ``SubscriberClient`` (see :func:`default_subscriber`).
        max_outstanding: ``FlowControl.max_messages``.
    """

    subscription: str
    make_subscriber: SubscriberFactory
    max_outstanding: int = MAX_OUTSTANDING

    async def serve(
        self,
        send: trio.MemorySendChannel[PulledMessage],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Pull until cancelled, sending each message into ``send``.

        ``started`` once the stream is open.

        Raises:
            Exception: The stream ended with an error the library does not retry (the subscription
                does not exist, permission denied): the adapter reports it and stops.

        Cancellation:
            The stream is cancelled and its threads stopped (bounded by :data:`CLOSE_TIMEOUT_S`);
            messages still unacked are redelivered by Pub/Sub (the callbacks still waiting nack
            them).
        """
        token = trio.lowlevel.current_trio_token()

        def callback(message: PulledMessage) -> None:
            # Runs on a library thread: hand over to trio, blocking while the channel is full.
            try:
                trio.from_thread.run(send.send, message, trio_token=token)
            except (
                trio.RunFinishedError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.Cancelled,
            ):
                message.nack()

        subscriber = await trio.to_thread.run_sync(self.make_subscriber)
        future: Any = None
        try:
            future = await trio.to_thread.run_sync(self._subscribe, subscriber, callback)
            log.info("gchat: pulling %s", self.subscription)
            task_status.started()
            # The future completes only when the stream fails for good (or is cancelled below): wait
            # for it in a thread that a cancel abandons, then stop it.
            await trio.to_thread.run_sync(future.result, abandon_on_cancel=True)
        finally:
            send.close()
            # Shielded: the stream's threads must be told to stop even when the daemon is being
            # cancelled; bounded, the library joins them in the background.
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT_S):
                await trio.to_thread.run_sync(_close, future, subscriber, abandon_on_cancel=True)

    def _subscribe(self, subscriber: Any, callback: Callable[[PulledMessage], None]) -> Any:
        from google.cloud.pubsub_v1.types import FlowControl  # type: ignore[import-untyped]

        flow = FlowControl(max_messages=self.max_outstanding, max_bytes=MAX_OUTSTANDING_BYTES)
        return subscriber.subscribe(self.subscription, callback=callback, flow_control=flow)


def _close(future: Any, subscriber: Any) -> None:
    if future is not None:
        future.cancel()
        try:
            future.result(timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:  # the stream's own error was already raised to serve's caller
            log.debug("gchat: pull stream ended: %s", exc)
    subscriber.close()
