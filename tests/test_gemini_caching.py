"""The gemini backend's context caching: the real google-genai SDK against the wire-level fake."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
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

from kesoku.llm.gemini import CACHE_PAUSE_S, CACHE_SLOTS, CACHE_TTL_S
from kesoku.testing.fakes.gemini_api import GeminiFake
from kesoku.testing.fakes.gemini_replies import answer, error

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
