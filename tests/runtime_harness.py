"""A runtime over a real SQLite file with the scripted model, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from kesoku.agent.runtime import Runtime
from kesoku.config.redact import Redactor
from kesoku.gateway import POLL_INTERVAL_S, Gateway
from kesoku.llm.base import BaseLLM
from kesoku.observe.spend import Budget
from kesoku.store import Store
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.events import Subscription, TurnEnded
from kesoku.vocab.metrics import TurnMetrics
from kesoku.vocab.model import Message, Session, user_text


def sleeper(name: str = "sleep", *, timeout_s: float = 600.0, log: list[str] | None = None) -> Tool:
    """A tool that sleeps ``seconds`` (virtual time under autojump_clock) and says so."""

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        seconds = float(arguments.get("seconds", 0))
        if log is not None:
            log.append(f"start {ctx.call_id}")
        await trio.sleep(seconds)
        if log is not None:
            log.append(f"end {ctx.call_id}")
        return f"slept {seconds:g} s"

    return Tool(name, "Sleep for a while.\nArguments: seconds.", run, timeout_s=timeout_s)


def echo() -> Tool:
    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        await trio.lowlevel.checkpoint()
        return str(arguments.get("text", ""))

    return Tool("echo", "Repeat the text.", run)


class Harness:
    """A served runtime and helpers to talk to it."""

    def __init__(self, rt: Runtime, session: Session, events: Subscription) -> None:
        self.rt = rt
        self.gateway = rt.gateway
        self.store = rt.gateway.store
        self.session = session
        self.events = events

    async def say(self, text: str, session: Session | None = None) -> Message:
        return await self.gateway.post(user_text((session or self.session).id, text))

    async def turn_end(self) -> TurnMetrics:
        """Wait for the next TurnEnded event."""
        async for event in self.events:
            if isinstance(event, TurnEnded):
                return event.metrics
        raise AssertionError("event stream closed")

    def history(self, session: Session | None = None) -> list[Message]:
        return self.store.history((session or self.session).id)


async def close_store(store: Store) -> None:
    """Close ``store`` in a worker thread, as the daemon does after its event loop has ended.

    The close waits for the checkpoint thread's fsync, which a loaded disk holds for seconds (the
    blocking detector saw 0.5–2 s): not a wait for the event loop's thread.
    """
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(store.close)


@asynccontextmanager
async def serve_runtime(
    tmp: Path,
    llm: BaseLLM | Callable[[Session], BaseLLM],
    *,
    tools: Sequence[Tool] = (),
    redactor: Redactor | None = None,
    budget: Callable[[Store], Budget] | None = None,
    poll_interval_s: float = POLL_INTERVAL_S,
    **kwargs: Any,
) -> AsyncIterator[Harness]:
    store = Store(tmp / "kesoku.db")
    gateway = Gateway(store, tmp / "sessions", redactor=redactor, poll_interval_s=poll_interval_s)
    if budget is not None:
        kwargs["budget"] = budget(store)
    rt = Runtime(gateway, llm, tools=tools, **kwargs)
    session = gateway.open_session("terminal", "chan-1")
    try:
        async with trio.open_nursery() as nursery:
            with rt.hub.subscribe() as events:
                await nursery.start(rt.serve)
                yield Harness(rt, session, events)
                nursery.cancel_scope.cancel()
    finally:
        await close_store(store)
