"""The gemini backend's context caching: the real google-genai SDK against the wire-level fake."""

from __future__ import annotations

import logging
from typing import Any

import httpx2
import pytest
import trio
import trio.testing
from google.genai import types
from test_gemini import (
    LONG,
    MODEL,
    OK_EVENTS,
    SYSTEM_JSON,
    THINKING,
    TOOLS_JSON,
    Clock,
    collect,
    content_json,
    conversation,
    model,
    request,
    served,
    user,
)

from kesoku.llm.gemini import CACHE_PAUSE_S, CACHE_SLOTS, CACHE_TTL_S, cache_end
from kesoku.testing.fakes.gemini_api import GeminiFake
from kesoku.testing.fakes.gemini_replies import Reply, answer, error
from kesoku.testing.fakes.server import serve_app
from kesoku.vocab.ir import LLMTurn, ToolCallBlock, ToolResultBlock

# -- context caching -------------------------------------------------------------------------------


async def test_a_long_prefix_is_cached_reused_then_extended_and_the_old_cache_deleted() -> None:
    fake = GeminiFake([answer("a"), answer("b"), answer("c")])
    async with served(fake, context_caching_threshold=100) as llm:
        turns = conversation(1)  # q0 (long), a0, q1
        await collect(llm, request(*turns))
        (create,) = fake.cache_calls
        assert (create.method, create.path) == ("POST", "/v1/cachedContents")
        assert create.body == {
            "model": f"models/{MODEL}",
            "ttl": f"{CACHE_TTL_S}s",
            "contents": [content_json(t) for t in turns[:2]],
            "systemInstruction": SYSTEM_JSON,
            "tools": TOOLS_JSON,
        }
        assert fake.generate_calls[0].body == {
            "contents": [content_json(turns[2])],
            "cachedContent": "cachedContents/fake1",
            "generationConfig": THINKING,
        }
        # The next step repeats the prefix: the cache serves it, only the new turns are sent.
        turns += [model("a1"), user("q2")]
        await collect(llm, request(*turns))
        assert len(fake.cache_calls) == 1
        assert fake.generate_calls[1].body["cachedContent"] == "cachedContents/fake1"
        assert fake.generate_calls[1].body["contents"] == [content_json(t) for t in turns[2:]]
        # The uncached tail grows past the threshold: a cache of the longer prefix replaces the
        # first.
        turns += [model(f"a2 {LONG}"), user("q3")]
        await collect(llm, request(*turns))
        assert [r.method for r in fake.cache_calls] == ["POST", "POST", "DELETE"]
        assert fake.cache_calls[1].body["contents"] == [content_json(t) for t in turns[:-1]]
        assert fake.generate_calls[2].body["cachedContent"] == "cachedContents/fake2"
        assert fake.generate_calls[2].body["contents"] == [content_json(turns[-1])]
        assert fake.deleted == ["cachedContents/fake1"] and list(fake.caches) == [
            "cachedContents/fake2"
        ]
    # aclose() deletes the rest
    assert fake.deleted == [
        "cachedContents/fake1",
        "cachedContents/fake2",
    ]


async def test_a_changed_prefix_gets_a_new_cache_and_the_cache_count_is_bounded() -> None:
    fake = GeminiFake(handler=lambda body: answer("ok"))
    async with served(fake, context_caching_threshold=100) as llm:
        for i in range(CACHE_SLOTS + 1):
            await collect(llm, request(*conversation(1), system=f"You are assistant number {i}."))
        created = [r for r in fake.cache_calls if r.method == "POST"]
        assert [r.body["systemInstruction"]["parts"][0]["text"] for r in created] == [
            f"You are assistant number {i}." for i in range(CACHE_SLOTS + 1)
        ]
        assert [g.body["cachedContent"] for g in fake.generate_calls] == [
            f"cachedContents/fake{i + 1}" for i in range(CACHE_SLOTS + 1)
        ]
        # the least recently used, once a slot was needed
        assert fake.deleted == ["cachedContents/fake1"]
        assert len(fake.caches) == CACHE_SLOTS


