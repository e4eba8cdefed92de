"""The subagent tool via the runtime: a child loop whose only trace in the log is its conclusion.

One ScriptedLLM serves parent and child alike: each model call takes the next step, so the steps
below alternate between them in the order the calls happen.
"""

from __future__ import annotations

from pathlib import Path

import trio
from runtime_harness import echo, serve_runtime, sleeper

from kesoku.agent.subagent import PERSONA
from kesoku.observe.turnlog_writer import TurnLogWriter
from kesoku.testing import ScriptedLLM
from kesoku.vocab.events import ToolStarted
from kesoku.vocab.ir import TextBlock, ToolCallBlock, ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Outcome


def delegate(task: str = "find the answer") -> dict[str, object]:
    return {"tool_calls": [{"name": "subagent", "arguments": {"task": task}}]}


async def test_only_the_conclusion_is_persisted(tmp_path: Path) -> None:
    # child
    llm = ScriptedLLM(
        [
            delegate("echo 42 and report it"),  # parent
            {
                "text": "Let me echo.",
                "tool_calls": [{"name": "echo", "arguments": {"text": "42"}}],
            },
            {"text": "The echo said 42."},  # child's conclusion
            {"text": "The subagent found 42."},  # parent
        ]
    )
    async with serve_runtime(
        tmp_path, llm, tools=[echo()], subagent_max_steps=5, turnlog=TurnLogWriter()
    ) as h:
        await h.say("what does echo say?")
        metrics = await h.turn_end()
        history = h.history()
    assert metrics.state is TurnState.DONE
    assert [
        (m.kind, m.metadata.tool_name)
        for m in history
        if m.kind in (Kind.TOOL_CALL, Kind.TOOL_RESULT)
    ] == [
        (Kind.TOOL_CALL, "subagent"),
        (Kind.TOOL_RESULT, "subagent"),
    ]
    result = next(m for m in history if m.kind is Kind.TOOL_RESULT)
    assert result.content == "The echo said 42."
    assert result.metadata.outcome is Outcome.COMPLETED
    assert "Let me echo." not in [m.content for m in history]
    parent, child_1, child_2, parent_2 = llm.requests
    # The child has its own prompt and history, and no subagent tool (no nesting).
    assert child_1.system.startswith(PERSONA)
    assert [t.name for t in child_1.tools] == ["echo"]
    assert [t.name for t in parent.tools] == ["echo", "subagent"]
    assert child_1.turns[0].blocks == (TextBlock("echo 42 and report it"),)
    assert len(child_1.turns) == 1
    call = child_2.turns[1].blocks[1]
    assert isinstance(call, ToolCallBlock) and call.name == "echo"
    assert child_2.turns[2].blocks == (ToolResultBlock(call.id, "echo", "42", Outcome.COMPLETED),)
    # The parent's next call reads the conclusion as the tool result.
    last = parent_2.turns[-1].blocks[-1]
    assert isinstance(last, ToolResultBlock) and last.content == "The echo said 42."
    # Every model call, the child's included, has its YAML log (written by the time the runtime
    # stopped).
    logs = sorted(Path(h.session.workspace).glob("llm-turn-*.log.yaml"))
    assert len(logs) == 4
    assert "subagent of Kesoku" in logs[1].read_text()


async def test_the_step_cap_ends_the_child_with_its_last_words(tmp_path: Path) -> None:
    again = {"text": "still looking", "tool_calls": [{"name": "echo", "arguments": {"text": "x"}}]}
    llm = ScriptedLLM([delegate(), again, again, {"text": "gave up"}])
    async with serve_runtime(tmp_path, llm, tools=[echo()], subagent_max_steps=2) as h:
        await h.say("go")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
    assert result.content == (
        "[step limit] The subagent used its 2 model calls (subagent.max_steps) without concluding. "
        "Its last words: still looking"
    )
    assert len(llm.requests) == 4


async def test_a_failed_child_model_call_fails_the_tool_call(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [delegate(), {"error": {"message": "quota exhausted", "status": 400}}, {"text": "sorry"}]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()], subagent_max_steps=5) as h:
        await h.say("go")
        await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
    assert result.metadata.outcome is Outcome.FAILED
    assert result.content.startswith("[failed] the subagent's model call failed: ")
    assert "quota exhausted" in result.content


async def test_a_child_cannot_call_subagent(tmp_path: Path) -> None:
    llm = ScriptedLLM([delegate(), delegate("nested"), {"text": "could not nest"}, {"text": "ok"}])
    async with serve_runtime(tmp_path, llm, tools=[echo()], subagent_max_steps=5) as h:
        await h.say("go")
        await h.turn_end()
    nested = llm.requests[2].turns[-1].blocks[0]
    assert isinstance(nested, ToolResultBlock) and nested.outcome is Outcome.FAILED
    assert nested.content == "[failed] there is no tool named 'subagent' (tools: echo)"


async def test_a_forced_stop_kills_the_child_and_its_tools(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    log: list[str] = []
    llm = ScriptedLLM(
        [
            delegate(),
            {"tool_calls": [{"name": "sleep", "arguments": {"seconds": 600}}]},
            {"text": "never"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[sleeper(log=log)], subagent_max_steps=5) as h:
        await h.say("go")
        async for event in h.events:
            if isinstance(event, ToolStarted):
                break
        await trio.sleep(1)  # the child is now inside its sleep
        assert log and log[0].startswith("start ")
        assert h.gateway.stop(h.session.id, force=True)
        metrics = await h.turn_end()
        result = next(m for m in h.history() if m.kind is Kind.TOOL_RESULT)
    assert metrics.state is TurnState.STOPPED
    assert result.metadata.outcome is Outcome.KILLED
    assert len(log) == 1  # the child's sleep never ended
    assert len(llm.requests) == 2  # the child made no further call
