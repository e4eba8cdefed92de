"""History → provider-neutral turns, and the transcript invariant (ARCHITECTURE.md, "Guarantees").

The log is append-only and written by concurrent parts (a tool batch finishing after an
interruption, a crash between a call and its result), so the history as stored need not be a valid
request. Two functions keep every request valid:

- :func:`to_turns` builds the IR from history in ``(root_ts, ts, id)`` order and repairs what the
  log allows but no provider accepts: results moved right after their calls, duplicate call ids made
  distinct, a ``lost`` result for a call that has none, orphan and duplicate results dropped, empty
  text dropped, roles merged so user and assistant alternate, starting and ending with the user.
- :func:`check_turns` states the invariant; the base backend calls it before every request and the
  property tests call it on every request the scripted model receives.

:func:`missing_results` is the persisting side: the runtime posts a real result (``skipped``,
``killed``, ``lost``) for each call that has none, so the log itself heals.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, NamedTuple, TypeVar

from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMBlock,
    LLMTurn,
    TextBlock,
    ThoughtBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from kesoku.vocab.model import (
    ANSWER_KEY,
    DEFAULT_USER_SENDER,
    QUESTION_KEY,
    SYSTEM_SENDER,
    Kind,
    Message,
    Outcome,
    Role,
    Status,
)

INTERRUPTED_SUFFIX = "\n[interrupted]"
"""Appended to a partial answer that a new message or a stop cut off, so the model knows."""
OMITTED_OPENING = "(The earlier conversation is omitted.)"
"""Opens a history whose first kept message is the model's (after compaction)."""
CONTINUE_PROMPT = "(Continue.)"
"""Closes a history that ends with the model's message, so a request always ends with the user."""
LOST_RESULT = (
    "[lost] No result was recorded for this call: Kesoku stopped while it ran; "
    "its effect is unknown."
)

T = TypeVar("T")

# The members the loops over a whole history compare with, as module globals: on CPython 3.11 an
# enum member read from its class (``Kind.TOOL_CALL``) costs about 90 ns, a global about 10, and a
# worker's first request makes several such comparisons per message of its session.
_USER, _SYSTEM = Role.USER, Role.SYSTEM
_TOOL_CALL, _TOOL_RESULT, _THOUGHT = Kind.TOOL_CALL, Kind.TOOL_RESULT, Kind.THOUGHT
_FAILED, _INTERRUPTED = Status.FAILED, Status.INTERRUPTED
_COMPLETED, _LOST = Outcome.COMPLETED, Outcome.LOST

GC_PAUSE_TURNS = 256
"""A :class:`TurnMemo` update of at least this many new turns pauses the garbage collector
(:func:`gc_paused`): a worker's first request over a long session, not a step of a turn."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a whole session becomes objects, then restore it.

    Tens of thousands of objects that all stay alive, allocated at once, set off collections that
    scan them again and again for no garbage. Messages, turns and blocks are not tracked at all
    (``gc=False``, see :mod:`kesoku.vocab.model`); what is left is tuples and the checker's states:
    on a new worker's first request over 10,000 messages (bench/context_bench.py) about 2.3 ms of
    collections without the pause, 1.5 ms with it (it was 15 ms before the structs were untracked).
    Nothing may await inside, so no other task runs while it is paused.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def shared_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading items ``a`` and ``b`` share: the same objects, or equal ones.

    A session's next request holds the last one's turns, the same objects, and more, but for the
    last turn, which may have grown: those two cases are list comparisons (an identity check an
    item, in C: about 5 ns a turn), tried first; anything else (compaction replaced early turns) is
    walked item by item up to the first that is not the same object (about 35 ns a turn). Every
    value kept for a shared turn depends on its content alone, so an equal turn that is another
    object may count as shared; a shorter prefix only costs a recomputation.
    """
    n = min(len(a), len(b))
    head_a, head_b = list(a[:n]), list(b[:n])
    if head_a == head_b:
        return n
    if n > 1 and head_a[:-1] == head_b[:-1]:
        return n - 1
    return next(itertools.compress(itertools.count(), map(operator.is_not, head_a, head_b)), n)


