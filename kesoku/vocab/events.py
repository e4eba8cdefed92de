"""Live, in-memory turn events for adapters: streamed text, tool progress, the end of a turn.

The gateway carries the durable messages; these events carry what is too fine-grained to persist
(text deltas) or only matters while a process watches (a tool started). They are lossy by design: a
subscriber that falls behind its buffer misses events (counted in ``dropped``), never messages.

trio is imported where the hub is used, not here: the events are also the frames of the daemon's
control socket (:mod:`kesoku.host.control`), and a ``kesoku chat`` client reading them never starts
trio (its import alone costs more than the client's whole budget).
"""

from __future__ import annotations

import weakref
from types import TracebackType
from typing import Self

import msgspec

from kesoku.vocab.ir import LLMEvent
from kesoku.vocab.metrics import TurnMetrics
from kesoku.vocab.model import Message
from kesoku.vocab.view import ViewState

SUBSCRIBER_BUFFER = 512
"""Events one subscriber may hold before newer ones are dropped (a few seconds of fast
streaming)."""


class TurnStarted(msgspec.Struct, frozen=True, tag="turn_started"):
    """A turn opened on ``root`` (the newest of the pending user messages)."""

    session_id: str
    root: Message


class ModelDelta(msgspec.Struct, frozen=True, tag="model_delta"):
    """A streamed model event (text or thought delta, tool call, usage)."""

    session_id: str
    event: LLMEvent


class ToolStarted(msgspec.Struct, frozen=True, tag="tool_started"):
    """A tool call started running."""

    session_id: str
    call: Message


class ToolFinished(msgspec.Struct, frozen=True, tag="tool_finished"):
    """A tool call ended; ``result`` is its persisted tool_result."""

    session_id: str
    result: Message


class TurnEnded(msgspec.Struct, frozen=True, tag="turn_ended"):
    """A turn ended; adapters render ``metrics``."""

    session_id: str
    metrics: TurnMetrics


class QuestionAsked(msgspec.Struct, frozen=True, tag="question_asked"):
    """A tool asks the user to Allow or Deny; ``question`` is the persisted question message."""

    session_id: str
    question: Message


_STAGES = {
    1: "evicted old tool results",
    2: "archived old turns",
    3: "summarized",
    4: "left the oldest out",
    5: "shortened this turn's tool results",
}


class Compacted(msgspec.Struct, frozen=True, tag="compacted"):
    """A compaction ended.

    ``view`` is the stored view, or None when nothing was old enough to compact.
    """

    session_id: str
    view: ViewState | None
    reason: str

    def render(self) -> str:
        """One line for a chat: what was compacted and the estimated tokens before and after.

        A view that saves nothing (old tool results already shorter than the stubs that would stand
        in for them) is said to, with what the next request holds.
        """
        view = self.view
        if view is None:
            # The current turn is never compacted: a long one (a big paste, many tool rounds) can
            # fill the window on its own, which "the history is short" would misreport.
            return (
                f"🗜 nothing to compact ({self.reason}): "
                "nothing before the current turn is left to shorten"
                " (earlier turns are few, or compacted already)"
            )
        before, after = view.tokens_before, view.tokens_after
        if after >= before:
            was = f" (~{before:,} before)" if after > before else ""
            return (
                f"🗜 nothing saved by compacting ({self.reason}): "
                f"the next request holds ~{after:,} tokens{was}"
            )
        stages = ", ".join(_STAGES[s] for s in view.stages)
        return f"🗜 compacted ({self.reason}): ~{before:,} → ~{after:,} tokens; {stages}"


TurnEvent = (
    TurnStarted | ModelDelta | ToolStarted | ToolFinished | QuestionAsked | Compacted | TurnEnded
)


class EventHub:
    """Fan turn events out to subscribers, never blocking the publisher.

    The hub holds its subscriptions weakly: one dropped without :meth:`Subscription.close` leaves
    it once collected.
    """

    def __init__(self) -> None:
        self._subscribers: dict[int, weakref.ref[Subscription]] = {}
        # What publish walks: a tuple rebuilt when a subscription comes or goes, as a WeakSet's
        # iteration cost several times a publish (a few per tool round trip).
        self._targets: tuple[weakref.ref[Subscription], ...] = ()

    def subscribe(
        self, session_id: str | None = None, *, buffer: int = SUBSCRIBER_BUFFER
    ) -> Subscription:
        """Receive the events of one session (or of all when None) from now on.

        Use as ``with hub.subscribe(sid) as events: async for event in events: ...``.
        """
        sub = Subscription(self, session_id, buffer)
        key = id(sub)  # not reused before the callback: it runs as the subscription is freed
        self._subscribers[key] = weakref.ref(sub, lambda _: self._forget(key))
        self._targets = tuple(self._subscribers.values())
        return sub

    def publish(self, event: TurnEvent) -> None:
        """Hand an event to every matching subscriber; a full subscriber drops it."""
        session_id = event.session_id
        for ref in self._targets:
            sub = ref()
            if sub is not None and (sub.session_id is None or sub.session_id == session_id):
                sub._offer(event)

    def _forget(self, key: int) -> None:
        if self._subscribers.pop(key, None) is not None:
            self._targets = tuple(self._subscribers.values())


class Subscription:
    """A subscriber's bounded queue of events; an async iterator.

    A full buffer drops what comes (counted in :attr:`dropped`), except a :class:`TurnEnded`: it
    is queued past the bound (up to as many again), because a view that lost the end of a turn
    would wait for it forever (a one-shot chat whose terminal was slow to print), while every other
    event's content is in the log a view reads after a gap.
    """

    def __init__(self, hub: EventHub, session_id: str | None, buffer: int) -> None:
        self.session_id = session_id
        self.dropped = 0
        """Events lost because the buffer was full."""
        self.buffer = buffer
        self._held = 0  # events queued and not yet read
        self._hub = hub
        import trio  # a subscriber exists only under trio (see the module doc)

        self._send, self._receive = trio.open_memory_channel[TurnEvent](2 * buffer)
        self._full, self._closed, self._ended = (
            trio.WouldBlock,
            trio.ClosedResourceError,
            trio.EndOfChannel,
        )

    def _offer(self, event: TurnEvent) -> None:
        """Queue an event without waiting; a full buffer drops it (counted), a turn's end aside."""
        if self._held >= self.buffer and type(event) is not TurnEnded:
            self.dropped += 1
            return
        try:
            self._send.send_nowait(event)
        except self._full:
            self.dropped += 1
        except self._closed:
            pass
        else:
            self._held += 1

    def take_ended(self) -> list[TurnEnded]:
        """Empty the queue without waiting; the turn ends it held, in order.

        For a view that starts over after a gap (a new subscription, the log read up to now): the
        rest of what was queued is in the log, the turns' ends are not.
        """
        ended: list[TurnEnded] = []
        while True:
            try:
                event = self._receive.receive_nowait()
            except (self._full, self._ended):
                return ended
            self._held -= 1
            if type(event) is TurnEnded:
                ended.append(event)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> TurnEvent:
        """Return the next event.

        Raises:
            StopAsyncIteration: After :meth:`close`.
        """
        try:
            event = await self._receive.receive()
        except self._ended:
            raise StopAsyncIteration from None
        self._held -= 1
        return event

    def close(self) -> None:
        """Unsubscribe; an iteration in progress ends once the buffered events are read."""
        self._hub._forget(id(self))
        self._send.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
