"""Random interleavings of messages, interruptions, stops, forced stops, crashes and restarts.

Whatever happens, every request the model receives satisfies the transcript invariant, no worker
crashes, and once the runtime is quiet the log itself is whole: every user message reached a final
status and every tool call has exactly one result.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_harness import close_store

from kesoku.agent.runtime import Runtime
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.ir import LLMRequest
from kesoku.vocab.model import Kind, Metadata, Role, Status, in_turn, user_text
from kesoku.vocab.transcript import check_turns

OPS = st.lists(
    st.tuples(
        st.sampled_from(["say", "say", "say", "stop", "force", "restart", "crash"]),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=12,
)


class Model:
    """A scripted model that checks every request and answers at random (seeded)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.requests = 0
        self.violations: list[list[str]] = []
        self.crashes = 0  # workers that raised (a TranscriptError from the base's check lands here)

    def respond(self, request: LLMRequest) -> Mapping[str, Any]:
        self.requests += 1
        problems = check_turns(request.turns)
        if problems:
            self.violations.append(problems)
        roll = self.rng.random()
        delay = self.rng.choice([0, 1, 5])
        if roll < 0.45:
            n = self.rng.randint(1, 3)
            calls = [
                {"name": "sleep", "arguments": {"seconds": self.rng.choice([0, 3, 20])}}
                for _ in range(n)
            ]
            return {"thought": "tools", "tool_calls": calls, "delay_s": delay}
        if roll < 0.55:
            return {"error": {"message": "overloaded", "retryable": self.rng.random() < 0.5}}
        return {"text": ["part one ", "part two"], "delay_s": delay}


async def sleep_tool(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
    await trio.sleep(float(arguments.get("seconds", 0)))
    return "slept"


async def scenario(folder: Path, ops: list[tuple[str, int]], seed: int) -> Model:
    model = Model(seed)
    db, sessions = folder / "kesoku.db", folder / "sessions"
    tools = [Tool("sleep", "Sleep.", sleep_tool, timeout_s=30)]

    def make() -> tuple[Runtime, Store]:
        store = Store(db)
        llm = ScriptedLLM(responder=model.respond, record_requests=False, max_retries=1)
        # One process writes here: the cross-process poll only costs wake-ups under the virtual
        # clock.
        gateway = Gateway(store, sessions, poll_interval_s=60)
        return Runtime(gateway, llm, tools=tools, max_steps_per_turn=4, worker_idle_s=30), store

    rt, store = make()
    session = rt.gateway.open_session("terminal", "prop")
    async with trio.open_nursery() as outer:
        scope, gone = trio.CancelScope(), trio.Event()

        async def serve(rt: Runtime, scope: trio.CancelScope, gone: trio.Event) -> None:
            with scope:
                await rt.serve()
            gone.set()

        outer.start_soon(serve, rt, scope, gone)
        for n, (op, gap_s) in enumerate(ops):
            await trio.sleep(gap_s)
            if op == "say":
                await rt.gateway.post(user_text(session.id, f"message {n}"))
            elif op in ("stop", "force"):
                rt.gateway.stop(session.id, force=op == "force")
            else:
                scope.cancel()  # the process goes away (gracefully: shielded tools finish)
                await gone.wait()
                # what a kill -9 mid-tool leaves: a call without result in an open turn
                if op == "crash":
                    open_roots = [
                        m for m in store.history(session.id) if m.status is Status.PROCESSING
                    ]
                    if open_roots:
                        meta = Metadata(tool_name="sleep", tool_arguments={})
                        call = in_turn(
                            open_roots[-1], Role.ASSISTANT, Kind.TOOL_CALL, "sleep()", metadata=meta
                        )
                        store.insert_messages([call])
                await close_store(store)
                model.crashes += rt.dispatcher.crashes
                rt, store = make()
                scope, gone = trio.CancelScope(), trio.Event()
                outer.start_soon(serve, rt, scope, gone)
        # virtual time: wait until every turn has ended (a hang guard of 100 min)
        for _ in range(100):
            await trio.sleep(60)
            history = store.history(session.id)
            if all(
                m.status not in (Status.PENDING, Status.PROCESSING)
                for m in history
                if m.role is Role.USER
            ):
                break
        assert [
            m
            for m in history
            if m.role is Role.USER and m.status in (Status.PENDING, Status.PROCESSING)
        ] == []
        calls = [m.id for m in history if m.kind is Kind.TOOL_CALL]
        answered = Counter(m.parent_id for m in history if m.kind is Kind.TOOL_RESULT)
        assert all(answered[c] == 1 for c in calls), answered
        assert set(answered) <= set(calls)
        model.crashes += rt.dispatcher.crashes
        outer.cancel_scope.cancel()
    await close_store(store)
    return model


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, st.integers(0, 2**32 - 1))
def test_every_request_is_valid_under_any_interleaving(
    ops: list[tuple[str, int]], seed: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = trio.run(
            scenario, Path(tmp), ops, seed, clock=trio.testing.MockClock(autojump_threshold=0)
        )
    assert model.violations == []
    assert model.crashes == 0
    if any(op == "say" for op, _ in ops):
        assert model.requests > 0
