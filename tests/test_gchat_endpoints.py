"""The Google Chat adapter's daemon entry with every Google endpoint on this machine.

``[gchat] chat_api_endpoint`` and ``iam_endpoint`` name the loopback Chat fake (which is also the
IAM Credentials API); Pub/Sub is the in-process fake, or the real emulator where it runs, through
``PUBSUB_EMULATOR_HOST`` (the client library's own switch). The app's credentials are key-less
impersonation from a user's ADC file made here. Nothing is mocked and nothing leaves the machine.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes.chat_api import ChatFake
from fakes.server import serve_app
from kesoku_gchat.adapter import serve
from kesoku_gchat.chat_api import CHAT_BOT_SCOPE
from kesoku_gchat.pubsub import PUBSUB_SCOPE
from runtime_harness import serve_runtime
from test_gchat_auth import no_ambient_credentials, user_adc_file
from test_gchat_emulator import emulator, topic
from test_gchat_support import SUBSCRIPTION, FakePubSub, message_event, texts

from kesoku.config.settings import Config, GChatConfig
from kesoku.host.adapters import AdapterContext
from kesoku.testing import ScriptedLLM

# Fixtures of those modules, used here by name (no_ambient_credentials is autouse).
__all__ = ["emulator", "no_ambient_credentials", "topic"]

ACCOUNT = "kesoku-bot@p.iam.gserviceaccount.com"
ANSWER = "Hello from Kesoku"


async def answered_through_the_entry(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    subscription: str,
    publish: Callable[[bytes], Awaitable[None]],
) -> ChatFake:
    """Run the daemon's entry on ``[gchat]`` endpoints pointing at the fake; one message in.

    Returns the fake once the answer reached it.
    """
    chat = ChatFake(source_tokens={"user-token"})
    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(user_adc_file(tmp_path, token="user-token"))
    )
    llm = ScriptedLLM([{"text": ANSWER}], loop=True)
    async with serve_app(chat.app()) as base_url, serve_runtime(tmp_path, llm) as h:
        gchat = GChatConfig(
            enabled=True,
            subscription=subscription,
            impersonate_service_account=ACCOUNT,
            chat_api_endpoint=f"{base_url}/",  # the trailing slash is not doubled
            iam_endpoint=base_url,
        )
        entry = functools.partial(serve, AdapterContext.of(h.rt), Config(gchat=gchat))
        async with trio.open_nursery() as nursery:
            await nursery.start(entry)
            await publish(message_event("hello there"))
            await chat.wait_for(
                lambda: any(ANSWER in t for r in chat.created() for t in texts(r.body))
            )
            nursery.cancel_scope.cancel()
    return chat


def assert_impersonated(chat: ChatFake) -> None:
    """Every Chat call carried a token the IAM fake minted for the account, for the app's scopes."""
    assert chat.iam_requests(), "no token was asked of the IAM endpoint"
    for iam in chat.iam_requests():
        assert iam.path == f"/v1/projects/-/serviceAccounts/{ACCOUNT}:generateAccessToken"
        assert iam.headers["authorization"] == "Bearer user-token"
        assert iam.body["scope"] == [CHAT_BOT_SCOPE, PUBSUB_SCOPE]
    calls = [r for r in chat.log.requests if r.path.startswith("/v1/spaces/")]
    assert calls and all(r.path.startswith("/v1/spaces/AAAA/messages") for r in calls)
    bearers = {r.headers.get("authorization", "").removeprefix("Bearer ") for r in calls}
    assert bearers <= set(chat.account_tokens), bearers
    assert set(chat.account_tokens.values()) == {ACCOUNT}


async def test_the_entry_reaches_chat_and_iam_at_their_configured_endpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pubsub: FakePubSub
) -> None:
    async def publish(data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        pubsub.publish(data)

    chat = await answered_through_the_entry(tmp_path, monkeypatch, SUBSCRIPTION, publish)
    assert_impersonated(chat)
    assert await trio.to_thread.run_sync(pubsub.wait, lambda: pubsub.acked)


async def test_the_entry_pulls_from_the_real_emulator_named_by_pubsub_emulator_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic: tuple[Any, str, str]
) -> None:
    publisher, topic_path, subscription = topic  # the fixture set PUBSUB_EMULATOR_HOST

    async def publish(data: bytes) -> None:
        await trio.to_thread.run_sync(
            lambda: publisher.publish(topic_path, data).result(timeout=10)
        )

    chat = await answered_through_the_entry(tmp_path, monkeypatch, subscription, publish)
    assert_impersonated(chat)
