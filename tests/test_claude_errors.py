"""The claude backend's usage accounting and errors, through the real anthropic SDK against the
wire-level fake.

What every backend does (retries, dropped and stalled streams, cancellation) is checked by the
backend contract, tests/test_backend_contract.py; here what is Claude's own.
"""

from __future__ import annotations

from llm_streams import events_of, events_until_error
from test_claude import Clock, claude, request, user

from kesoku.testing.fakes.anthropic_api import (
    AnthropicFake,
    Reply,
    Text,
    overloaded,
    text_reply,
    validate,
)
from kesoku.vocab.ir import TextDelta, ToolResultBlock, UsageEvent
from kesoku.vocab.model import Usage

# --- usage and errors -----------------------------------------------------------------------------


async def test_usage_counts_cache_reads_and_writes_as_input() -> None:
    fake = AnthropicFake()
    usage = {
        "input_tokens": 20,
        "cache_read_input_tokens": 3000,
        "cache_creation_input_tokens": 500,
        "output_tokens": 7,
    }
    fake.push(Reply([Text("hi")], usage=usage))
    async with claude(fake) as llm:
        events = await events_of(llm, request())
    assert events[-1] == UsageEvent(
        Usage(input_tokens=3520, output_tokens=7, cached_tokens=3000, cache_write_tokens=500)
    )


async def test_retries_run_out_with_a_one_line_error(autojump_clock: Clock) -> None:
    fake = AnthropicFake()
    fake.push(*[overloaded()] * 3)
    async with claude(fake, max_retries=2) as llm:
        _, error = await events_until_error(llm, request())
    assert str(error) == "claude: HTTP 529 overloaded_error: Overloaded"
    assert (error.status, error.retryable, error.auth) == (529, True, False) and llm.calls == 3


async def test_an_overloaded_error_event_in_the_stream_is_retried(autojump_clock: Clock) -> None:
    fake = AnthropicFake()
    fake.push(
        Reply([Text("x")], error_after=(2, "overloaded_error", "Overloaded")), text_reply("second")
    )
    async with claude(fake) as llm:
        events = await events_of(llm, request())
    assert events[0] == TextDelta("second") and llm.calls == 2


async def test_an_error_event_after_text_is_not_retried() -> None:
    fake = AnthropicFake()
    fake.push(Reply([Text("abc", chunks=3)], error_after=(4, "overloaded_error", "Overloaded")))
    async with claude(fake) as llm:
        seen, error = await events_until_error(llm, request())
    assert seen == [TextDelta("a")]
    assert str(error) == "claude: stream error overloaded_error: Overloaded" and error.retryable
    assert llm.calls == 1


async def test_stream_cut_after_events_is_not_retried() -> None:
    fake = AnthropicFake()
    fake.push(Reply([Text("partial answer", chunks=3)], cut_after=5), text_reply("never sent"))
    async with claude(fake) as llm:
        seen, error = await events_until_error(llm, request())
    assert seen == [TextDelta("parti"), TextDelta("al an")]
    assert error.retryable and "connection lost" in str(error)
    assert len(fake.log.requests) == 1


async def test_a_wrong_key_is_an_auth_error_never_retried() -> None:
    fake = AnthropicFake()
    async with claude(fake, api_key="sk-ant-wrong") as llm:
        _, error = await events_until_error(llm, request())
    assert str(error) == "claude: HTTP 401 authentication_error: invalid x-api-key"
    assert (error.status, error.auth, error.retryable) == (401, True, False) and llm.calls == 1


async def test_a_bad_request_is_final_and_names_the_api_message() -> None:
    fake = AnthropicFake()
    orphan = request(user(ToolResultBlock("toolu_x", "weather", "orphan")))  # no tool_use before it
    async with claude(fake) as llm:
        _, error = await events_until_error(llm, orphan)
    assert str(error).startswith(
        "claude: HTTP 400 invalid_request_error: messages.0.content.0: unexpected `tool_use_id`"
    )
    assert (error.status, error.retryable, error.auth) == (400, False, False) and llm.calls == 1


def test_the_fake_refuses_what_the_api_refuses() -> None:
    hi = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    call = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "n", "input": {}}],
    }
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
    }
    base = {"model": "m", "max_tokens": 2000}
    ok = base | {"messages": [hi, call, result]}
    assert validate(ok, vertex=False) is None
    text_then_result = {"role": "user", "content": [hi["content"][0], result["content"][0]]}
    unsigned = {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}
    five_breakpoints = {
        "role": "user",
        "content": [{"type": "text", "text": "x", "cache_control": {}}] * 5,
    }
    cases = {
        "max_tokens: Field required": {"model": "m", "messages": [hi]},
        'first message must use the "user" role': base | {"messages": [call, result]},
        'found multiple "user" roles in a row': base | {"messages": [hi, hi]},
        "`tool_use` ids were found without `tool_result`": base | {"messages": [hi, call, hi]},
        "tool_result blocks must come before": base | {"messages": [hi, call, text_then_result]},
        "non-whitespace text": base
        | {"messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]},
        "must have non-empty content": base | {"messages": [{"role": "user", "content": []}]},
        "thinking.signature: Field required": base | {"messages": [hi, unsigned, hi]},
        "greater than `thinking.budget_tokens`": ok
        | {"thinking": {"type": "enabled", "budget_tokens": 4096}},
        "must start with a thinking block": ok
        | {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        "A maximum of 4 blocks with cache_control": base | {"messages": [five_breakpoints]},
    }
    for expected, body in cases.items():
        problem = validate(body, vertex=False)
        assert problem is not None and expected in problem, (expected, problem)
