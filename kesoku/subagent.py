"""The subagent tool: a child turn loop for a self-contained task.

The child gets the session's backend, the parent's tools minus ``subagent`` (no nesting), a system
prompt of its own and an in-memory history that starts with the task. It loops like a turn — model
call, the step's tool calls run concurrently, results, again — until the model answers without tool
calls or ``subagent.max_steps`` model calls are used, or it repeats a call it was told repeats (the
turn's repeat guard, :mod:`kesoku.repeat`). Nothing of the child is written to the session
log: only its conclusion comes back, as the ``subagent`` tool result (each of its model calls is still
logged to ``llm-turn-{idx}.log.yaml`` like any other). Its system prompt and tool results are masked
(:meth:`~kesoku.runtime.Runtime.mask`) as the gateway masks the session's messages.

Cancellation: the child runs inside the parent's tool batch, so it is cancelled with it (a forced stop,
the tool's ``timeout_s``); its running tools are cancelled and kill their process groups. A first stop
or a new user message lets it finish, like any running tool.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from kesoku.errors import BackendError, ToolError
from kesoku.llm.ir import (
    LLMBlock,
    LLMTurn,
    ResponseBuilder,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from kesoku.model import Outcome
from kesoku.prompt import build_system_prompt, read_notes
from kesoku.repeat import RepeatGuard
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.execute import run_tool
from kesoku.turn import truncated_result
from kesoku.turnlog import TurnLogEntry

if TYPE_CHECKING:
    from kesoku.llm.base import BaseLLM
    from kesoku.llm.ir import LLMRequest, LLMResponse
    from kesoku.runtime import Runtime

SUBAGENT_TIMEOUT_S = 1800.0
"""Longest run of one subagent call, its tools included."""
MAX_STEPS = 20
"""``subagent.max_steps``: model calls a subagent may make."""

PERSONA = """You are a subagent of Kesoku. The main agent gave you one task; carry it out with your tools,
checking your work, without asking anyone anything (nobody reads your intermediate messages). End with your
conclusion: what you found or did, with the facts the main agent needs (paths, names, numbers, commands and
their results), briefly. If you could not finish, say what is missing and why."""

DESCRIPTION = """Hand a self-contained task to a subagent: a helper with your tools (except subagent) and a
fresh context, which works on its own and returns only its conclusion. Use it for research or chores whose
details would clutter this conversation (searching a codebase, trying several commands). Give it everything
it needs in `task`: it cannot see this conversation."""


def subagent_tool(rt: Runtime, *, max_steps: int = MAX_STEPS, timeout_s: float = SUBAGENT_TIMEOUT_S) -> Tool:
    """The ``subagent`` tool of a runtime.

    Args:
        rt: The runtime: the session's backend, the tools (``subagent`` left out), the turn logs.
        max_steps: Model calls one subagent may make.
        timeout_s: Longest run of one subagent, its tools included.

    Returns:
        The tool.
    """

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        task = arguments.get("task")
        if not isinstance(task, str) or not task.strip():
            raise ToolError("`task` must be a non-empty string: the whole task, with what the subagent needs")
        tools = [t for t in rt.current_tools() if t.name != "subagent"]
        return await Subagent(rt, rt.llm_for(ctx.session), tools, ctx, max_steps=max_steps).run(task)

    parameters = {
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "The task, complete: the subagent sees nothing else."}
        },
        "required": ["task"],
    }
    return Tool("subagent", DESCRIPTION, run, parameters, timeout_s=timeout_s)


class Subagent:
    """One child loop.

    Args:
        rt: The runtime (turn logs).
        llm: The backend.
        tools: The tools it may call.
        ctx: The parent call's context: session, working directory, guard.
        max_steps: Model calls it may make.
    """

    def __init__(self, rt: Runtime, llm: BaseLLM, tools: Sequence[Tool], ctx: ToolContext, *, max_steps: int) -> None:
        self.rt = rt
        self.llm = llm
        self.tools = {t.name: t for t in tools}
        self.ctx = ctx
        self.max_steps = max_steps
        self.turns: list[LLMTurn] = []
        """The child's history, in memory only."""
        self.repeats = RepeatGuard(rt.max_identical_calls)

    async def run(self, task: str) -> str:
        """Work on ``task`` until a conclusion or the step cap.

        Returns:
            The conclusion (the text of the last model answer), or a note saying the step cap was hit
            (or that it kept repeating a call) with the last text it wrote.

        Raises:
            ToolError: A model call failed (after the backend's retries).
        """
        cwd = self.ctx.cwd
        now = dt.datetime.now().astimezone()
        specs = [t.spec for t in self.tools.values()]
        notes = read_notes(cwd)
        system = build_system_prompt(
            persona=PERSONA, tools=list(self.tools.values()), skills=(), notes=notes, cwd=cwd, now=now
        )
        system = self.rt.mask(system)  # as the turn's: AGENTS.md may hold a secret
        self.turns = [LLMTurn("user", (TextBlock(task),))]
        last_text = ""
        for step in range(self.max_steps):
            request = await self.llm.request_from_turns(self.turns, system=system, tools=specs)
            response = await self._call(request)
            calls = [
                c if c.id else msgspec.structs.replace(c, id=f"sub_{step}_{i}")
                for i, c in enumerate(response.tool_calls)
            ]
            if not calls:
                return response.text.strip() or "(the subagent ended without writing a conclusion)"
            last_text = response.text.strip() or last_text
            blocks: list[LLMBlock] = [*response.thought_blocks]
            if response.text.strip():
                blocks.append(TextBlock(response.text))
            blocks.extend(calls)
            self.turns.append(LLMTurn("assistant", tuple(blocks)))
            if response.cut:  # as in a turn: the calls may be incomplete, and none runs
                note = truncated_result(response, request.max_output_tokens or self.llm.output_limit)
                cut = [ToolResultBlock(c.id, c.name, note, Outcome.TRUNCATED) for c in calls]
                self.turns.append(LLMTurn("user", tuple(cut)))
                continue
            self.turns.append(LLMTurn("user", tuple(await self._run_calls(calls))))
            if self.repeats.stuck is not None:
                note = (
                    f"[repeating] The subagent kept calling {self.repeats.stuck} with the same arguments after "
                    "being told it repeats (agent.max_identical_calls), and was stopped."
                )
                break
        else:
            note = (
                f"[step limit] The subagent used its {self.max_steps} model calls (subagent.max_steps) "
                "without concluding."
            )
        return f"{note} Its last words: {last_text}" if last_text else note

    async def _call(self, request: LLMRequest) -> LLMResponse:
        builder = ResponseBuilder()
        started_at, t0 = time.time(), trio.current_time()
        error: BackendError | None = None
        try:
            async with aclosing(self.llm.stream(request)) as events:
                async for event in events:
                    builder.add(event)
        except BackendError as exc:
            error = exc
        response = builder.build()
        if self.rt.turnlog is not None:
            session = self.ctx.session
            entry = TurnLogEntry(
                folder=session.workspace,
                session_id=session.id,
                provider=self.llm.provider,
                model=self.llm.model,
                started_at=started_at,
                duration_s=trio.current_time() - t0,
                request=request,
                response=response,
                error=None if error is None else f"subagent: {error}",
            )
            await self.rt.turnlog.submit(entry)
        if error is not None:
            raise ToolError(f"the subagent's model call failed: {error}")
        return response

    async def _run_calls(self, calls: Sequence[ToolCallBlock]) -> list[ToolResultBlock]:
        results: list[ToolResultBlock | None] = [None] * len(calls)
        refusals = self.repeats.refusals([(c.name, c.arguments) for c in calls])

        async def one(i: int, call: ToolCallBlock) -> None:
            if (refusal := refusals[i]) is not None:
                results[i] = ToolResultBlock(call.id, call.name, refusal, Outcome.REPEATED)
                return
            tool = self.tools.get(call.name)
            child = replace(self.ctx, call_id=call.id, deadline=None)
            content, outcome = await run_tool(tool, call.name, call.arguments, child, known=self.tools)
            self.repeats.record(call.name, call.arguments, content, outcome)
            # Masked here: these results go to the model without passing the gateway.
            results[i] = ToolResultBlock(call.id, call.name, self.rt.mask(content), outcome)

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        return [r for r in results if r is not None]