class TurnMemo(Generic[T]):
    """One value per turn of a session's last request, kept for the turns the next one shares.

    The turns of one session's requests are the same objects from one model call to the next (see
    :class:`Transcript`), so work done per turn is kept for the longest prefix the new request
    shares with the last one (:func:`shared_prefix`: the same turns, or equal ones), and only the
    turns after it are computed: a call costs about its new turns, not the whole history.

    Attributes:
        kept: How many values the last :meth:`update` reused.
    """

    __slots__ = ("_turns", "_values", "kept")

    def __init__(self) -> None:
        self._turns: list[LLMTurn] = []
        self._values: list[T] = []
        self.kept = 0

    @property
    def values(self) -> Sequence[T]:
        """The value of each turn of the last :meth:`update` (valid until the next one)."""
        return self._values

    def update(
        self, turns: Sequence[LLMTurn], step: Callable[[T | None, LLMTurn], T]
    ) -> Sequence[T]:
        """The value of each of ``turns``: kept for the shared prefix, ``step`` for the rest.

        Args:
            turns: The new request's turns.
            step: Computes a turn's value from the value of the turn before it (None for the first
                turn) and the turn itself; called in order, once per turn after the shared prefix.

        Returns:
            One value per turn (the memo's own list: valid until the next update).
        """
        shared = shared_prefix(self._turns, turns)
        self.kept = shared
        done, values = self._turns, self._values
        del done[shared:], values[shared:]
        new = turns[shared:]
        value = values[-1] if values else None
        append = values.append
        # Every value made stays alive: a long history's first update pauses the collector.
        with gc_paused() if len(new) >= GC_PAUSE_TURNS else contextlib.nullcontext():
            for turn in new:
                value = step(value, turn)
                append(value)
        done.extend(new)  # after: a step that raises leaves no turn without its value
        return values


class TranscriptError(AssertionError):
    """A request breaks the transcript invariant; a bug in Kesoku, never the user's fault."""


def call_id_of(message: Message) -> str:
    """The provider call id of a tool_call message (``call_<id>`` when the provider gave none)."""
    return message.metadata.call_id or f"call_{message.id}"


def missing_results(history: Iterable[Message]) -> list[Message]:
    """Return the tool_call messages that have no tool_result, in history order."""
    calls: dict[int, Message] = {}
    answered: set[int] = set()
    for msg in history:
        if msg.kind is Kind.TOOL_CALL:
            calls[msg.id] = msg
        elif msg.kind is Kind.TOOL_RESULT and msg.parent_id is not None:
            answered.add(msg.parent_id)
    return [call for call_id, call in calls.items() if call_id not in answered]


def _user_blocks(msg: Message) -> list[LLMBlock]:
    blocks: list[LLMBlock] = []
    content = msg.content
    if msg.role is _SYSTEM:
        content = f"[{SYSTEM_SENDER}] {content}"
    elif msg.sender != DEFAULT_USER_SENDER:
        content = f"{msg.sender}: {content}"  # a group chat: the model must know who is speaking
    if msg.content.strip():
        blocks.append(TextBlock(content))
    for att in msg.metadata.attachments:
        if att.mime_type.startswith("image/"):
            blocks.append(ImageBlock(att.path, att.mime_type))
        else:
            blocks.append(DocumentBlock(att.path, att.mime_type, att.filename))
    return blocks


