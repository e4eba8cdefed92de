"""A real Kesoku runtime process for crash tests: scripted model, one slow tool.

Usage: agent_daemon.py DB SESSIONS_DIR TOOL_SECONDS

The model calls ``sleep`` unless the request's last turn already holds its result, then answers
"answered" — so whatever a crash left, the restarted process decides from the history alone.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from kesoku.agent.runtime import Runtime
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.testing import ScriptedLLM, Step
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.ir import LLMRequest, ToolResultBlock


def respond(request: LLMRequest) -> Step | dict[str, Any]:
    last = request.turns[-1]
    if any(isinstance(b, ToolResultBlock) for b in last.blocks):
        return Step(text="answered")
    return {"tool_calls": [{"name": "sleep"}]}


async def main(db: str, sessions: str, tool_s: float) -> None:
    async def slow(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        Path(sessions, "tool-started").write_text(str(ctx.call_id))
        await trio.sleep(tool_s)
        return "slept"

    gateway = Gateway(Store(db), sessions)
    rt = Runtime(gateway, ScriptedLLM(responder=respond), tools=[Tool("sleep", "Sleep.", slow)])
    await rt.serve()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], float(sys.argv[3]))
