"""Local backend benchmark: LocalLLM.stream next to raw llama-cpp-python on the same prompt.

Run: .venv/bin/python bench/local_bench.py [--rounds R] [--max-tokens N]   (needs kesoku[local])

Both sides load the default SmolLM2 model with the same settings and get the same messages, greedy
decoding and max_tokens, so they generate the same tokens; the rounds alternate which side goes
first. Tokens/s is output tokens over the wall time of the whole call (prompt included; after the
first round llama.cpp reuses the cached prompt, so it is mostly generation). Prints medians over R
rounds. Targets: the backend >= 90% of raw tokens/s; a cancel stops the generation thread within 100
ms."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import aclosing
from typing import Any

import trio
from kesoku.llm.local import SYSTEM_PROMPT, LocalLLM
from kesoku.vocab.ir import LLMRequest, LLMTurn, TextBlock, TextDelta, ToolSpec, UsageEvent
from llama_cpp import Llama

from _util import median, report

STORY_SYSTEM = "You are a storyteller."
STORY = "Tell a long story about a cat."
QUESTION = "What is the capital of France?"
LONG_PROMPT = (
    "Please summarise these notes. "
    + "The meeting moved to Tuesday and the budget was approved. " * 130
)
TOOLS = (
    ToolSpec(
        "bash",
        "Run a shell command.",
        {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    ),
)


def request(system: str, text: str, tools: tuple[ToolSpec, ...] = ()) -> LLMRequest:
    return LLMRequest(system, (LLMTurn("user", (TextBlock(text),)),), tools)


def raw_round(llama: Any, max_tokens: int) -> tuple[float, float, int]:
    """One raw streamed completion; returns (seconds, seconds to first token, content chunks)."""
    messages = [{"role": "system", "content": STORY_SYSTEM}, {"role": "user", "content": STORY}]
    start = time.perf_counter()
    first = 0.0
    chunks = 0
    for chunk in llama.create_chat_completion(
        messages=messages, stream=True, max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.1
    ):
        if chunk["choices"][0]["delta"].get("content"):
            chunks += 1
            first = first or time.perf_counter() - start
    return time.perf_counter() - start, first, chunks


async def backend_round(llm: LocalLLM) -> tuple[float, float, int, int]:
    """One LocalLLM.stream call.

    Returns (seconds, seconds to first delta, deltas, output tokens).
    """
    start = time.perf_counter()
    first = 0.0
    deltas = tokens = 0
    async with aclosing(llm.stream(request(STORY_SYSTEM, STORY))) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                deltas += 1
                first = first or time.perf_counter() - start
            elif isinstance(event, UsageEvent):
                tokens = event.usage.output_tokens
    return time.perf_counter() - start, first, deltas, tokens


async def cancel_after_deltas(llm: LocalLLM, n: int) -> float:
    """Cancel a story after n deltas; returns seconds from the cancel to the thread's end."""
    seen = 0
    cancelled_at = 0.0
    with trio.CancelScope() as scope:
        async with aclosing(llm.stream(request(STORY_SYSTEM, STORY))) as events:
            async for event in events:
                seen += isinstance(event, TextDelta)
                if seen == n:
                    cancelled_at = time.perf_counter()
                    scope.cancel()
    assert llm.last_thread is not None
    assert not llm.last_thread.is_alive()
    return time.perf_counter() - cancelled_at


async def cancel_during_prompt(llm: LocalLLM, after_s: float) -> float:
    """Cancel while a ~1,500-token prompt is evaluated.

    Returns the seconds from the cancel to the thread's end.
    """
    deadline = trio.current_time() + after_s
    with trio.move_on_at(deadline):
        async with aclosing(llm.stream(request(SYSTEM_PROMPT, LONG_PROMPT))) as events:
            async for _ in events:
                raise AssertionError("the prompt was evaluated before the cancel: use a longer one")
    # The scope exits after the generation's shielded join, so this is the time to the thread's end.
    assert llm.last_thread is not None
    assert not llm.last_thread.is_alive()
    return trio.current_time() - deadline


