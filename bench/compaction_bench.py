"""Compaction benchmark: a long synthetic session, with and without compaction.

Run: .venv/bin/python bench/compaction_bench.py [--turns 500] [--window 32000]

Each turn: a user message (~60 words), one model step calling a tool whose result is ~1,500
characters, then a short answer; the model is scripted (it answers instantly), the store is a real
SQLite file. Printed for both runs: the largest request (estimated tokens, and as a fraction of the
window), the total input tokens sent over the session, and, with compaction, how many compactions ran
and the median / max time of one. Without compaction the requests simply grow past the window (a real
provider would refuse them): the figure shows what compaction saves.
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
from kesoku.compaction import CompactionPolicy, Compactor
from kesoku.compaction.tokens import estimate_request
from kesoku.events import TurnEnded
from kesoku.gateway import Gateway
from kesoku.llm.ir import LLMRequest, ToolResultBlock
from kesoku.model import user_text
from kesoku.runtime import Runtime
from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import Tool, ToolContext

from _util import median, report

WORDS = "please look at the build log and tell me which step failed and why it failed " * 4


def responder(request: LLMRequest) -> Mapping[str, Any]:
    """Call the tool once per turn, then answer."""
    last = request.turns[-1].blocks[-1]
    if isinstance(last, ToolResultBlock):
        return {"text": "The step `link` failed: a missing symbol in libfoo.", "usage": {"output_tokens": 20}}
    return {"tool_calls": [{"name": "fetch_log", "arguments": {"lines": 40}}], "usage": {"output_tokens": 12}}


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
            async with trio.open_nursery() as nursery:
                with rt.hub.subscribe() as events:
                    await nursery.start(rt.serve)
                    for i in range(turns):
                        await gateway.post(user_text(session.id, f"turn {i}: {WORDS}"))
                        async for event in events:
                            if isinstance(event, TurnEnded):
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
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--window", type=int, default=32_000)
    args = parser.parse_args(argv)
    limit = args.window * CompactionPolicy().threshold
    print(f"{args.turns} turns, window {args.window:,} tokens (threshold {limit:,.0f})")
    for enabled in (True, False):
        r = trio.run(functools.partial(run, args.turns, args.window, enabled=enabled))
        label = "with compaction" if enabled else "without compaction"
        report(f"{label}: largest request", r["largest"], "tokens", f"< {limit:,.0f}" if enabled else "")
        report(f"{label}: largest request / window", r["largest"] / args.window, "x")
        report(f"{label}: total input over {r['requests']:.0f} requests", r["total"] / 1e6, "M tokens")
        if enabled:
            report("compactions", r["compactions"], "")
            report("time per compaction, median", r["median_ms"], "ms")
            report("time per compaction, max", r["max_ms"], "ms")


if __name__ == "__main__":
    main(sys.argv[1:])
