"""Follow one session's turns: live deltas from the event hub, the truth from the durable log.

The model's text is shown as it streams (``ModelDelta`` events), but what was *said* is the message
the turn persisted. The two are reconciled so every answer is shown exactly once: when the persisted
message arrives, only the part the stream did not show (normally nothing) is added.

Ordering. The turn publishes each hub event right after the posts it follows (a step's text and
tool calls are posted before ``ToolStarted``, the results before ``ToolFinished``, the answer before
``TurnEnded``), and every such event names its place in the log (the call, the result, the turn's
root). At each one the view reads the log up to that place and no further, so a view that lags
behind a fast turn still shows each step's persisted text right after that step's deltas. That read
is a synchronous ``messages_after(cursor)`` on the log (:class:`SessionLog`) rather than a second
``gateway.listen`` task: two independent iterators could not be put back in the turn's order.

Where events and the log come from. In ``kesoku chat``'s own runtime, the event hub and the store
(:class:`StoreLog`); for a chat served by the daemon, the frames of its control socket
(``kesoku_terminal.remote``). This module imports neither trio nor the store for that client.

Lost events. The hub drops events for a subscriber that falls a whole buffer behind (it never
blocks the turn), but never a turn's end (the log does not hold it). The view then subscribes anew,
reads the log up to that moment, shows the turn ends the old subscription held, and ignores deltas
until the next step boundary, so a step whose start was lost is shown from the log: late, never
twice, never garbled.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from kesoku.vocab.events import (
    Compacted,
    EventHub,
    ModelDelta,
    QuestionAsked,
    ToolFinished,
    ToolStarted,
    TurnEnded,
    TurnEvent,
    TurnStarted,
)
from kesoku.vocab.ir import TextDelta, ThoughtDelta
from kesoku.vocab.model import Kind, Message, Role, is_question

if TYPE_CHECKING:
    import trio

    from kesoku.store import Store
    from kesoku.vocab.events import Subscription
    from kesoku.vocab.metrics import TurnMetrics

LOG_BATCH = 256
"""Messages read from the log per query while catching up (a turn posts a handful at a time)."""
EVENT_BUFFER = 4096
"""Hub events a terminal view may fall behind before some are lost: a long burst of deltas (a
scripted step, a fast local model) while the terminal is slow to print still fits."""


class SessionLog(Protocol):
    """The durable log a view reads at each event: what the session's turns stored."""

    def last_message_id(self) -> int:
        """The newest message id of the whole log (0 when empty)."""
        ...

    def messages_after(self, after: int, session_id: str, limit: int) -> list[Message]:
        """Up to ``limit`` messages of ``session_id`` with ids above ``after``, in id order."""
        ...


class StoreLog:
    """A :class:`SessionLog` over a store this process opened."""

    def __init__(self, store: Store) -> None:
        from kesoku.store import MessageFilter  # loaded with the store that is passed in

        self.store = store
        self._filter = MessageFilter.from_kwargs
        self._filters: dict[str, MessageFilter] = {}

    def last_message_id(self) -> int:
        """The newest message id of the store."""
        return self.store.last_message_id()

    def messages_after(self, after: int, session_id: str, limit: int) -> list[Message]:
        """Messages of the session after ``after``, from the store."""
        found = self._filters.get(session_id)
        if found is None:
            found = self._filters[session_id] = self._filter({"session_id": session_id})
        return self.store.messages_after(after, found, limit=limit)


class Sink(Protocol):
    """Where a view puts what it shows; every ``*_end`` must be harmless when nothing is open."""

    def answer(self, chunk: str) -> None:
        """A piece of the model's visible answer."""

    def answer_end(self) -> None:
        """The answer text of one model step is complete."""

    def thought(self, chunk: str) -> None:
        """A piece of the model's reasoning."""

    def thought_end(self) -> None:
        """The reasoning of one model step is complete."""

    def tool_call(self, call: Message) -> None:
        """A tool call was posted."""

    def tool_started(self, call: Message) -> None:
        """A tool call started running."""

    def tool_result(self, result: Message) -> None:
        """A tool result was posted (every call gets one: completed, failed, skipped, killed...)."""

    def system(self, text: str) -> None:
        """A system notification.

        A failed model call, the step limit, an internal error, an answer record.
        """

    def question(self, question: Message) -> None:
        """A tool asks the user to Allow or Deny (see kesoku.agent.questions).

        The chat routes the answer.
        """

    def turn_started(self, root: Message) -> None:
        """A turn opened."""

    def turn_ended(self, metrics: TurnMetrics) -> None:
        """A turn ended."""


