"""The transcript repair and invariant: unit cases,
then random logs that must always give valid turns."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kesoku.vocab.ir import LLMTurn, TextBlock, ToolCallBlock, ToolResultBlock
from kesoku.vocab.model import Kind, Message, Metadata, Outcome, Role, Status
from kesoku.vocab.transcript import (
    CONTINUE_PROMPT,
    INTERRUPTED_SUFFIX,
    OMITTED_OPENING,
    Transcript,
    TurnChecker,
    TurnMemo,
    check_turns,
    missing_results,
    to_turns,
)

SID = "s"


class Log:
    """Builds stored-looking messages with increasing ids and timestamps."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.clock = itertools.count(1)
        self.messages: list[Message] = []

    def add(
        self, role: Role, kind: Kind, content: str = "x", *, root_ts: float, **kw: object
    ) -> Message:
        ts = float(next(self.clock))
        msg_id = next(self.ids)
        sender = {Role.USER: "User", Role.ASSISTANT: "Kesoku", Role.SYSTEM: "System"}.get(
            role, "tool"
        )
        msg = Message(
            session_id=SID,
            role=role,
            kind=kind,
            sender=sender,
            content=content,
            id=msg_id,
            ts=ts,
            root_ts=root_ts or ts,
            root_id=msg_id,
            **kw,  # type: ignore[arg-type]
        )
        self.messages.append(msg)
        return msg

    def user(self, text: str = "hi") -> Message:
        return self.add(Role.USER, Kind.TEXT, text, root_ts=0)

    def text(self, root: Message, text: str = "answer", status: Status = Status.DONE) -> Message:
        return self.add(Role.ASSISTANT, Kind.TEXT, text, root_ts=root.root_ts, status=status)

    def call(self, root: Message, name: str = "t", call_id: str | None = None) -> Message:
        meta = Metadata(tool_name=name, tool_arguments={"a": 1}, call_id=call_id)
        return self.add(
            Role.ASSISTANT, Kind.TOOL_CALL, f"{name}()", root_ts=root.root_ts, metadata=meta
        )

    def result(self, root: Message, call: Message, outcome: Outcome = Outcome.COMPLETED) -> Message:
        meta = Metadata(tool_name="tool", outcome=outcome)
        return self.add(
            Role.TOOL,
            Kind.TOOL_RESULT,
            "out",
            root_ts=root.root_ts,
            parent_id=call.id,
            metadata=meta,
        )

    def history(self) -> list[Message]:
        return sorted(self.messages, key=lambda m: (m.root_ts, m.ts, m.id))


def test_plain_conversation_alternates() -> None:
    log = Log()
    u = log.user("hello")
    log.text(u, "hi there")
    log.user("bye")
    turns = to_turns(log.history())
    assert [t.role for t in turns] == ["user", "assistant", "user"]
    assert turns[1].blocks == (TextBlock("hi there"),)
    assert check_turns(turns) == []


def test_parallel_calls_and_results_are_grouped_in_call_order() -> None:
    log = Log()
    u = log.user()
    c1, c2 = log.call(u, "a"), log.call(u, "b")
    log.result(u, c2)  # stored out of order
    log.result(u, c1)
    log.text(u)
    turns = to_turns(log.history())
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert [b.call_id for b in turns[2].blocks if isinstance(b, ToolResultBlock)] == [
        f"call_{c1.id}",
        f"call_{c2.id}",
    ]
    assert turns[-1].blocks == (TextBlock(CONTINUE_PROMPT),)
    assert check_turns(turns) == []


def test_sequential_steps_stay_separate_turns() -> None:
    log = Log()
    u = log.user()
    c1 = log.call(u)
    log.result(u, c1)
    c2 = log.call(u)
    log.result(u, c2)
    turns = to_turns(log.history())
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert [len(t.blocks) for t in turns] == [1, 1, 1, 1, 1]
    assert check_turns(turns) == []