async def timed(llm: LocalLLM, req: LLMRequest) -> tuple[float, int, int, str]:
    """One call; returns (seconds, input tokens, output tokens, what came back)."""
    start = time.perf_counter()
    response = await llm.generate(req)
    elapsed = time.perf_counter() - start
    what = response.text or ", ".join(f"{c.name}({c.arguments})" for c in response.tool_calls)
    return elapsed, response.usage.input_tokens, response.usage.output_tokens, what


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    llm = LocalLLM(max_tokens=args.max_tokens, system_prompt=STORY_SYSTEM)
    trio.run(llm.load)
    start = time.perf_counter()
    llama = Llama(model_path=str(llm.model_path), n_ctx=llm.n_ctx, verbose=False)
    raw_load_s = time.perf_counter() - start

    raw_rates, raw_firsts, rates, firsts, ratios = [], [], [], [], []
    raw_round(llama, args.max_tokens)  # warm-up: both sides evaluate and cache the prompt once
    trio.run(backend_round, llm)
    for r in range(args.rounds):
        order = ("raw", "backend") if r % 2 == 0 else ("backend", "raw")
        for side in order:
            if side == "raw":
                seconds, first, chunks = raw_round(llama, args.max_tokens)
                raw_rates.append(chunks / seconds)
                raw_firsts.append(first)
            else:
                seconds, first, _, tokens = trio.run(backend_round, llm)
                rates.append(tokens / seconds)
                firsts.append(first)
        ratios.append(rates[-1] / raw_rates[-1])

    cancels = [trio.run(cancel_after_deltas, llm, 5) for _ in range(args.rounds)]
    plain = LocalLLM(tools=True)  # tools mode for the requests that offer tools; others plain
    trio.run(plain.load)
    prompt_cancels = [trio.run(cancel_during_prompt, plain, 0.2) for _ in range(3)]
    plain_answer = trio.run(timed, plain, request("", QUESTION))
    tools_answer = trio.run(timed, plain, request("", QUESTION, TOOLS))
    tools_call = trio.run(timed, plain, request("", "Run the command 'date'.", TOOLS))

    print(
        f"local backend benchmark: {llm.model_path.name}, max_tokens {args.max_tokens},"
        f" {args.rounds} rounds, medians (Python {sys.version.split()[0]})"
    )
    report("model load (LocalLLM.load, in a worker thread)", llm.load_s or 0.0, "s")
    report("model load (raw Llama())", raw_load_s, "s")
    report("raw create_chat_completion(stream=True)", median(raw_rates), "tokens/s")
    report("LocalLLM.stream", median(rates), "tokens/s")
    report("  ratio to raw (median of per-round ratios)", median(ratios), "x", ">= 0.90")
    report("time to first token, raw", median(raw_firsts) * 1e3, "ms")
    report("time to first delta, LocalLLM.stream", median(firsts) * 1e3, "ms")
    report(
        "cancel mid-generation -> thread ended (median)", median(cancels) * 1e3, "ms", "<= 100 ms"
    )
    report("cancel mid-generation -> thread ended (max)", max(cancels) * 1e3, "ms", "<= 100 ms")
    report(
        "cancel during prompt evaluation -> thread ended (max)",
        max(prompt_cancels) * 1e3,
        "ms",
        "<= 100 ms",
    )
    for name, (seconds, tokens_in, tokens_out, what) in (
        ("plain mode, capital of France", plain_answer),
        ("tools mode, capital of France", tools_answer),
        ("tools mode, run 'date'", tools_call),
    ):
        report(f"{name} ({tokens_in} in, {tokens_out} out)", seconds, "s")
        print(f"{'':<4}-> {what!r}")


if __name__ == "__main__":
    main()