class _Builder:
    """Walks history once, emitting turns.

    Results are placed by their call, not by where they were stored.
    """

    def __init__(self, results: dict[int, Message]) -> None:
        self.turns: list[LLMTurn] = []
        self.results = results
        self.role: str = "user"
        self.blocks: list[LLMBlock] = []
        self.open_calls: list[tuple[Message, ToolCallBlock]] = []
        self.answered = (
            False  # a result of the open calls was seen: the next call starts a new step
        )
        self.call_ids: set[str] = set()
        # The turns the last finish() closed early (the open step and its results). When the same
        # turn is closed for real, that object is kept, so turns stay identical from one request to
        # the next.
        self.finished: list[LLMTurn] = []

    def _flush(self) -> None:
        if not self.blocks:
            return
        if self.turns and self.turns[-1].role == self.role:
            prev = self.turns.pop()
            self.blocks = [*prev.blocks, *self.blocks]
        blocks = tuple(self.blocks)
        at, finished = len(self.turns), self.finished
        if at < len(finished) and finished[at].role == self.role and finished[at].blocks == blocks:
            self.turns.append(finished[at])
        else:
            self.turns.append(LLMTurn(self.role, blocks))  # type: ignore[arg-type]
        self.blocks = []

    def _close_calls(self) -> None:
        """End the assistant step that made calls.

        Its results form the next user turn, in call order.
        """
        if not self.open_calls:
            return
        self._flush()
        self.role = "user"
        for call_msg, call in self.open_calls:
            result = self.results.get(call_msg.id)
            if result is None:
                self.blocks.append(ToolResultBlock(call.id, call.name, LOST_RESULT, _LOST))
            else:
                outcome = result.metadata.outcome or _COMPLETED
                self.blocks.append(ToolResultBlock(call.id, call.name, result.content, outcome))
        self.open_calls = []
        self.answered = False

    def _switch(self, role: str) -> None:
        if role != self.role:
            self._flush()
            self.role = role

    def add(self, msg: Message) -> None:
        # The hot loop of a session's first request (every message of the history): attributes read
        # once, the user-side steps inlined.
        role = msg.role
        if role is _USER or role is _SYSTEM:
            if role is _SYSTEM:
                extra = msg.metadata.extra
                if QUESTION_KEY in extra or ANSWER_KEY in extra:
                    # between the user and the adapter: the tool's result tells the model what was
                    # decided
                    return
            blocks = _user_blocks(msg)
            if blocks:
                if self.open_calls:
                    self._close_calls()
                if self.role != "user":
                    self._flush()
                    self.role = "user"
                self.blocks.extend(blocks)
            return
        kind = msg.kind
        if kind is _TOOL_RESULT:
            parent_id = msg.parent_id
            for call_msg, _ in self.open_calls:
                if call_msg.id == parent_id:
                    self.answered = True
                    break
            return  # placed by _close_calls, right after its call
        if msg.status is _FAILED:
            return
        block: LLMBlock
        if kind is _TOOL_CALL:
            meta = msg.metadata
            name, arguments = meta.tool_name or "", meta.tool_arguments or {}
            call_id = call_id_of(msg)
            # a provider (or a restarted replay) reused an id: keep pairs distinct
            if call_id in self.call_ids:
                call_id = f"{call_id}_{msg.id}"
            self.call_ids.add(call_id)
            call = ToolCallBlock(call_id, name, arguments, meta.thought_signature, meta.signed_by)
            if self.answered:  # calls after their results start the next step
                self._close_calls()
            self._switch("assistant")
            self.blocks.append(call)
            self.open_calls.append((msg, call))
            return
        if kind is _THOUGHT:
            if not msg.content and msg.metadata.thought_signature is None:
                return
            block = ThoughtBlock(
                msg.content, msg.metadata.thought_signature, msg.metadata.signed_by
            )
        else:
            if not msg.content.strip():
                return
            text = msg.content + (INTERRUPTED_SUFFIX if msg.status is _INTERRUPTED else "")
            block = TextBlock(text)
        # Calls end an assistant step: text after them starts the next.
        if self.open_calls:
            self._close_calls()
        self._switch("assistant")
        self.blocks.append(block)

    def finish(self) -> list[LLMTurn]:
        self._close_calls()
        self._flush()
        turns = self.turns
        self.finished = turns[:]
        if turns and turns[0].role == "assistant":
            turns.insert(0, LLMTurn("user", (TextBlock(OMITTED_OPENING),)))
        if not turns or turns[-1].role == "assistant":
            turns.append(LLMTurn("user", (TextBlock(CONTINUE_PROMPT),)))
        return turns


def to_turns(history: Sequence[Message]) -> list[LLMTurn]:
    """Build the IR of a request from history, repairing it so it satisfies :func:`check_turns`.

    Args:
        history: Messages of one session in ``(root_ts, ts, id)`` order (as :meth:`Store.history`).

    Returns:
        Alternating turns, first and last from the user.
    """
    return Transcript(history).turns()


