"""The openai backend's errors and retries: the real openai SDK against the wire-level fake.

What every backend does (retries, dropped and stalled streams, cancellation) is checked by the
backend contract, tests/test_backend_contract.py; here what is OpenAI's own.
"""

from __future__ import annotations

import email.utils
import time

import pytest
import trio
import trio.testing
from llm_streams import events_of, events_until_error
from test_openai import Clock, openai, request, user

# the same filter: openai's unclosed inner generators
from test_openai import (
    pytestmark as pytestmark,
)

from kesoku.testing.fakes.openai_api import (
    ErrorReply,
    OpenAIFake,
    Reply,
    rate_limited,
    server_error,
    text_reply,
)
from kesoku.vocab.ir import TextDelta, ToolResultBlock

# --- errors and retries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "value", "wait_s"),
    # retry-after in seconds: the backend contract (tests/test_backend_contract.py)
    [("retry-after-ms", "2500", 2.5), ("retry-after", "date", 28.0)],
    ids=["ms", "http-date"],
)
async def test_rate_limits_are_retried_after_retry_after(
    header: str, value: str, wait_s: float, autojump_clock: Clock
) -> None:
    if value == "date":
        # whole seconds, and wall time passes
        value = email.utils.formatdate(time.time() + 31, usegmt=True)
    fake = OpenAIFake()
    fake.push(rate_limited(value, header), text_reply("after the wait"))
    async with openai(fake) as llm:
        t0 = trio.current_time()
        events = await events_of(llm, request())
        waited = trio.current_time() - t0
    assert events[0] == TextDelta("after the wait")
    assert len(fake.log.requests) == 2 and wait_s <= waited < 40


async def test_retries_run_out_with_a_one_line_error(autojump_clock: Clock) -> None:
    fake = OpenAIFake()
    fake.push(*[server_error(503)] * 3)
    async with openai(fake, max_retries=2) as llm:
        _, error = await events_until_error(llm, request())
    assert str(error) == (
        "openai: HTTP 503 server_error: The engine is currently overloaded, please try again later."
    )
    assert (error.status, error.retryable, error.auth) == (503, True, False) and llm.calls == 3


async def test_a_wrong_key_is_an_auth_error_never_retried() -> None:
    # A 403 (and a 401 whatever its cause): the backend contract (tests/test_backend_contract.py).
    fake = OpenAIFake()
    fake.push(ErrorReply(401, "You are not allowed to use this model.", "invalid_request_error"))
    async with openai(fake, api_key="sk-wrong") as llm:
        _, error = await events_until_error(llm, request())
    assert str(error).startswith(
        "openai: HTTP 401 invalid_request_error: Incorrect API key provided: sk-wrong."
    )
    assert (error.status, error.auth, error.retryable) == (401, True, False) and llm.calls == 1


async def test_a_bad_request_is_final_and_quotes_the_server_in_one_line() -> None:
    fake = OpenAIFake()
    orphan = request(user(ToolResultBlock("call_x", "weather", "orphan")))  # no call before it
    fake.push(
        ErrorReply(
            404, "The model `gpt-9`\ndoes not exist.", "invalid_request_error", "model_not_found"
        )
    )
    async with openai(fake) as llm:
        _, error = await events_until_error(llm, orphan)
        _, missing = await events_until_error(llm, request())
    assert str(error) == (
        "openai: HTTP 400 invalid_request_error: Invalid parameter: messages with role 'tool' must "
        "be a response to a preceeding message with 'tool_calls'."
    )
    assert (
        str(missing) == "openai: HTTP 404 invalid_request_error: The model `gpt-9` does not exist."
    )
    assert not error.retryable and not missing.retryable and llm.calls == 2


async def test_an_error_event_in_the_stream_is_retried_when_it_names_a_server_error(
    autojump_clock: Clock,
) -> None:
    fake = OpenAIFake()
    fake.push(
        Reply(
            "x", error_after=(1, "server_error", "The server had an error processing your request.")
        ),
        text_reply("second"),
        Reply("x", error_after=(1, "invalid_request_error", "Invalid prompt: flagged.")),
    )
    async with openai(fake) as llm:
        events = await events_of(llm, request())
        _, error = await events_until_error(llm, request())
    assert events[0] == TextDelta("second") and len(fake.log.requests) == 3
    assert str(error) == "openai: stream error invalid_request_error: Invalid prompt: flagged."
    assert not error.retryable


async def test_a_stream_cut_is_retried_before_any_event_but_not_after(
    autojump_clock: Clock,
) -> None:
    fake = OpenAIFake()
    # cut after the opening role chunk
    fake.push(Reply("lost", cut_after=1), text_reply("second try"))
    fake.push(Reply("partial answer", chunks=3, cut_after=3), text_reply("never sent"))
    async with openai(fake) as llm:
        events = await events_of(llm, request())
        assert events[0] == TextDelta("second try") and llm.calls == 2
        seen, error = await events_until_error(llm, request())
    assert seen == [TextDelta("parti"), TextDelta("al an")]
    assert error.retryable and str(error).startswith("openai: connection lost")
    assert len(fake.log.requests) == 3 and llm.calls == 3


async def test_a_stalled_stream_is_retried(autojump_clock: Clock) -> None:
    fake = OpenAIFake()
    fake.push(Reply("slow", delay=(1, 600.0)), text_reply("fresh"))
    async with openai(fake, timeout_s=60, stall_timeout_s=30) as llm:
        t0 = trio.current_time()
        events = await events_of(llm, request())
        waited = trio.current_time() - t0
    assert events[0] == TextDelta("fresh") and llm.calls == 2
    assert 30 <= waited < 60
