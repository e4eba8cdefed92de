"""A new worker's history: read from the store in one query, then followed by a listener.

The context it builds must equal the full rebuild (:func:`kesoku.vocab.view.view_turns` over
``Store.history``), before and after a compaction cut, with messages arriving in memory and from
another connection; and the checker's quick path must agree with its full check.
"""

from __future__ import annotations

import gc
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kesoku.agent.history import SessionHistory
from kesoku.gateway import Gateway
from kesoku.store import Store
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
    Kind,
    Message,
    Metadata,
    Outcome,
    Role,
    Session,
    in_turn,
    user_text,
)
from kesoku.vocab.transcript import TurnChecker, missing_results
from kesoku.vocab.view import Archive, ViewState, key, view_turns

CALL = Metadata(tool_name="t", tool_arguments={"x": 1})
DONE = Metadata(tool_name="t", outcome=Outcome.COMPLETED)


async def _turn(gateway: Gateway, session_id: str, n: int, *, answered: bool = True) -> Message:
    """Post a user message, a tool call and (when ``answered``) its result, then a reply."""
    root = await gateway.post(user_text(session_id, f"question {n}", ts=10.0 * n))
    call = await gateway.post(
        in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "t()", metadata=CALL, ts=10.0 * n + 1)
    )
    if answered:
        await gateway.post(
            in_turn(
                root,
                Role.TOOL,
                Kind.TOOL_RESULT,
                f"result {n} " + "r" * 50,
                parent_id=call.id,
                metadata=DONE,
                ts=10.0 * n + 2,
            )
        )
        await gateway.post(in_turn(root, Role.ASSISTANT, Kind.TEXT, f"answer {n}", ts=10.0 * n + 3))
    return root


def _elsewhere(path: Path, messages: list[Message]) -> list[Message]:
    """Write messages through another connection, as another process would."""
    other = Store(path)
    try:
        return [i.message for i in other.insert_messages(messages)]
    finally:
        other.close()


def _same_as_rebuild(hist: SessionHistory, store: Store, root: Message) -> None:
    """The history's messages, open calls and turns equal those rebuilt from the store."""
    stored = store.history(hist.session_id)
    assert hist.messages == stored
    by_id = sorted(missing_results(stored), key=lambda m: m.id)
    assert hist.unanswered() == by_id
    upto = [m for m in stored if m.root_ts <= root.root_ts]
    turns = hist.turns(root)
    assert turns == view_turns(upto, hist.view)
    assert hist.checker.check(turns) == []


async def test_a_new_workers_history_equals_the_rebuild_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "k.db"
    store = Store(path)
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("t", "c")
    other = gateway.open_session("t", "other")
    await gateway.post(user_text(other.id, "not this session", ts=1.0))
    for n in range(1, 4):
        await _turn(gateway, session.id, n)
    open_root = await _turn(gateway, session.id, 4, answered=False)  # a call left without a result
    # A message posted between the history's creation and its first sync is read, not lost.
    hist = SessionHistory(gateway, session.id)
    late_user = await gateway.post(user_text(session.id, "question 5", ts=50.0))
    assert hist.sync() == len(store.history(session.id)) == 15
    _same_as_rebuild(hist, store, late_user)
    assert [m.kind for m in hist.unanswered()] == [Kind.TOOL_CALL]
    # The open call's result comes from another connection after the read: it sorts inside turn 4,
    # before the later user message, and the history takes it in exactly once.
    [call] = hist.unanswered()
    _elsewhere(
        path,
        [
            in_turn(
                open_root,
                Role.TOOL,
                Kind.TOOL_RESULT,
                "late",
                parent_id=call.id,
                metadata=DONE,
                ts=45.0,
            )
        ],
    )
    assert hist.sync() == 1
    assert hist.sync() == 0
    _same_as_rebuild(hist, store, late_user)
    assert hist.unanswered() == []
    # What this process posts arrives from memory.
    reply = await gateway.post(in_turn(late_user, Role.ASSISTANT, Kind.TEXT, "five", ts=51.0))
    assert hist.sync() == 1 and hist.messages[-1] == reply
    _same_as_rebuild(hist, store, late_user)
    hist.close()
    store.close()


