"""Compaction benchmark: a long synthetic session, with and without compaction.

Run: .venv/bin/python bench/compaction_bench.py [--turns 500] [--window 32000]

Each turn: a user message (~60 words), one model step calling a tool whose result is ~1,500
characters, then a short answer; the model is scripted (it answers instantly), the store is a real
SQLite file. Printed for both runs: the largest request (estimated tokens, and as a fraction of the
window), the total input tokens sent over the session, and, with compaction, how many compactions
ran and the median / max time of one. Without compaction the requests grow until one would not fit
the window; such a turn is not sent (it fails with a notice), and the run counts those turns.

Then one long turn at a small window (``--steps``, ``--small-window``): the model calls a tool whose
result is as large as the window's share allows, step after step, then answers; printed: whether the
turn answered, the largest request as a fraction of the window, and the compactions it took (stage 5
shortens the turn's own older results).
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio
from kesoku.agent.compaction.compactor import CompactionPolicy, Compactor
from kesoku.agent.compaction.tokens import estimate_request
from kesoku.agent.runtime import Runtime
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool, ToolContext
from kesoku.vocab.events import TurnEnded
from kesoku.vocab.ir import LLMRequest, ToolResultBlock
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import user_text

from _util import median, report

WORDS = "please look at the build log and tell me which step failed and why it failed " * 4


def responder(request: LLMRequest) -> Mapping[str, Any]:
    """Call the tool once per turn, then answer."""
    last = request.turns[-1].blocks[-1]
    if isinstance(last, ToolResultBlock):
        return {
            "text": "The step `link` failed: a missing symbol in libfoo.",
            "usage": {"output_tokens": 20},
        }
    return {
        "tool_calls": [{"name": "fetch_log", "arguments": {"lines": 40}}],
        "usage": {"output_tokens": 12},
    }


async def fetch_log(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
    await trio.lowlevel.checkpoint()
    return "\n".join(f"[{i:03d}] step {i}: compiling module_{i}.c ... ok" for i in range(36))


async def run(turns: int, window: int, *, enabled: bool) -> dict[str, float]:
    timings: list[float] = []
    original = Compactor.compact

    async def timed(self: Compactor, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(self, *args, **kwargs)
        finally:
            timings.append(time.perf_counter() - started)

    Compactor.compact = timed  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "kesoku.db")
            gateway = Gateway(store, Path(tmp) / "sessions")
            llm = ScriptedLLM(responder=responder)
            policy = CompactionPolicy(enabled=enabled, windows=(("scripted", window),))
            tool = Tool("fetch_log", "Fetch the build log.", fetch_log)
            rt = Runtime(gateway, llm, tools=[tool], compaction=policy, worker_idle_s=3600)
            session = gateway.open_session("terminal", "bench")
            refused = 0
            async with trio.open_nursery() as nursery:
                with rt.hub.subscribe() as events:
                    await nursery.start(rt.serve)
                    for i in range(turns):
                        await gateway.post(user_text(session.id, f"turn {i}: {WORDS}"))
                        async for event in events:
                            if isinstance(event, TurnEnded):
                                refused += event.metrics.state is TurnState.FAILED
                                break
                nursery.cancel_scope.cancel()
            store.close()
    finally:
        Compactor.compact = original  # type: ignore[method-assign]
    sizes = [estimate_request(r) for r in llm.requests]
    return {
        "requests": len(sizes),
        "largest": max(sizes),
        "total": sum(sizes),
        "compactions": len(timings),
        "median_ms": median(timings) * 1000 if timings else 0.0,
        "max_ms": max(timings) * 1000 if timings else 0.0,
        "refused": refused,
    }


async def long_turn(steps: int, window: int) -> dict[str, float]:
    """One turn of ``steps`` tool calls, each result as large as the window's share allows."""

    def step(request: LLMRequest) -> Mapping[str, Any]:
        done = sum(isinstance(b, ToolResultBlock) for t in request.turns for b in t.blocks)
        if done < steps:
            return {
                "tool_calls": [{"name": "dump", "arguments": {"n": done}}],
                "usage": {"output_tokens": 12},
            }
        return {"text": f"read {done} outputs", "usage": {"output_tokens": 8}}

    async def dump(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        await trio.lowlevel.checkpoint()
        lines = "\n".join(f"{i:06d} some output of step {arguments.get('n')}" for i in range(4000))
        return lines  # ~150 KB: the turn's cap (a share of the window) keeps its head and tail

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "kesoku.db")
        gateway = Gateway(store, Path(tmp) / "sessions")
        llm = ScriptedLLM(responder=step, context_window=window)
        rt = Runtime(
            gateway, llm, tools=[Tool("dump", "Dump some output.", dump)], worker_idle_s=3600
        )
        session = gateway.open_session("terminal", "bench")
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            with rt.hub.subscribe() as events:
                await nursery.start(rt.serve)
                await gateway.post(user_text(session.id, "dump them all"))
                async for event in events:
                    if isinstance(event, TurnEnded):
                        state = event.metrics.state
                        break
            nursery.cancel_scope.cancel()
        views = len(store.view_states(session.id))
        store.close()
    sizes = [estimate_request(r) for r in llm.requests]
    return {
        "answered": state is TurnState.DONE,
        "requests": len(sizes),
        "largest": max(sizes),
        "seconds": time.perf_counter() - started,
        "views": views,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=32_000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--small-window", type=int, default=7000)
    args = parser.parse_args(argv)
    limit = args.window * CompactionPolicy().threshold
    print(f"{args.turns} turns, window {args.window:,} tokens (threshold {limit:,.0f})")
    for enabled in (True, False):
        r = trio.run(functools.partial(run, args.turns, args.window, enabled=enabled))
        label = "with compaction" if enabled else "without compaction"
        report(
            f"{label}: largest request",
            r["largest"],
            "tokens",
            f"< {limit:,.0f}" if enabled else "",
        )
        report(f"{label}: largest request / window", r["largest"] / args.window, "x")
        report(
            f"{label}: total input over {r['requests']:.0f} requests", r["total"] / 1e6, "M tokens"
        )
        if enabled:
            report("compactions", r["compactions"], "")
            report("time per compaction, median", r["median_ms"], "ms")
            report("time per compaction, max", r["max_ms"], "ms")
        else:
            report("without compaction: turns not sent (over the window)", r["refused"], "")
    print(f"one turn of {args.steps} steps, window {args.small_window:,} tokens")
    t = trio.run(long_turn, args.steps, args.small_window)
    report("long turn: answered", 1.0 if t["answered"] else 0.0, "(1 = yes)")
    report("long turn: largest request / window", t["largest"] / args.small_window, "x")
    report("long turn: compactions stored", t["views"], "")
    report(f"long turn: wall time for {t['requests']:.0f} requests", t["seconds"], "s")


if __name__ == "__main__":
    main(sys.argv[1:])
