"""The backend contract (kesoku.testing.backends) over every first-party backend.

Each backend talks to its provider's wire-level fake (kesoku.testing.fakes) through the real SDK,
or, for the scripted backend, replays the same replies as steps. One test per backend and rule, so
a broken rule names itself in the test id as well as in its message.
"""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
import trio.testing

from kesoku.llm.claude import ClaudeLLM
from kesoku.llm.gemini import GeminiLLM
from kesoku.llm.openai import OpenAILLM
from kesoku.testing import ScriptedLLM, Step
from kesoku.testing.backends import (
    CONTRACT_RULES,
    Answer,
    ContractFake,
    Failure,
    Reply,
    check_backend_contract,
    scripted_step,
)
from kesoku.testing.fakes import anthropic_api, gemini_api, gemini_replies, openai_api
from kesoku.testing.fakes.server import serve_app
from kesoku.vocab.ir import LLMRequest

# openai 3.57 stops reading at `data: [DONE]` without closing its inner async generators; trio
# closes them at garbage collection and warns, which filterwarnings=error would turn into a failure.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator '(openai|httpx2|httpcore2)\.[\w.]+' "
    r"was garbage collected:ResourceWarning"
)


@asynccontextmanager
async def claude() -> AsyncIterator[ContractFake]:
    fake = anthropic_api.AnthropicFake()
    async with fake.serve() as url:
        llm = ClaudeLLM(
            model="claude-haiku-4-5", api_key=fake.api_key, base_url=url, thinking_level="minimal"
        )
        await llm.connect()  # the client is built before the test's clock runs
        try:
            yield ContractFake(
                llm,
                play=lambda reply: fake.push(anthropic_api.contract_reply(reply)),
                requests=lambda: len(fake.log.requests),
            )
        finally:
            await llm.aclose()


@asynccontextmanager
async def openai() -> AsyncIterator[ContractFake]:
    fake = openai_api.OpenAIFake()
    async with fake.serve() as url:
        llm = OpenAILLM(model="gpt-5-mini", api_key=fake.api_key, base_url=url)
        await llm.client()
        try:
            yield ContractFake(
                llm,
                play=lambda reply: fake.push(openai_api.contract_reply(reply)),
                requests=lambda: len(fake.log.requests),
            )
        finally:
            await llm.aclose()


@asynccontextmanager
async def gemini() -> AsyncIterator[ContractFake]:
    fake = gemini_api.GeminiFake()
    async with serve_app(fake.app) as url:
        llm = GeminiLLM(
            api_key="test-key", base_url=url, timeout_s=30, context_caching_threshold=None
        )
        await llm.connect()
        try:
            yield ContractFake(
                llm,
                play=lambda reply: fake.push(gemini_replies.contract_reply(reply)),
                requests=lambda: len(fake.generate_calls),
            )
        finally:
            await llm.aclose()


@asynccontextmanager
async def scripted() -> AsyncIterator[ContractFake]:
    steps: deque[Step] = deque()

    def next_step(request: LLMRequest) -> Step:
        return steps.popleft()

    llm = ScriptedLLM(responder=next_step)
    yield ContractFake(
        llm,
        play=lambda reply: steps.append(scripted_step(reply)),
        requests=lambda: len(llm.requests),
    )


BACKENDS: dict[str, Callable[[], AbstractAsyncContextManager[ContractFake]]] = {
    "claude": claude,
    "openai": openai,
    "gemini": gemini,
    "scripted": scripted,
}
LOCAL_SKIP = pytest.mark.skip(
    reason="local runs SmolLM2 in-process: no server to script, so failures, retries, stalls and "
    "exact replies cannot be played (tests/test_local.py checks streaming, usage, stop reasons "
    "and cancellation with the real model)"
)
# Closing a stream early leaves the SDKs' HTTP body iterators to the garbage collector (httpx2's
# ResponseStream does not close httpcore2's PoolByteStream; google-genai never closes its iterator
# after an error event); the rule collects them itself, so the warning surfaces in this test only.
EARLY_CLOSE = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning"
)


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(rule, marks=EARLY_CLOSE) if "cancelling" in rule else rule
        for rule in CONTRACT_RULES
    ],
)
@pytest.mark.parametrize("backend", [*BACKENDS, pytest.param("local", marks=LOCAL_SKIP)])
async def test_the_backend_keeps_the_contract(
    backend: str, rule: str, autojump_clock: trio.testing.MockClock
) -> None:
    await check_backend_contract(BACKENDS[backend], rules=[rule])


# -- the check itself -----------------------------------------------------------------------------


async def test_all_rules_run_by_default_and_a_broken_rule_is_named(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await check_backend_contract(scripted)

    @asynccontextmanager
    async def sdk_retries_too() -> AsyncIterator[ContractFake]:
        """A backend whose SDK retries a 5xx itself: the fake sees more requests than calls."""
        async with scripted() as fake:

            def play(reply: Reply) -> None:
                if isinstance(reply, Failure):
                    fake.play(reply)  # the SDK's own retry, answered by the same failure
                fake.play(reply)

            yield ContractFake(fake.llm, play=play, requests=fake.requests)

    with pytest.raises(AssertionError) as info:
        await check_backend_contract(sdk_retries_too, rules=["HTTP 500 is retried"])
    assert str(info.value).startswith("scripted: HTTP 500 is retried: expected 3 model calls")


async def test_a_backend_that_swallows_a_drop_is_caught(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @asynccontextmanager
    async def ends_quietly() -> AsyncIterator[ContractFake]:
        """Plays a dropped connection as a clean end: the content arrives, then no error."""
        async with scripted() as fake:

            def play(reply: Reply) -> None:
                if isinstance(reply, Answer) and reply.cut_after is not None:
                    reply = Answer(reply.text[: reply.cut_after])
                fake.play(reply)

            yield ContractFake(fake.llm, play=play, requests=fake.requests)

    with pytest.raises(
        AssertionError, match="a drop after content is not retried: no BackendError"
    ):
        await check_backend_contract(ends_quietly, rules=["a drop after content is not retried"])


async def test_a_broken_rule_behind_a_served_fake_is_a_plain_assertion_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @asynccontextmanager
    async def no_retry_after() -> AsyncIterator[ContractFake]:
        """Claude's fake, losing the retry-after header: the backend retries after its backoff."""
        async with claude() as fake:

            def play(reply: Reply) -> None:
                if isinstance(reply, Failure):
                    reply = Failure(reply.status, reply.message)
                fake.play(reply)

            yield ContractFake(fake.llm, play=play, requests=fake.requests)

    with pytest.raises(AssertionError, match=r"^claude: rate limits wait for retry-after: retried"):
        await check_backend_contract(no_retry_after, rules=["rate limits wait for retry-after"])


async def test_it_needs_the_autojump_clock() -> None:
    with pytest.raises(RuntimeError, match="autojump_clock"):
        await check_backend_contract(scripted)


def test_importing_kesoku_testing_stays_light() -> None:
    heavy = ("anthropic", "openai", "google", "starlette", "hypercorn", "httpx2", "apsw")
    code = (
        "import sys, kesoku.testing, kesoku.testing.backends, kesoku.testing.fakes; "
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