class Follower:
    """Renders the turns of the current session to a sink, each message exactly once.

    Args:
        hub: Where live events come from (the runtime's event hub); None for a client that hands
            each event to :meth:`handle` itself.
        log: The log read at each event.
        session_id: The session to show.
        sink: Where to show it.
        on_event: Called with each event of the shown session after it was shown (the chat's own
            bookkeeping: busy, a pending stop).
        live_answer: Show the answer as it streams; False: only once it is stored (a one-shot whose
            stdout is a pipe or a file gets only what the session kept).

    Attributes:
        session_id: The session shown; change it with :meth:`switch`.
        ended_root_id: The highest turn root whose ``TurnEnded`` was shown: user messages up to it
            have been answered (or failed, or stopped).
        lossy: Events were lost and no step boundary has been seen since: deltas are not shown.
        gaps: How many times events were lost.
    """

    def __init__(
        self,
        hub: EventHub | None,
        log: SessionLog,
        session_id: str,
        sink: Sink,
        *,
        on_event: Callable[[TurnEvent], None] | None = None,
        live_answer: bool = True,
    ) -> None:
        self.hub = hub
        self.live_answer = live_answer
        self.log = log
        self.sink = sink
        self.session_id = session_id
        self.on_event = on_event
        self.ended_root_id = 0
        self.lossy = False
        self.gaps = 0
        self._cursor = log.last_message_id()
        self._ended: trio.Event | None = None
        # What the stream showed of the current step and the log has not confirmed yet (None:
        # nothing).
        self._text: str | None = None
        self._thought: str | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] | None = None) -> None:
        """Show events until cancelled; ``started`` once subscribed (post only after that).

        After a gap the subscription is replaced: the new one is contiguous from the moment it
        opens, the log is read up to that moment, and deltas are shown again from the next step
        boundary.
        """
        assert self.hub is not None
        while True:
            events: Subscription
            ended: list[TurnEnded] = []
            with self.hub.subscribe(buffer=EVENT_BUFFER) as events:
                if task_status is not None:  # nursery.start(run): subscribed, the post may follow
                    task_status.started()
                    task_status = None
                async for event in events:
                    # The first event read after a drop still precedes the gap: everything in a
                    # full buffer was published before the drop. Show it, then start over.
                    self.handle(event)
                    if events.dropped:
                        ended = events.take_ended()  # never dropped: the log does not hold them
                        break
            self.gap()
            for event in ended:
                self.handle(event)

    def gap(self) -> None:
        """Events were lost: show the log up to now, and no deltas until the next step boundary.

        What the stream showed of the current step stays open: the deltas before the loss came in
        order, so they begin the step's message, which then adds only the rest when the log brings
        it (closing the line here showed the message again whole: a long thought twice).
        """
        self.gaps += 1
        self.sync()
        self.lossy = True

    async def wait_ended(self, root_id: int) -> None:
        """Wait until the turn that answers user message ``root_id`` has ended."""
        import trio

        while self.ended_root_id < root_id:
            if self._ended is None:
                self._ended = trio.Event()
            await self._ended.wait()

    def switch(self, session_id: str) -> None:
        """Show another session from now on (``/new``); its earlier messages are not shown."""
        self.sync()
        self._close_streams()
        self.session_id = session_id
        self._cursor = self.log.last_message_id()
        self.ended_root_id = 0

    def handle(self, event: TurnEvent) -> None:
        """Show one hub event, after the log messages the turn wrote before publishing it."""
        if event.session_id != self.session_id:
            return
        if isinstance(event, ModelDelta):
            delta = event.event
            if self.lossy:
                pass  # the start of this step was lost: the log will show it whole
            elif isinstance(delta, TextDelta) and delta.text and self.live_answer:
                self._text = (self._text or "") + delta.text
                self.sink.answer(delta.text)
            elif isinstance(delta, ThoughtDelta) and delta.text:
                self._thought = (self._thought or "") + delta.text
                self.sink.thought(delta.text)
            # tool calls and usage are shown from the log
        else:
            self.lossy = False  # a step boundary: the next deltas start a step
            if isinstance(event, TurnStarted):
                self.sync(up_to=event.root.id)
                self.sink.turn_started(event.root)
            elif isinstance(event, ToolStarted):
                self.sync(up_to=event.call.id)
                self.sink.tool_started(event.call)
            elif isinstance(event, ToolFinished):
                self.sync(up_to=event.result.id)
            elif isinstance(event, QuestionAsked):
                self.sync(up_to=event.question.id)
            elif isinstance(event, Compacted):
                self._close_streams()
                self.sink.system(event.render())
            else:
                assert isinstance(event, TurnEnded)
                self.sync(turn_root=event.metrics.root_id)
                self._close_streams()
                self.ended_root_id = max(self.ended_root_id, event.metrics.root_id)
                self.sink.turn_ended(event.metrics)
                if self._ended is not None:
                    self._ended.set()
                    self._ended = None
        if self.on_event is not None:
            self.on_event(event)

    def sync(self, *, up_to: int | None = None, turn_root: int | None = None) -> None:
        """Show log messages written since the last read, up to where the handled event stands.

        The view may lag behind the turn (events wait in the subscription while the turn goes on),
        so the log can already hold what comes *after* the event; showing it now would put a later
        step's text before this step's deltas. Each event therefore names its place in the log.

        Args:
            up_to: Stop after this message id (the call of ``ToolStarted``, the result of
                ``ToolFinished``, the root of ``TurnStarted``).
            turn_root: Stop before the first message of a later turn (``TurnEnded``: the turn's own
                messages carry its root id; user messages are passed over: they interrupt this turn
                but open the next).
        """
        while True:
            batch = self.log.messages_after(self._cursor, self.session_id, LOG_BATCH)
            for message in batch:
                if up_to is not None and message.id > up_to:
                    return
                if (
                    turn_root is not None
                    and message.role is not Role.USER
                    and message.root_id > turn_root
                ):
                    return
                self._cursor = message.id
                self._show(message)
            if len(batch) < LOG_BATCH:
                return

    def _show(self, message: Message) -> None:
        if message.role is Role.ASSISTANT:
            if message.kind is Kind.TEXT:
                streamed, self._text = self._text, None
                _reconcile(streamed, message.content, self.sink.answer, self.sink.answer_end)
            elif message.kind is Kind.THOUGHT:
                streamed, self._thought = self._thought, None
                _reconcile(streamed, message.content, self.sink.thought, self.sink.thought_end)
            elif message.kind is Kind.TOOL_CALL:
                # text streamed before the call but never persisted (whitespace)
                self._close_streams()
                self.sink.tool_call(message)
        elif message.role is Role.TOOL:
            self.sink.tool_result(message)
        elif message.role is Role.SYSTEM:
            self._close_streams()
            if is_question(message):
                self.sink.question(message)
            else:
                self.sink.system(message.content)
        # User messages are the user's own lines: the terminal already shows them.

    def _close_streams(self) -> None:
        if self._thought is not None:
            self._thought = None
            self.sink.thought_end()
        if self._text is not None:
            self._text = None
            self.sink.answer_end()


def _reconcile(
    streamed: str | None, content: str, show: Callable[[str], None], end: Callable[[], None]
) -> None:
    """Show what the stream did not of a persisted message, then end it."""
    if streamed is None:
        tail = content
    elif content.startswith(streamed):
        tail = content[len(streamed) :]
    else:
        # The stream lost deltas (a subscriber that fell behind): close the garbled line and show
        # the persisted message whole; a repeat beats a wrong answer.
        end()
        tail = content
    if tail:
        show(tail)
    end()


def user_name() -> str:
    """Who sits at this terminal, for the record of an answer to a question."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container) and no LOGNAME/USER
        return "the user"