class Transcript:
    """:func:`to_turns` kept up to date as a running turn appends its own messages.

    A turn posts its tool calls, then their results, then the next step: all at the end of the
    history. Re-translating the whole history for every model call would make each step cost more
    than the last; instead the built turns are kept and only the new messages are folded in, so the
    turns of earlier steps stay the same objects (the turn log caches their rendering by identity).

    Args:
        history: The session's history in ``(root_ts, ts, id)`` order.
    """

    def __init__(self, history: Sequence[Message]) -> None:
        calls: set[int] = set()
        found: list[Message] = []
        for msg in history:
            kind = msg.kind
            if kind is _TOOL_CALL:
                calls.add(msg.id)
            elif kind is _TOOL_RESULT:
                found.append(msg)
        results: dict[int, Message] = {}
        for msg in found:
            # The first result of a call wins; a result whose call is not in the history is an
            # orphan.
            if msg.parent_id in calls and msg.parent_id not in results:
                results[msg.parent_id] = msg
        self._builder = _Builder(results)
        add = self._builder.add
        for msg in history:
            add(msg)

    def extend(self, messages: Iterable[Message]) -> bool:
        """Fold in messages appended at the end of the history.

        Returns:
            False when a message cannot be folded in incrementally (a result whose call is no longer
            open); the caller must build a new Transcript from the whole history.
        """
        builder = self._builder
        for msg in messages:
            if msg.kind is _TOOL_RESULT:
                open_ids = {call_msg.id for call_msg, _ in builder.open_calls}
                if msg.parent_id not in open_ids or msg.parent_id in builder.results:
                    return False
                builder.results[msg.parent_id] = msg
            builder.add(msg)
        return True

    def turns(self) -> list[LLMTurn]:
        """The repaired turns of the history so far (the builder itself is left open)."""
        b = self._builder
        saved = (list(b.turns), b.role, list(b.blocks), list(b.open_calls), b.answered)
        try:
            return b.finish()
        finally:
            b.turns, b.role, b.blocks, b.open_calls, b.answered = saved


def check_turns(turns: Sequence[LLMTurn]) -> list[str]:
    """List every way ``turns`` break the transcript invariant (an empty list: valid).

    The invariant: turns alternate user/assistant, first and last from the user; no empty turn or
    empty text; in an assistant turn tool calls come last, with unique ids; the next turn opens with
    exactly their results, same count and order (Gemini's grouping rule, Claude's pairing rule); no
    result anywhere else.
    """
    return TurnChecker().check(turns)


class _Checked(NamedTuple):
    """The state of a :class:`TurnChecker` after one turn."""

    at: int  # the index of the turn
    role: str
    ids: int  # call ids seen up to this turn (the length of TurnChecker._ids)
    calls: tuple[str, ...]  # the ids the next turn must answer
    problems: tuple[str, ...]
    bad: int  # turns up to this one that have problems
    attachments: int  # image and document blocks up to this turn


_START = _Checked(-1, "", 0, (), (), 0, 0)
"""The state before the first turn."""


