"""The subagent tool: a child turn loop for a self-contained task.

The child gets the session's backend, the parent's tools minus ``subagent`` (no nesting), a system
prompt of its own and an in-memory history that starts with the task. It runs the turn's step loop
(:class:`~kesoku.agent.loop.StepLoop`: model call, the step's tool calls run concurrently, results,
again; cut replies run nothing; repeats are refused) until the model answers without tool calls,
``subagent.max_steps`` model calls are used, or it repeats a call it was told repeats. Nothing of
the child is written to the session log: only its conclusion comes back, as the ``subagent`` tool
result (each of its model calls is still logged to ``llm-turn-{idx}.log.yaml`` like any other). Its
system prompt and tool results are masked (:meth:`~kesoku.agent.runtime.Runtime.mask`) as the
gateway masks the session's messages.

Cancellation: the child runs inside the parent's tool batch, so it is cancelled with it (a forced
stop, the tool's ``timeout_s``); its running tools are cancelled and kill their process groups. A
first stop or a new user message lets it finish, like any running tool.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated

import msgspec
import trio

from kesoku.agent.loop import StepLoop
from kesoku.agent.prompt import build_system_prompt, read_notes
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.execute import run_tool
from kesoku.tools.schema import Check, tool_from_function
from kesoku.vocab.errors import BackendError, ToolError
from kesoku.vocab.ir import LLMBlock, LLMTurn, TextBlock, ToolCallBlock, ToolResultBlock, ToolSpec
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Outcome, Usage
from kesoku.vocab.spend import SpendKind

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.llm.base import BaseLLM
    from kesoku.vocab.ir import LLMRequest, LLMResponse

SUBAGENT_TIMEOUT_S = 1800.0
"""Longest run of one subagent call, its tools included."""
MAX_STEPS = 20
"""``subagent.max_steps``: model calls a subagent may make."""

PERSONA = (
    "You are a subagent of Kesoku. The main agent gave you one task; "
    "carry it out with your tools,\n"
    "checking your work, without asking anyone anything "
    "(nobody reads your intermediate messages). End with your\n"
    "conclusion: what you found or did, with the facts the main agent needs "
    "(paths, names, numbers, commands and\n"
    "their results), briefly. If you could not finish, say what is missing and why."
)

_Task = Annotated[
    str,
    Check(
        "`task` must be a non-empty string: the whole task, with what the subagent needs",
        str.strip,
    ),
]

DESCRIPTION = (
    "Hand a self-contained task to a subagent.\n"
    "It has your other tools and a fresh context, works alone and returns only its conclusion: "
    "for research or chores whose details would clutter this conversation. It cannot see this "
    "conversation: put all it needs in `task`."
)


def subagent_tool(
    rt: Runtime, *, max_steps: int = MAX_STEPS, timeout_s: float = SUBAGENT_TIMEOUT_S
) -> Tool:
    """The ``subagent`` tool of a runtime.

    Args:
        rt: The runtime: the session's backend, the tools (``subagent`` left out), the turn logs.
        max_steps: Model calls one subagent may make.
        timeout_s: Longest run of one subagent, its tools included.

    Returns:
        The tool.
    """

    async def subagent(ctx: ToolContext, task: _Task) -> str:
        """Hand a task to a subagent (``task``: complete, the subagent sees nothing else)."""
        tools = [t for t in rt.current_tools() if t.name != "subagent"]
        child = Subagent(rt, rt.llm_for(ctx.session), tools, ctx, max_steps=max_steps)
        return await child.run(task)

    return tool_from_function(subagent, description=DESCRIPTION, timeout_s=timeout_s)


class Subagent(StepLoop[ToolCallBlock]):
    """One child loop (the hooks of :class:`~kesoku.agent.loop.StepLoop` over an in-memory history).

    Args:
        rt: The runtime (turn logs).
        llm: The backend.
        tools: The tools it may call.
        ctx: The parent call's context: session, working directory, guard.
        max_steps: Model calls it may make.
    """

    log_prefix = "subagent: "

    def __init__(
        self, rt: Runtime, llm: BaseLLM, tools: Sequence[Tool], ctx: ToolContext, *, max_steps: int
    ) -> None:
        super().__init__(
            llm,
            ctx.session,
            rt.turnlog,
            max_identical_calls=rt.max_identical_calls,
            meter=rt.budget.meter(ctx.session, SpendKind.SUBAGENT),
        )
        self.rt = rt
        self.tools = {t.name: t for t in tools}
        self.ctx = ctx
        self.max_steps = max_steps
        self.turns: list[LLMTurn] = []
        """The child's history, in memory only."""
        self.conclusion = ""
        self._system = ""
        self._specs: list[ToolSpec] = []
        self._last_text = ""

    async def run(self, task: str) -> str:
        """Work on ``task`` until a conclusion or the step cap.

        Returns:
            The conclusion (the text of the last model answer), or a note saying the step cap was
            hit (or that it kept repeating a call) with the last text it wrote.

        Raises:
            ToolError: A model call failed (after the backend's retries).
        """
        cwd = self.ctx.cwd
        now = dt.datetime.now().astimezone()
        self._specs = [t.spec for t in self.tools.values()]
        notes = read_notes(cwd)
        system = build_system_prompt(
            persona=PERSONA,
            tools=list(self.tools.values()),
            skills=(),
            notes=notes,
            cwd=cwd,
            now=now,
        )
        self._system = self.rt.mask(system)  # as the turn's: AGENTS.md may hold a secret
        self.turns = [LLMTurn("user", (TextBlock(task),))]
        await self.run_steps()
        return self.conclusion

    # -- the step loop's hooks (kesoku.agent.loop) ------------------------------------------------

    async def _prepare(self) -> LLMRequest | TurnState:
        if self.model_calls >= self.max_steps:
            return await self._end(
                TurnState.STEP_LIMIT,
                f"[step limit] The subagent used its {self.max_steps} model calls "
                "(subagent.max_steps) without concluding.",
            )
        return await self.llm.request_from_turns(self.turns, system=self._system, tools=self._specs)

    async def _failed(self, error: BackendError, response: LLMResponse) -> TurnState | None:
        raise ToolError(f"the subagent's model call failed: {error}")

    async def _keep(self, response: LLMResponse) -> list[ToolCallBlock]:
        step = self.model_calls - 1
        calls = [
            c if c.id else msgspec.structs.replace(c, id=f"sub_{step}_{i}")
            for i, c in enumerate(response.tool_calls)
        ]
        if calls:
            self._last_text = response.text.strip() or self._last_text
            blocks: list[LLMBlock] = [*response.thought_blocks]
            if response.text.strip():
                blocks.append(TextBlock(response.text))
            blocks.extend(calls)
            self.turns.append(LLMTurn("assistant", tuple(blocks)))
        return calls

    async def _answered(self, response: LLMResponse, cut: str | None) -> TurnState:
        self.conclusion = (
            response.text.strip() or "(the subagent ended without writing a conclusion)"
        )
        if cut is not None:
            self.conclusion += f" [the conclusion was {cut}]"
        return TurnState.DONE

    async def _refuse(self, calls: Sequence[ToolCallBlock], notes: Sequence[str]) -> None:
        results = (
            ToolResultBlock(c.id, c.name, n, Outcome.TRUNCATED)
            for c, n in zip(calls, notes, strict=True)
        )
        self.turns.append(LLMTurn("user", tuple(results)))

    async def _repeating(self, name: str) -> TurnState:
        return await self._end(
            TurnState.REPEATING,
            f"[repeating] The subagent kept calling {name} with the same arguments "
            "after being told it repeats (agent.max_identical_calls), and was stopped.",
        )

    async def _end(self, state: TurnState, notice: str, usage: Usage | None = None) -> TurnState:
        self.conclusion = (
            f"{notice} Its last words: {self._last_text}" if self._last_text else notice
        )
        return state

    async def _run_batch(self, calls: Sequence[ToolCallBlock]) -> None:
        results: list[ToolResultBlock | None] = [None] * len(calls)
        refusals = self.repeats.refusals([(c.name, c.arguments) for c in calls])

        async def one(i: int, call: ToolCallBlock) -> None:
            if (refusal := refusals[i]) is not None:
                results[i] = ToolResultBlock(call.id, call.name, refusal, Outcome.REPEATED)
                return
            tool = self.tools.get(call.name)
            child = replace(self.ctx, call_id=call.id, deadline=None)
            content, outcome = await run_tool(
                tool, call.name, call.arguments, child, known=self.tools
            )
            self.repeats.record(call.name, call.arguments, content, outcome)
            # Masked here: these results go to the model without passing the gateway.
            results[i] = ToolResultBlock(call.id, call.name, self.rt.mask(content), outcome)

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        self.turns.append(LLMTurn("user", tuple(r for r in results if r is not None)))
