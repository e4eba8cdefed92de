"""Delivery lanes: an adapter's replies in order per channel, its channels independent.

An adapter follows the log with one listener from its :class:`~kesoku.gateway.DeliveryCursor`.
Delivering one message at a time let one slow channel hold up every other: seven 503s on one send
were waited out (about 63 s), and every channel's replies waited with it. :class:`DeliveryLanes`
reads the listener and hands each message to the lane of its channel (a key the adapter gives): a
lane delivers its messages one at a time, in id order; lanes run concurrently, each a task that
exists while it has messages.

- Bounded, nothing dropped: a lane holds at most ``lane_limit`` messages, and at most
  ``total_limit`` messages are read past the cursor's watermark (waiting, being delivered, or
  delivered while an older one is not). When either is reached the reader waits, and says so in a
  log line naming the channel it waits for.
- Once across restarts: messages finish out of id order, so the cursor saves a low watermark plus
  the ids handled above it (at most ``total_limit``); a restart listens after the watermark and
  skips those ids. A message cut by a stop mid-way is delivered again, as before.
- A channel that stays unreachable: a delivery still running after ``stuck_after_s`` (a send
  retrying 5xx or a dead network) logs one warning naming the channel. When the lane gets a message
  through again, one line in that channel says how long its replies were delayed; its waiting
  messages then follow in order.

Turn events keep their order with a lane's messages through
:meth:`~kesoku.gateway.DeliveryCursor.delivered`, which waits for a session's messages only.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from kesoku.gateway import DeliveryCursor
from kesoku.vocab.model import Message, Session
from kesoku.vocab.schedule import format_duration

log = logging.getLogger(__name__)

LANE_LIMIT = 256
"""Messages one channel's lane may hold (waiting or being delivered) before the reader waits."""
TOTAL_LIMIT = 1024
"""Messages that may be read past the watermark (held by lanes, or delivered while an older one is
not) before the reader waits; also the most ids the cursor saves above its watermark."""
STUCK_AFTER_S = 30.0
"""A delivery still running after this long is a channel that cannot be reached: one warning."""
DELAYED = "⏳ Replies here were delayed by {delay}."
"""The notice in a channel whose lane got through again after :data:`STUCK_AFTER_S` or more."""
NOT_SHOWN = "⚠️ Part of this reply could not be shown ({error})."
"""The notice in a channel about a message that was not delivered."""


class Deliverer(Protocol):
    """What an adapter's delivery gives the lanes."""

    def lane_of(self, session: Session) -> str:
        """The key of a session's lane (its channel), readable in a log line (``channel 123``)."""
        ...

    async def deliver(self, message: Message) -> None:
        """Show one message; an exception is handed to :meth:`failed`."""
        ...

    def failed(self, message: Message, exc: Exception) -> bool:
        """Log a message's failure.

        Returns:
            True if the platform answered (a refusal for good, or a bug here); False if it could
            not be reached (the client's retries ran out).
        """
        ...

    async def notify(self, message: Message, text: str) -> None:
        """Send one line to the channel of a message; a failure is only logged (never raises)."""
        ...


@dataclass
class Lane:
    """The messages of one channel, delivered in order by one task."""

    key: str
    queue: deque[Message] = field(default_factory=deque)
    """Its messages, the first being delivered."""
    busy_since: float = 0.0
    """trio time the current delivery started."""

    def ids(self) -> list[int]:
        """The ids of its messages, in order."""
        return [m.id for m in self.queue]


