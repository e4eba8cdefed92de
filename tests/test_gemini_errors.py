"""The gemini backend's errors and retries,
through the real google-genai SDK against the wire-level fake.

What every backend does (retries, dropped and stalled streams, cancellation) is checked by the
backend contract, tests/test_backend_contract.py; here what is Gemini's own.
"""

from __future__ import annotations

import gc

import httpx2
import pytest
import trio
import trio.testing
from test_gemini import Clock, collect, fails, request, served, user

from kesoku.llm.gemini import GeminiLLM
from kesoku.testing.fakes.gemini_api import GeminiFake
from kesoku.testing.fakes.gemini_replies import answer, chunk, error, reply, text
from kesoku.vocab.ir import TextDelta

# -- errors and retries ----------------------------------------------------------------------------


async def test_rate_limits_and_server_errors_are_retried_honouring_retry_after(
    autojump_clock: Clock,
) -> None:
    fake = GeminiFake(
        [
            error(429, "Resource has been exhausted (e.g. check quota).", retry_after="7"),
            error(429, "Quota exceeded.", retry_delay="12s"),
            error(503, "The model is overloaded. Please try again later."),
            error(500, "An internal error has occurred."),
            answer("finally"),
        ]
    )
    async with served(fake) as llm:
        start = trio.current_time()
        events = await collect(llm, request(user("hi")))
        assert (
            events[0] == TextDelta("finally") and llm.calls == 5 and len(fake.generate_calls) == 5
        )
        assert trio.current_time() - start >= 7 + 12


async def test_retries_run_out(autojump_clock: Clock) -> None:
    fake = GeminiFake(handler=lambda body: error(503, "The model is overloaded."))
    async with served(fake, max_retries=2) as llm:
        _, err = await fails(llm, request(user("hi")))
    assert len(fake.generate_calls) == 3 and err.retryable and err.status == 503
    assert str(err) == "gemini: HTTP 503 UNAVAILABLE: The model is overloaded."


async def test_a_400_naming_an_invalid_key_is_an_auth_error_not_retried() -> None:
    # 401, 403 and a plain 400: the backend contract (tests/test_backend_contract.py).
    failure = error(
        400, "API key not valid. Please pass a valid API key.", reason="API_KEY_INVALID"
    )
    fake = GeminiFake([failure, answer("never")])
    async with served(fake) as llm:
        _, err = await fails(llm, request(user("hi")))
    assert (err.auth, err.retryable, err.status) == (True, False, failure.status)
    assert failure.body is not None and failure.body["error"]["message"] in str(err)
    assert len(fake.generate_calls) == 1


async def test_a_wrong_api_key_is_an_auth_error() -> None:
    fake = GeminiFake([answer("never")])
    async with served(fake, api_key="wrong") as llm:
        _, err = await fails(llm, request(user("hi")))
    assert err.auth and not err.retryable and "API key not valid" in str(err)


async def test_a_stream_cut_before_any_event_is_retried_and_after_events_is_not(
    autojump_clock: Clock,
) -> None:
    fake = GeminiFake(
        [
            reply(chunk(text("lost")), cut_after=0),
            reply(chunk(text("Hel")), chunk(text("lo")), chunk(finish="STOP")),
            reply(chunk(text("Par")), chunk(text("tial")), chunk(finish="STOP"), cut_after=1),
        ]
    )
    async with served(fake) as llm:
        assert await collect(llm, request(user("hi"))) == [TextDelta("Hel"), TextDelta("lo")]
        assert llm.calls == 2
        events, err = await fails(llm, request(user("hi")))
    assert events == [TextDelta("Par")] and err.retryable and "RemoteProtocolError" in str(err)
    assert llm.calls == 3 and len(fake.generate_calls) == 3


# google-genai raises an error event from inside its `async for` over the HTTP response and never
# closes that iterator: trio finalises it when it is collected, with a ResourceWarning. The
# collection is forced inside this test so it cannot surface in another one.
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)
async def test_an_error_event_mid_stream_is_raised_not_retried() -> None:
    overloaded = {
        "error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}
    }
    fake = GeminiFake([reply(chunk(text("Hi")), overloaded)])
    async with served(fake) as llm:
        events, err = await fails(llm, request(user("hi")))
        assert (
            events == [TextDelta("Hi")] and err.status == 503 and err.retryable and llm.calls == 1
        )
        del err
        gc.collect()
        for _ in range(10):  # let trio's finaliser tasks run
            await trio.lowlevel.checkpoint()


def test_transport_and_sdk_errors_map_to_backend_errors() -> None:
    llm = GeminiLLM(api_key="k")
    request_ = httpx2.Request("POST", "https://example.invalid")
    cut = llm._map_error(httpx2.RemoteProtocolError("peer closed connection", request=request_))
    timeout = llm._map_error(httpx2.ReadTimeout("timed out", request=request_))
    refused = llm._map_error(httpx2.ConnectError("connection refused", request=request_))
    assert cut.retryable and timeout.retryable and refused.retryable
    assert str(refused) == "gemini: connection failed: ConnectError: connection refused"
    other = llm._map_error(ValueError("unsupported\nvalue"))
    assert not other.retryable and str(other) == "gemini: ValueError: unsupported value"
