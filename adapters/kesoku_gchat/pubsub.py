"""Pub/Sub streaming pull, bridged into trio: Chat events in with no inbound webhook or public URL.

google-cloud-pubsub's ``SubscriberClient.subscribe`` keeps a gRPC stream open and calls back on its
own threads. Each callback hands its message to trio with ``trio.from_thread.run(send.send, ...)``:
the bounded memory channel plus the library's ``FlowControl`` are the backpressure (a full channel
blocks the callback thread; past ``max_messages`` outstanding messages the library pauses the
stream). A message is acked by its consumer only once it is persisted; one that cannot be handed
over (the channel closed, the trio run over) is nacked, so Pub/Sub delivers it again.

Ack and nack are safe from the trio thread: they only queue a request for the library's dispatcher
thread (google-cloud-pubsub, ``subscriber.message.Message.ack``). Each message is handed over as a
:class:`Received`, stamped with its receipt time, so the consumer can say when one waited long.

Stopping ends the stream from the client's side first (a half-close, :func:`_end_stream`) and only
then cancels it: the Pub/Sub emulator does not notice a stream that is only cancelled and goes on
giving it a share of new messages, each lost for the stream ack deadline (60 s).
"""

from __future__ import annotations

import logging
import os
import threading
import time
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
END_STREAM_TIMEOUT_S = 2.0
"""How long stopping waits for the server to end a half-closed stream before cancelling it (the
emulator ends it within 50 ms)."""
END_STREAM_POLL_S = 0.01
"""How often stopping looks whether a stream that has just started has opened its call."""
PUBSUB_SCOPE = "https://www.googleapis.com/auth/pubsub"


class PulledMessage(Protocol):
    """A pulled message as the consumer sees it (a :class:`Received`).

    What Kesoku uses of the library's ``google.cloud.pubsub_v1.subscriber.message.Message``, and
    when it arrived.
    """

    @property
    def received_at(self) -> float:
        """``trio.current_time()`` when the library's callback handed it over."""
        ...

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


@dataclass(frozen=True, slots=True)
class Received:
    """A pulled message as the puller hands it to trio: the library's message and when it arrived.

    Attributes:
        message: The library's ``Message`` (``data``, ``message_id``, ``ack()``, ``nack()``).
        received_at: ``trio.current_time()`` when the library's callback handed it over (before
            any wait for room in the channel).
    """

    message: Any
    received_at: float

    @property
    def data(self) -> bytes:
        """The payload: a Chat event's JSON."""
        data: bytes = self.message.data
        return data

    @property
    def message_id(self) -> str:
        """Pub/Sub's id of the message."""
        message_id: str = self.message.message_id
        return message_id

    def ack(self) -> None:
        """Done with it: Pub/Sub will not deliver it again."""
        self.message.ack()

    def nack(self) -> None:
        """Not handled: Pub/Sub delivers it again soon."""
        self.message.nack()


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
        """Pull until cancelled, sending each message into ``send`` as a :class:`Received`.

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

        async def hand_over(message: Any) -> None:
            await send.send(Received(message, trio.current_time()))

        def callback(message: Any) -> None:
            # Runs on a library thread: hand over to trio, blocking while the channel is full.
            try:
                trio.from_thread.run(hand_over, message, trio_token=token)
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

    def _subscribe(self, subscriber: Any, callback: Callable[[Any], None]) -> Any:
        from google.cloud.pubsub_v1.types import FlowControl  # type: ignore[import-untyped]

        flow = FlowControl(max_messages=self.max_outstanding, max_bytes=MAX_OUTSTANDING_BYTES)
        return subscriber.subscribe(self.subscription, callback=callback, flow_control=flow)


def _close(future: Any, subscriber: Any) -> None:
    if future is not None:
        _end_stream(future)
        future.cancel()
        try:
            future.result(timeout=CLOSE_TIMEOUT_S)
        except Exception as exc:  # the stream's own error was already raised to serve's caller
            log.debug("gchat: pull stream ended: %s", exc)
    subscriber.close()


def _end_stream(future: Any) -> None:
    """Half-close the pull stream and wait for the server to end it (at most END_STREAM_TIMEOUT_S).

    Why: ``future.cancel()`` only cancels the gRPC call (an HTTP/2 RST_STREAM). The Pub/Sub emulator
    (0.8.20: ``NoSuchMethodError`` in ``onRstStreamRead`` in its log) never learns that such a
    stream is gone: it keeps pushing that dead stream its share of new messages, and each is lost
    until the stream ack deadline (60 s) passes, then maybe lost again. Every restart of the adapter
    or daemon on a subscription added one such stream; events then waited 60 to 125 s before being
    stored, with nothing logged. Ending the request stream is the clean end that servers answer by
    completing the call; the cancel that follows finds it done.

    The consumer is paused first so that it does not read the stream's end itself: the end then
    reaches only the library's done-callback, which shuts the stream down (a clean end is not an
    error it retries by reopening).
    This reaches into google-cloud-pubsub's private parts (``StreamingPullManager._rpc``,
    ``_consumer``; api_core's ``BidiRpc._request_queue``, whose ``None`` ends the request stream);
    where a version lacks them, nothing is done and the cancel alone stops the stream, as before.
    """
    manager = getattr(future, "_StreamingPullFuture__manager", None)
    rpc = getattr(manager, "_rpc", None)
    consumer = getattr(manager, "_consumer", None)
    requests = getattr(rpc, "_request_queue", None)
    if consumer is None or requests is None:
        return
    # The library opens the call on its consumer thread: a stream stopped right after it started
    # may not have one yet, and cancelling it as it opens would leave the same dead stream.
    ended = threading.Event()
    deadline = time.monotonic() + END_STREAM_TIMEOUT_S
    while (call := getattr(rpc, "call", None)) is None and time.monotonic() < deadline:
        ended.wait(END_STREAM_POLL_S)
    if call is None:
        return
    if not call.add_callback(ended.set):  # the call is over already
        return
    consumer.pause()
    requests.put(None)
    if not ended.wait(END_STREAM_TIMEOUT_S):
        log.debug("gchat: the pull stream did not end in %g s; cancelling it", END_STREAM_TIMEOUT_S)