class DeliveryLanes:
    """Deliver a listener's messages per channel: in order in a channel, channels independent.

    A message whose delivery raised is logged (:meth:`Deliverer.failed`), told in its channel
    (:data:`NOT_SHOWN`), and the cursor moves on. The messages of a deleted session (delivering
    them does nothing) go to a lane of their own.

    Args:
        cursor: The adapter's cursor (the listener follows it).
        adapter: The adapter's delivery: lanes, sending, failures and notices.
        name: The adapter in log lines (``discord``).
        lane_limit: See :data:`LANE_LIMIT`.
        total_limit: See :data:`TOTAL_LIMIT`.
        stuck_after_s: See :data:`STUCK_AFTER_S`.

    Raises:
        ValueError: A limit below 1, or ``lane_limit`` over ``total_limit``.
    """

    def __init__(
        self,
        cursor: DeliveryCursor,
        adapter: Deliverer,
        *,
        name: str,
        lane_limit: int = LANE_LIMIT,
        total_limit: int = TOTAL_LIMIT,
        stuck_after_s: float = STUCK_AFTER_S,
    ) -> None:
        if not 1 <= lane_limit <= total_limit:
            raise ValueError("delivery lanes: need 1 <= lane_limit <= total_limit")
        self.cursor = cursor
        self.adapter = adapter
        self.name = name
        self.lane_limit = lane_limit
        self.total_limit = total_limit
        self.stuck_after_s = stuck_after_s
        self.lanes: dict[str, Lane] = {}
        """The lanes that have messages, by key."""
        self.stuck: dict[str, float] = {}
        """Channels not reached for ``stuck_after_s`` or more → trio time their delay started.
        Kept past the lane (its last message may have failed) until a message gets through."""
        self.reader_waits = 0
        """How many times the reader waited for room (a test and bench figure)."""
        self._said_at = -float("inf")  # trio time the reader last said it waits
        self._room = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def run(self, messages: AsyncIterable[Message]) -> None:
        """Deliver every message of ``messages`` (in id order) until cancelled or it ends.

        Call :meth:`DeliveryCursor.start` before each run (the listener follows it).

        Cancellation:
            Stops every lane at once. What was delivered is saved; a message cut mid-way, and
            those not begun, are delivered after a restart.
        """
        self.lanes = {}  # a cancelled run's lanes died with it
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            async for message in messages:
                if not self.cursor.begin(message.id):
                    continue  # handled before a restart
                session = self.cursor.store.get_session(message.session_id)
                key = (
                    f"session {message.session_id}"
                    if session is None
                    else self.adapter.lane_of(session)
                )
                await self._wait_for_room(key, message)
                lane = self.lanes.get(key)
                if lane is None:
                    lane = self.lanes[key] = Lane(key)
                    nursery.start_soon(self._serve_lane, lane, name=f"{self.name} lane {key}")
                lane.queue.append(message)

    async def _wait_for_room(self, key: str, message: Message) -> None:
        """Wait while the lane of ``key`` is full, or too many messages are read past the watermark.

        ``message`` is already counted in :attr:`DeliveryCursor.open`.
        """
        while True:
            lane = self.lanes.get(key)
            lane_full = lane is not None and len(lane.queue) >= self.lane_limit
            if not lane_full and self.cursor.open <= self.total_limit:
                return
            # Said once per stuck_after_s: catching up on a backlog waits at every message.
            if trio.current_time() - self._said_at >= self.stuck_after_s:
                self._said_at = trio.current_time()
                self._say_waiting(key if lane_full else None, message)
            self.reader_waits += 1
            await self._room.wait()

    def _say_waiting(self, full_lane: str | None, message: Message) -> None:
        """One log line: the reader waits for a full lane, or (None) for the oldest message."""
        if full_lane is not None:
            log.warning(
                "%s: %d replies wait for %s; reading the log waits (message %d)",
                self.name,
                self.lane_limit,
                full_lane,
                message.id,
            )
            return
        oldest = self.cursor.oldest_open
        holder = next((k for k, ln in self.lanes.items() if oldest in ln.ids()), "?")
        log.warning(
            "%s: %d messages read past message %d, still on its way to %s; reading the log waits",
            self.name,
            self.total_limit,
            oldest,
            holder,
        )

    async def _serve_lane(self, lane: Lane) -> None:
        """Deliver a lane's messages in order until it has none; then the lane is gone."""
        while lane.queue:
            message = lane.queue[0]
            through = await self._deliver(lane, message)
            lane.queue.popleft()
            self.cursor.advance(message.id)
            self._room.set()
            self._room = trio.Event()
            since = self.stuck.get(lane.key)
            if through and since is not None:
                del self.stuck[lane.key]
                delay = format_duration(trio.current_time() - since)
                what = "%s: %s reached again; its replies were delayed by %s"
                log.warning(what, self.name, lane.key, delay)
                await self.adapter.notify(message, DELAYED.format(delay=delay))
        del self.lanes[lane.key]

    async def _deliver(self, lane: Lane, message: Message) -> bool:
        """Deliver one message, watched for :attr:`stuck_after_s`.

        Returns:
            False when the platform could not be reached (see ``failed``).
        """
        assert self._nursery is not None
        lane.busy_since = trio.current_time()
        watch = trio.CancelScope()
        self._nursery.start_soon(self._watch, lane, watch)
        try:
            await self.adapter.deliver(message)
            return True
        except Exception as exc:  # one message never stops the rest
            through = self.adapter.failed(message, exc)
            await self.adapter.notify(message, NOT_SHOWN.format(error=type(exc).__name__))
            return through
        finally:
            watch.cancel()

    async def _watch(self, lane: Lane, scope: trio.CancelScope) -> None:
        """One warning when a lane's delivery runs past :attr:`stuck_after_s` (once per outage)."""
        with scope:
            await trio.sleep(self.stuck_after_s)
            if lane.key not in self.stuck:
                self.stuck[lane.key] = lane.busy_since
                log.warning(
                    "%s: a reply to %s is still on its way after %g s; later replies there wait, "
                    "other channels go on",
                    self.name,
                    lane.key,
                    self.stuck_after_s,
                )