def test_a_call_without_result_is_answered_lost_and_orphans_are_dropped() -> None:
    log = Log()
    u = log.user()
    call = log.call(u)
    orphan_parent = Message(
        session_id=SID, role=Role.ASSISTANT, kind=Kind.TOOL_CALL, sender="Kesoku", id=999
    )
    log.result(u, orphan_parent)
    v = log.user("next")
    assert missing_results(log.history()) == [call]
    turns = to_turns(log.history())
    results = [b for t in turns for b in t.blocks if isinstance(b, ToolResultBlock)]
    assert [(r.call_id, r.outcome) for r in results] == [(f"call_{call.id}", Outcome.LOST)]
    assert turns[-1].blocks[-1] == TextBlock(v.content)
    assert check_turns(turns) == []


def test_results_of_an_interrupted_turn_stay_with_their_calls() -> None:
    """A user message written while tools ran sorts after the turn's late results (by root_ts)."""
    log = Log()
    u = log.user("first")
    call = log.call(u)
    v = log.user("second")  # arrives while the tool runs
    log.result(u, call)  # written after v, but belongs to u's turn
    turns = to_turns(log.history())
    assert [t.role for t in turns] == ["user", "assistant", "user"]
    assert isinstance(turns[2].blocks[0], ToolResultBlock)
    assert turns[2].blocks[1] == TextBlock(v.content)
    assert check_turns(turns) == []


def test_interrupted_text_is_marked_and_empty_text_dropped() -> None:
    log = Log()
    u = log.user()
    log.text(u, "partial", Status.INTERRUPTED)
    log.text(u, "   ")
    log.user("again")
    turns = to_turns(log.history())
    assert turns[1].blocks == (TextBlock("partial" + INTERRUPTED_SUFFIX),)
    assert check_turns(turns) == []


def test_history_starting_with_the_model_gets_an_opening() -> None:
    log = Log()
    u = log.user()
    log.text(u)
    turns = to_turns(log.history()[1:])
    assert turns[0].blocks == (TextBlock(OMITTED_OPENING),)
    assert check_turns(turns) == []


def test_check_turns_names_each_problem() -> None:
    call = ToolCallBlock("c1", "t", {})
    bad = [
        LLMTurn("assistant", (call, TextBlock("after"))),
        LLMTurn("assistant", (TextBlock(" "),)),
        LLMTurn("user", (TextBlock("x"), ToolResultBlock("c9", "t", "r"))),
    ]
    problems = check_turns(bad)
    joined = "\n".join(problems)
    for needle in [
        "first turn",
        "two assistant turns",
        "after the tool calls",
        "empty text",
        "do not answer calls ['c1']",
        "do not come first",
    ]:
        assert needle in joined, (needle, problems)
    assert check_turns([]) == ["no turns"]
    # The incremental checker gives the same answers, also after a valid request reused its prefix.
    checker = TurnChecker()
    good = [LLMTurn("user", (TextBlock("x"),))]
    assert checker.check(good) == []
    assert checker.check(bad) == problems
    assert checker.check(good) == []


def _turn(text: str, role: str = "user") -> LLMTurn:
    return LLMTurn(role, (TextBlock(text),))  # type: ignore[arg-type]


