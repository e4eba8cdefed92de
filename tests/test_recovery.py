"""Crash recovery: what a dead process left in the store is finished by the next one
(ARCHITECTURE.md, "Guarantees")."""

from __future__ import annotations

from pathlib import Path

from runtime_harness import serve_runtime

from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.vocab.ir import ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Message, Metadata, Outcome, Role, Status, in_turn, user_text


def leave_crash(
    tmp_path: Path, *, answered: bool = False, pending: str | None = None
) -> tuple[Message, Message]:
    """Write what a process killed mid-tool leaves:
    a processing root and a tool call without result."""
    store = Store(tmp_path / "kesoku.db")
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("terminal", "chan-1")
    root = store.insert_messages([user_text(session.id, "run it", ts=100.0)])[0].message
    store.set_status([root.id], Status.PROCESSING)
    meta = Metadata(tool_name="sleep", tool_arguments={"seconds": 5}, call_id="toolu_1")
    call_msg = in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "sleep()", metadata=meta, ts=101.0)
    call = store.insert_messages([call_msg])[0].message
    if answered:
        result_meta = Metadata(tool_name="sleep", call_id="toolu_1", outcome=Outcome.COMPLETED)
        store.insert_messages(
            [
                in_turn(
                    root,
                    Role.TOOL,
                    Kind.TOOL_RESULT,
                    "ok",
                    parent_id=call.id,
                    metadata=result_meta,
                    ts=102.0,
                ),
                in_turn(root, Role.ASSISTANT, Kind.TEXT, "All done.", ts=103.0),
            ]
        )
    if pending is not None:
        store.insert_messages([user_text(session.id, pending, ts=200.0)])
    store.close()
    return root, call


async def test_a_turn_left_processing_resumes_with_a_lost_result(tmp_path: Path) -> None:
    root, call = leave_crash(tmp_path)
    llm = ScriptedLLM([{"text": "The tool's effect is unknown; checking."}])
    async with serve_runtime(tmp_path, llm, worker_idle_s=1) as h:
        metrics = await h.turn_end()
        assert metrics.state is TurnState.DONE
        history = h.history()
        assert [(m.role, m.kind) for m in history] == [
            (Role.USER, Kind.TEXT),
            (Role.ASSISTANT, Kind.TOOL_CALL),
            (Role.TOOL, Kind.TOOL_RESULT),
            (Role.ASSISTANT, Kind.TEXT),
        ]
        lost = history[2]
        assert lost.parent_id == call.id
        assert lost.metadata.outcome is Outcome.LOST
        assert lost.metadata.call_id == "toolu_1"
        assert h.store.get_message(root.id).status is Status.DONE  # type: ignore[union-attr]
        (request,) = llm.requests
        results = [b for t in request.turns for b in t.blocks if isinstance(b, ToolResultBlock)]
        assert [(r.call_id, r.outcome) for r in results] == [("toolu_1", Outcome.LOST)]


async def test_a_turn_answered_before_the_crash_is_not_answered_again(tmp_path: Path) -> None:
    root, _ = leave_crash(tmp_path, answered=True, pending="and now?")
    llm = ScriptedLLM([{"text": "Second answer."}])
    async with serve_runtime(tmp_path, llm) as h:
        await h.turn_end()
        assert len(llm.requests) == 1  # only the pending message was answered
        history = h.history()
        answers = [m.content for m in history if m.role is Role.ASSISTANT and m.kind is Kind.TEXT]
        assert answers == ["All done.", "Second answer."]
        assert h.store.get_message(root.id).status is Status.DONE  # type: ignore[union-attr]
        assert all(m.status is Status.DONE for m in history if m.role is Role.USER)


async def test_pending_messages_at_start_are_answered_with_the_resumed_turn(tmp_path: Path) -> None:
    root, _ = leave_crash(tmp_path, pending="also this")
    llm = ScriptedLLM([{"text": "Both handled."}])
    async with serve_runtime(tmp_path, llm) as h:
        metrics = await h.turn_end()
        assert metrics.state is TurnState.DONE
        (request,) = llm.requests
        texts = [getattr(b, "text", None) for t in request.turns for b in t.blocks]
        assert texts[0] == "run it"
        assert texts[-1] == "also this"
        users = [m for m in h.history() if m.role is Role.USER]
        assert [m.status for m in users] == [Status.DONE, Status.DONE]
        assert h.history()[-1].root_id == users[-1].id
        assert root.id == users[0].id