async def test_below_the_threshold_nothing_is_cached() -> None:
    fake = GeminiFake([answer("ok")])
    async with served(fake, context_caching_threshold=10_000) as llm:
        await collect(llm, request(*conversation(3)))
    assert (
        fake.cache_calls == [] and fake.generate_calls[0].body["systemInstruction"] == SYSTEM_JSON
    )


async def test_a_failed_cache_creation_falls_back_uncached_and_pauses_caching(
    autojump_clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = GeminiFake(handler=lambda body: answer("ok"))
    too_small = "Cached content is too small. total_token_count=300, min_total_token_count=1024"
    fake.cache_failures.append(error(400, too_small))
    turns = conversation(1)
    async with served(fake, context_caching_threshold=100) as llm:
        with caplog.at_level(logging.WARNING, logger="kesoku.llm.gemini"):
            assert await collect(llm, request(*turns)) == OK_EVENTS
        assert (
            "creating a context cache failed" in caplog.text
            and "Cached content is too small" in caplog.text
        )
        body = fake.generate_calls[0].body
        assert (
            "cachedContent" not in body
            and body["systemInstruction"] == SYSTEM_JSON
            and len(body["contents"]) == 3
        )
        await collect(llm, request(*turns))  # paused: no second attempt right away
        assert len(fake.cache_calls) == 1
        await trio.sleep(CACHE_PAUSE_S)
        await collect(llm, request(*turns))
        assert (
            len(fake.cache_calls) == 2
            and fake.generate_calls[2].body["cachedContent"] == "cachedContents/fake1"
        )


async def test_an_expired_or_vanished_cache_is_not_used(autojump_clock: Clock) -> None:
    fake = GeminiFake(handler=lambda body: answer("ok"))
    turns = conversation(1)
    async with served(fake, context_caching_threshold=100) as llm:
        await collect(llm, request(*turns))
        await trio.sleep(CACHE_TTL_S - 30)  # inside the safety margin: a new cache is made
        await collect(llm, request(*turns))
        used = [g.body["cachedContent"] for g in fake.generate_calls]
        assert used == ["cachedContents/fake1", "cachedContents/fake2"]
        assert fake.deleted == ["cachedContents/fake1"]  # it still had 30 s to live on the server
        # The server lost the cache (it answers 403): the call is repeated uncached, the turn goes
        # on.
        fake.caches.clear()
        assert await collect(llm, request(*turns)) == OK_EVENTS
        third, fourth = fake.generate_calls[2:]
        assert (
            third.body["cachedContent"] == "cachedContents/fake2"
            and "cachedContent" not in fourth.body
        )
        assert fourth.body["systemInstruction"] == SYSTEM_JSON


# -- caches end on a complete turn, and abandoned ones are deleted --------------------------------


def step(call_id: str, result: str) -> list[LLMTurn]:
    """A tool-loop step: the model's call and its result."""
    return [
        model(ToolCallBlock(call_id, "shell", {"command": f"cat {call_id}"})),
        user(ToolResultBlock(call_id, "shell", result)),
    ]


async def test_a_cache_ends_before_the_users_message_and_serves_every_step_of_its_loop() -> None:
    fake = GeminiFake(handler=lambda body: answer("ok"))
    async with served(fake, context_caching_threshold=100) as llm:
        turns = conversation(1)  # q0 (long), a0, q1
        await collect(llm, request(*turns))
        # Each step of the loop q1 opened: the cache holds what came before q1, and the request
        # opens with q1 (a cache ending on the model's call would leave it only the results, which
        # the API refuses).
        for n in range(3):
            turns += step(f"call_{n}x", f"file {n}: {LONG}")
            await collect(llm, request(*turns))
        assert [r.method for r in fake.cache_calls] == ["POST"]
        assert len(fake.generate_calls) == 4  # none refused and repeated uncached
        for generate in fake.generate_calls:
            assert generate.body["cachedContent"] == "cachedContents/fake1"
            assert generate.body["contents"][0] == content_json(turns[2])
        # The loop's answer and the next message: a cache up to that message replaces the first.
        turns += [model(f"done {LONG}"), user("q2")]
        await collect(llm, request(*turns))
        create = fake.cache_calls[1]
        assert create.method == "POST" and len(create.body["contents"]) == len(turns) - 1
        assert fake.generate_calls[-1].body["contents"] == [content_json(turns[-1])]
        assert fake.deleted == ["cachedContents/fake1"]


async def test_a_cache_a_call_failed_through_is_deleted(caplog: pytest.LogCaptureFixture) -> None:
    refused = error(
        400, "Please ensure that function response turn comes immediately after a call."
    )

    def handler(body: dict[str, Any]) -> Reply:
        return refused if "cachedContent" in body else answer("ok")

    fake = GeminiFake(handler=handler)
    async with served(fake, context_caching_threshold=100) as llm:
        with caplog.at_level(logging.WARNING, logger="kesoku.llm.gemini"):
            assert await collect(llm, request(*conversation(1))) == OK_EVENTS
        assert "repeating it uncached" in caplog.text
        first, second = fake.generate_calls
        assert "cachedContent" in first.body and "cachedContent" not in second.body
        # Not used again: deleted once the uncached call succeeded, not left to its TTL.
        assert fake.deleted == ["cachedContents/fake1"] and fake.caches == {}


def test_the_cache_end_is_the_last_users_message() -> None:
    text, response = {"text": "q"}, {"function_response": {"name": "shell", "response": {}}}
    contents = [
        types.Content(role=r, parts=[types.Part.model_validate(p)])
        for r, p in [
            ("user", text),
            ("model", text),
            ("user", text),
            ("model", {"function_call": {"name": "shell", "args": {}}}),
            ("user", response),
        ]
    ]
    assert cache_end(contents) == 2
    assert cache_end(contents[:3]) == 2
    assert cache_end(contents[:2]) == 0 and cache_end(contents[:1]) == 0


async def test_the_fake_refuses_a_cached_request_that_opens_with_function_responses() -> None:
    fake = GeminiFake(handler=lambda body: answer("ok"))
    call_json = {"functionCall": {"name": "shell", "args": {"command": "ls"}}}
    result_json = {"functionResponse": {"name": "shell", "response": {"result": "a"}}}
    question = {"role": "user", "parts": [{"text": "list files"}]}
    calls = {"role": "model", "parts": [call_json]}
    results = {"role": "user", "parts": [result_json]}
    headers = {"x-goog-api-key": "test-key"}
    http = await trio.to_thread.run_sync(httpx2.AsyncClient)  # loads TLS certificates
    async with serve_app(fake.app) as url, http:
        # A cache may end on a call (its creation is accepted) ...
        cache = {"model": f"models/{MODEL}", "ttl": "600s", "contents": [question, calls]}
        created = await http.post(f"{url}/v1/cachedContents", json=cache, headers=headers)
        assert created.status_code == 200
        path = f"{url}/v1/models/{MODEL}:generateContent"
        through = {"cachedContent": created.json()["name"], "contents": [results]}
        refused = await http.post(path, json=through, headers=headers)
        # ... and contents that open with a function call are refused too, cached or not.
        opening = await http.post(path, json={"contents": [calls, results]}, headers=headers)
    assert refused.status_code == 400
    assert (
        "function response turn comes immediately after a function call turn"
        in (refused.json()["error"]["message"])
    )
    assert opening.status_code == 400
    assert (
        "function call turn comes immediately after a user turn"
        in (opening.json()["error"]["message"])
    )