class _Lengths:
    """A TurnMemo step: running total of the turns' text lengths, recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, str]] = []

    def __call__(self, before: int | None, turn: LLMTurn) -> int:
        block = turn.blocks[0]
        assert isinstance(block, TextBlock)
        self.calls.append((before, block.text))
        return (before or 0) + len(block.text)


def test_turn_memo_computes_only_the_turns_after_the_shared_prefix() -> None:
    step, memo = _Lengths(), TurnMemo[int]()
    a, b, c, d = _turn("a"), _turn("bb", "assistant"), _turn("ccc"), _turn("dddd", "assistant")
    assert memo.update([a, b], step) == [1, 3]
    assert step.calls == [(None, "a"), (1, "bb")] and memo.kept == 0
    step.calls.clear()
    assert memo.update((a, b, c), step) == [1, 3, 6]  # a new sequence of the same turn objects
    assert step.calls == [(3, "ccc")] and memo.kept == 2
    step.calls.clear()
    # An equal turn that is another object shares its value: it is the same content.
    assert memo.update([a, _turn("bb", "assistant"), c, d], step) == [1, 3, 6, 10]
    assert step.calls == [(6, "dddd")] and memo.kept == 3
    step.calls.clear()
    # Another turn in place of one is computed again, and every turn after it.
    assert memo.update([a, _turn("b", "assistant"), c, d], step) == [1, 2, 5, 9]
    assert step.calls == [(1, "b"), (2, "ccc"), (5, "dddd")] and memo.kept == 1
    assert memo.update([a, b, c, d], step) == [1, 3, 6, 10]
    step.calls.clear()
    # A shorter request keeps the values of its turns and computes nothing.
    assert memo.update([a], step) == [1] and memo.values == [1]
    assert step.calls == [] and memo.kept == 1
    assert memo.update([], step) == [] and memo.kept == 0
    assert memo.update([a], step) == [1] and step.calls == [(None, "a")]


def test_turn_memo_work_per_update_does_not_grow_with_the_history() -> None:
    step, memo = _Lengths(), TurnMemo[int]()
    turns: list[LLMTurn] = []
    for n in range(300):
        turns.append(_turn("x" * (n % 7 + 1), "assistant" if n % 2 else "user"))
        values = memo.update(list(turns), step)  # each call a new list, as a request is
        assert memo.kept == n and values[-1] == sum(k % 7 + 1 for k in range(n + 1))
    assert len(step.calls) == 300  # once per turn over the whole session, not once per turn a call


def test_turn_checker_rechecks_only_new_turns() -> None:
    class Counting(TurnChecker):
        checked = 0

        def _step(self, *args: Any) -> Any:
            self.checked += 1
            return super()._step(*args)

    call = ToolCallBlock("c1", "t", {})
    turns = [
        _turn("hi"),
        LLMTurn("assistant", (call,)),
        LLMTurn("user", (ToolResultBlock("c1", "t", "r"),)),
    ]
    checker = Counting()
    assert checker.check(turns[:2]) == [
        "the last turn is not the user's",
        "calls ['c1'] of the last turn have no results",
    ]
    assert checker.check(turns) == [] and checker.checked == 3
    # A turn replaced by an equal one is the same content: nothing is checked again.
    same = [*turns[:1], LLMTurn("assistant", (call,)), turns[2]]
    assert checker.check(same) == [] and checker.checked == 3
    # One replaced by another turn is checked again, with the call ids of the dropped ones
    # forgotten: c1 is not reported as used twice.
    again = [*turns[:1], LLMTurn("assistant", (call, ToolCallBlock("c2", "t", {}))), turns[2]]
    assert checker.check(again) == check_turns(again) and checker.checked == 5


def test_a_growing_turn_keeps_its_earlier_turn_objects() -> None:
    log = Log()
    u = log.user()
    transcript = Transcript(log.history())
    calls = [log.call(u), log.call(u)]
    assert transcript.extend(calls)
    before = transcript.turns()
    results = [log.result(u, c) for c in calls]
    assert transcript.extend(results)
    after = transcript.turns()
    assert after[0] is before[0]  # the closed user turn was not rebuilt
    assert after == to_turns(log.history())
    late = log.result(u, calls[0])  # a second result for a closed call: cannot fold in
    assert not transcript.extend([late])


async def test_session_history_folds_new_messages_and_rebuilds_for_late_ones(
    tmp_path: Path,
) -> None:
    from kesoku.agent.history import SessionHistory
    from kesoku.gateway import Gateway
    from kesoku.store import Store
    from kesoku.vocab.model import in_turn, user_text

    store = Store(tmp_path / "k.db")
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("t", "c")
    other = gateway.open_session("t", "other")
    post = gateway.post
    first = await post(user_text(session.id, "first", ts=10.0))
    await post(user_text(other.id, "not mine", ts=11.0))
    hist = SessionHistory(gateway, session.id)
    assert hist.sync() == 1  # read from the store: it was posted before the history listened
    meta = Metadata(tool_name="t", tool_arguments={})
    call = await post(in_turn(first, Role.ASSISTANT, Kind.TOOL_CALL, "t()", metadata=meta, ts=12.0))
    second = await post(user_text(session.id, "second", ts=13.0))
    assert hist.sync() == 2  # handed over in memory
    assert hist.unanswered() == [call]
    turns_first = hist.turns(first)  # the later user message is left out of the first turn
    assert next(getattr(b, "text", None) for t in turns_first for b in t.blocks) == "first"
    assert all(getattr(b, "text", "") != "second" for t in turns_first for b in t.blocks)
    # The call's result arrives after the second message was written: it sorts inside the first
    # turn. Written by another connection (another process, say): the history finds it in the store.
    result_meta = Metadata(tool_name="t", outcome=Outcome.COMPLETED)
    elsewhere = Store(tmp_path / "k.db")
    elsewhere.insert_messages(
        [
            in_turn(
                first,
                Role.TOOL,
                Kind.TOOL_RESULT,
                "r",
                parent_id=call.id,
                metadata=result_meta,
                ts=14.0,
            )
        ]
    )
    elsewhere.close()
    assert hist.sync() == 1
    assert hist.sync() == 0
    assert hist.unanswered() == []
    assert [m.id for m in hist.messages] == [m.id for m in store.history(session.id)]
    assert hist.turns(second) == to_turns(store.history(session.id))
    hist.close()
    await post(user_text(session.id, "after close", ts=15.0))
    assert hist.sync() == 0
    store.close()


# -- random logs ---------------------------------------------------------------------------------

EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("user"), st.sampled_from(["hi", "", "  "])),
        st.tuples(
            st.just("text"), st.sampled_from([Status.DONE, Status.INTERRUPTED, Status.FAILED])
        ),
        st.tuples(st.just("thought"), st.booleans()),
        st.tuples(st.just("calls"), st.integers(1, 3)),
        st.tuples(st.just("results"), st.integers(0, 3)),
        st.tuples(st.just("system"), st.just(0)),
        st.tuples(st.just("orphan"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS, st.booleans(), st.floats(0, 1))
def test_any_log_gives_valid_turns(
    events: list[tuple[str, object]], drop_prefix: bool, split: float
) -> None:
    log = Log()
    root = log.user()
    open_calls: list[tuple[Message, Message]] = []  # (root, call)
    for kind, arg in events:
        if kind == "user":
            root = log.add(Role.USER, Kind.TEXT, str(arg), root_ts=0)
        elif kind == "text":
            assert isinstance(arg, Status)
            log.text(root, "answer", arg)
        elif kind == "thought":
            meta = Metadata(thought_signature=b"sig" if arg else None)
            log.add(
                Role.ASSISTANT,
                Kind.THOUGHT,
                "hmm" if arg else "",
                root_ts=root.root_ts,
                metadata=meta,
            )
        elif kind == "calls":
            assert isinstance(arg, int)
            # Every batch reuses the id "same" once: providers and replays can repeat ids.
            open_calls += [
                (root, log.call(root, call_id="same" if i == 0 else None)) for i in range(arg)
            ]
        elif kind == "results":
            assert isinstance(arg, int)
            for _ in range(min(arg, len(open_calls))):
                call_root, call = open_calls.pop(len(open_calls) // 2)  # not in call order
                log.result(call_root, call)
        elif kind == "system":
            log.add(Role.SYSTEM, Kind.TEXT, "note", root_ts=root.root_ts)
        else:
            ghost = Message(
                session_id=SID, role=Role.ASSISTANT, kind=Kind.TOOL_CALL, sender="Kesoku", id=10_000
            )
            log.result(root, ghost)
    history = log.history()
    if drop_prefix:
        history = history[len(history) // 3 :]
    turns = to_turns(history)
    assert check_turns(turns) == []
    # Built incrementally (a prefix, then the rest folded in), the turns are the same when it can
    # fold.
    k = int(len(history) * split)
    incremental = Transcript(history[:k])
    if incremental.extend(history[k:]):
        assert incremental.turns() == turns
    # The incremental checker agrees with a fresh check on every snapshot of a growing transcript.
    growing, checker = Transcript(history[:1]), TurnChecker()
    for n, msg in enumerate(history[1:], start=2):
        if not growing.extend([msg]):
            growing = Transcript(history[:n])
        snapshot = growing.turns()
        assert checker.check(snapshot) == check_turns(snapshot)
    # Every call in the turns has exactly one result, and nothing else answers.
    calls = [b.id for t in turns for b in t.blocks if isinstance(b, ToolCallBlock)]
    results = [b.call_id for t in turns for b in t.blocks if isinstance(b, ToolResultBlock)]
    assert calls == results