async def test_a_new_workers_history_under_a_compaction_cut_equals_the_rebuild(
    tmp_path: Path,
) -> None:
    path = tmp_path / "k.db"
    store = Store(path)
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("t", "c")
    roots = [await _turn(gateway, session.id, n) for n in range(1, 6)]
    stored = store.history(session.id)
    third = next(m for m in stored if m.root_id == roots[2].id)
    fourth = next(m for m in stored if m.root_id == roots[3].id)
    old_result = next(m for m in stored if m.kind is Kind.TOOL_RESULT and m.root_id == roots[2].id)
    view = ViewState(
        archive_before=key(third),
        evict_before=key(fourth),
        retained={old_result.id: "kept excerpt"},
        archives=(Archive(1, 2, "Turn 1: intent=q1\nTurn 2: intent=q2"),),
        stages=(1, 2),
    )
    store.add_view_state(session.id, view.encode())
    hist = SessionHistory(gateway, session.id)  # a new worker after the compaction
    assert hist.view == view
    hist.sync()
    _same_as_rebuild(hist, store, roots[-1])
    turns = hist.turns(roots[-1])
    first = turns[0].blocks[0]
    assert isinstance(first, TextBlock) and "Turn 1: intent=q1" in first.text
    assert all("question 1" not in getattr(b, "text", "") for t in turns for b in t.blocks)
    # The session goes on, then a later cut: still the same as the rebuild.
    root = await _turn(gateway, session.id, 6)
    hist.sync()
    _same_as_rebuild(hist, store, root)
    later = ViewState(archive_before=key(fourth), archives=(Archive(1, 3, "Turn 1-3"),))
    hist.set_view(later)
    _same_as_rebuild(hist, store, root)
    hist.close()
    store.close()


async def test_reading_a_session_leaves_the_garbage_collector_as_it_was(tmp_path: Path) -> None:
    store = Store(tmp_path / "k.db")
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("t", "c")
    root = await _turn(gateway, session.id, 1)
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            hist = SessionHistory(gateway, session.id)
            hist.sync()  # read with the collector paused
            hist.turns(root)  # translated with it paused
            assert gc.isenabled() is enabled
            hist.close()
    finally:
        (gc.enable if was else gc.disable)()
    store.close()


# -- the checker's quick path --------------------------------------------------------------------


class _FullChecker(TurnChecker):
    """The checker without its quick path: every turn gets the full check."""

    def _clean(self, *args: object) -> None:
        return None


_BLOCKS: st.SearchStrategy[LLMBlock] = st.one_of(
    st.builds(TextBlock, st.sampled_from(["hi", "", " "])),
    st.builds(ThoughtBlock, st.sampled_from(["hm", ""])),
    st.builds(ToolCallBlock, st.sampled_from(["c1", "c2", "c3"]), st.just("t"), st.just({})),
    st.builds(ToolResultBlock, st.sampled_from(["c1", "c2", "c3"]), st.just("t"), st.just("r")),
    st.builds(ImageBlock, st.just("a.png"), st.just("image/png")),
    st.builds(DocumentBlock, st.just("a.pdf"), st.just("application/pdf")),
)
_TURNS = st.lists(
    st.builds(
        LLMTurn, st.sampled_from(["user", "assistant"]), st.lists(_BLOCKS, max_size=4).map(tuple)
    ),
    max_size=8,
)


@settings(max_examples=400, deadline=None)
@given(_TURNS, st.lists(_TURNS, max_size=3))
def test_the_checkers_quick_path_finds_what_the_full_check_finds(
    turns: list[LLMTurn], growth: list[list[LLMTurn]]
) -> None:
    quick, full = TurnChecker(), _FullChecker()
    # Requests that grow (and change at their end), each checked incrementally by both.
    for request in [turns, *([*turns, *more] for more in growth)]:
        assert quick.check(request) == full.check(request)
        assert quick.attachments == full.attachments
    assert quick.check(turns) == _FullChecker().check(turns)


async def test_a_result_stored_before_its_call_answers_nothing(
    gateway: Gateway, session: Session
) -> None:
    """The first read's open calls follow id order, as the listener hands messages over."""
    root = await gateway.post(user_text(session.id, "q", ts=10.0))
    # A result naming the id the call is about to get: before its call in id order.
    early = await gateway.post(
        in_turn(
            root,
            Role.TOOL,
            Kind.TOOL_RESULT,
            "early",
            parent_id=root.id + 2,
            metadata=Metadata(tool_name="t", outcome=Outcome.COMPLETED),
            ts=11.0,
        )
    )
    call = await gateway.post(
        in_turn(
            root,
            Role.ASSISTANT,
            Kind.TOOL_CALL,
            "",
            metadata=Metadata(tool_name="t", tool_arguments={"x": 1}),
        )
    )
    answered = await gateway.post(
        in_turn(
            root,
            Role.ASSISTANT,
            Kind.TOOL_CALL,
            "",
            metadata=Metadata(tool_name="t", tool_arguments={"x": 1}),
            ts=12.0,
        )
    )
    await gateway.post(
        in_turn(
            root,
            Role.TOOL,
            Kind.TOOL_RESULT,
            "r",
            parent_id=answered.id,
            metadata=Metadata(tool_name="t", outcome=Outcome.COMPLETED),
            ts=13.0,
        )
    )
    assert early.parent_id == call.id
    read = SessionHistory(gateway, session.id)
    read.sync()
    # The same messages taken in one by one, in id order (a listener's replay from 0).
    replayed = SessionHistory(gateway, session.id)
    replayed._listener = gateway.listen(after=0, session_id=session.id)
    replayed.sync()
    assert read.unanswered() == replayed.unanswered() == [call]
    read.close()
    replayed.close()
