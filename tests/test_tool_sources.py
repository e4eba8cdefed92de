"""Tool sources (MCP servers' tools): served by the runtime, asked each step, withheld when gone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import trio
from runtime_harness import echo, serve_runtime

from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.model import Kind, Outcome


class Source:
    name = "fake"

    def __init__(self, tools: Sequence[Tool]) -> None:
        self.available = list(tools)
        self.served = False

    def tools(self) -> Sequence[Tool]:
        return self.available

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.served = True
        task_status.started()
        await trio.sleep_forever()


def named(name: str) -> Tool:
    base = echo()
    return Tool(name, base.description, base.run, base.parameters)


async def test_a_sources_tools_are_offered_per_step_and_a_withheld_one_fails_cleanly(
    tmp_path: Path,
) -> None:
    source = Source([named("echo")])  # "echo" is taken by a fixed tool: hidden

    async def vanish(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        source.available = []  # the server goes away after this call
        return str(arguments["text"])

    source.available.append(Tool("fake__echo", "Echo, then vanish.", vanish))
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "fake__echo", "arguments": {"text": "one"}}]},
            {"tool_calls": [{"name": "fake__echo", "arguments": {"text": "two"}}]},
            {"text": "done"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()], tool_sources=[source]) as h:
        assert source.served
        assert [t.name for t in h.rt.current_tools()] == ["echo", "fake__echo"]
        await h.say("go")
        await h.turn_end()
        results = [m for m in h.history() if m.kind is Kind.TOOL_RESULT]
    assert [t.name for t in llm.requests[0].tools] == ["echo", "fake__echo"]
    assert [t.name for t in llm.requests[1].tools] == ["echo"]
    assert results[0].metadata.outcome is Outcome.COMPLETED and results[0].content == "one"
    assert results[1].metadata.outcome is Outcome.FAILED
    assert results[1].content == "[failed] there is no tool named 'fake__echo' (tools: echo)"