class TurnChecker:
    """:func:`check_turns` that re-checks only what changed since its last call.

    The turns of a growing request are the same objects from one model call to the next (see
    :class:`Transcript`), so the checker keeps its state after each turn in a :class:`TurnMemo`
    and resumes from the longest prefix it has seen (by identity): each check costs about the new
    turns, not all.
    """

    def __init__(self) -> None:
        self._memo: TurnMemo[_Checked] = TurnMemo()
        self._ids: list[str] = []
        self._id_set: set[str] = set()
        self._attachments = 0  # image and document blocks of the turn _check_one last checked

    @property
    def attachments(self) -> int:
        """Image and document blocks in the turns of the last check."""
        states = self._memo.values
        return states[-1].attachments if states else 0

    def check(self, turns: Sequence[LLMTurn]) -> list[str]:
        """List every way ``turns`` break the invariant (see :func:`check_turns`)."""
        if not turns:
            return ["no turns"]
        states = self._memo.update(turns, self._step)
        last = states[-1]
        problems = [p for state in states for p in state.problems] if last.bad else []
        if turns[0].role != "user":
            problems.insert(0, "the first turn is not the user's")
        if turns[-1].role != "user":
            problems.append("the last turn is not the user's")
        if last.calls:
            problems.append(f"calls {list(last.calls)} of the last turn have no results")
        return problems

    def _step(self, before: _Checked | None, turn: LLMTurn) -> _Checked:
        """Check one turn, given the state after the turn before it."""
        # unpacked at once: a NamedTuple's fields read by name cost a descriptor call each
        at, role, known, expected, _, bad, attachments = _START if before is None else before
        ids = self._ids
        if len(ids) > known:  # the ids of turns the memo has dropped since
            for dropped in ids[known:]:
                self._id_set.discard(dropped)
            del ids[known:]
        i = at + 1
        clean = self._clean(turn, role, expected)
        if clean is not None:  # the usual turn: tuple.__new__, as a NamedTuple's __new__ is slow
            if clean:
                ids.extend(clean)
                self._id_set.update(clean)
            attachments += self._attachments
            return tuple.__new__(_Checked, (i, turn.role, len(ids), clean, (), bad, attachments))
        problems, calls = self._check_one(i, turn, role or None, expected)
        attachments += self._attachments
        if not problems:
            return tuple.__new__(_Checked, (i, turn.role, len(ids), calls, (), bad, attachments))
        return _Checked(i, turn.role, len(ids), calls, tuple(problems), bad + 1, attachments)

    def _clean(
        self, turn: LLMTurn, previous_role: str, expected: tuple[str, ...]
    ) -> tuple[str, ...] | None:
        """The call ids of a turn with no problem, else None; counts its attachments.

        One pass over the blocks, no id recorded: a turn this cannot vouch for (any problem, or a
        block of a type it does not know) is checked in full, whose findings are the reference.
        """
        blocks, role = turn.blocks, turn.role
        if not blocks or role == previous_role:
            return None
        results, wanted = 0, len(expected)  # the leading results seen, and expected
        calls: list[str] = []
        attachments = 0
        id_set = self._id_set
        for block in blocks:
            # Exact types (a subclass is a type this does not know: the full check decides), which
            # the full check's isinstance accepts too; half the time of isinstance.
            if type(block) is ToolCallBlock:
                call_id = block.id
                if role != "assistant" or call_id in id_set or call_id in calls:
                    return None
                calls.append(call_id)
            elif calls:
                return None  # a block after the calls
            elif type(block) is TextBlock:
                if not block.text.strip():
                    return None
            elif type(block) is ToolResultBlock:
                # a result past the leading ones, or not the next call's in order
                if results == wanted or block.call_id != expected[results] or role != "user":
                    return None
                results += 1
                continue
            elif type(block) is ImageBlock or type(block) is DocumentBlock:
                attachments += 1
            elif type(block) is not ThoughtBlock:
                return None
            if results != wanted:
                return None  # a block before all the expected results
        if results != wanted:
            return None
        self._attachments = attachments
        return tuple(calls)

    def _check_one(
        self, i: int, turn: LLMTurn, previous_role: str | None, expected: tuple[str, ...]
    ) -> tuple[list[str], tuple[str, ...]]:
        """The problems of one turn and its call ids (recorded as used); counts its attachments.

        The full check, for a turn :meth:`_clean` cannot vouch for: its findings are the reference.
        """
        self._attachments = sum(1 for b in turn.blocks if isinstance(b, ImageBlock | DocumentBlock))
        problems: list[str] = []
        if turn.role == previous_role:
            problems.append(f"turn {i}: two {turn.role} turns in a row")
        if not turn.blocks:
            problems.append(f"turn {i}: empty")
        results = [b for b in turn.blocks if isinstance(b, ToolResultBlock)]
        if tuple(b.call_id for b in results) != expected:
            problems.append(
                f"turn {i}: results {[b.call_id for b in results]} "
                f"do not answer calls {list(expected)}"
            )
        if results and turn.blocks[: len(results)] != tuple(results):
            problems.append(f"turn {i}: tool results do not come first")
        calls: list[str] = []
        for block in turn.blocks:
            if isinstance(block, TextBlock) and not block.text.strip():
                problems.append(f"turn {i}: empty text")
            if isinstance(block, ToolCallBlock):
                if turn.role != "assistant":
                    problems.append(f"turn {i}: a tool call in a user turn")
                if block.id in self._id_set:
                    problems.append(f"turn {i}: call id {block.id} used twice")
                self._id_set.add(block.id)
                self._ids.append(block.id)
                calls.append(block.id)
            elif calls:
                problems.append(f"turn {i}: a {type(block).__name__} after the tool calls")
            if isinstance(block, ToolResultBlock) and turn.role != "user":
                problems.append(f"turn {i}: a tool result in an assistant turn")
        return problems, tuple(calls)
