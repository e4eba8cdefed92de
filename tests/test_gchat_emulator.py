"""The Google Chat adapter against the real Pub/Sub emulator (where absent: skipped, saying why).

One emulator per test session; every test makes a fresh topic and subscription (a run killed
mid-way leaves the emulator a dead stream on its subscription, which would stall the next run's
events: see kesoku_gchat.pubsub._end_stream). Chat is the loopback fake; the model is scripted."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from google.cloud import pubsub_v1  # type: ignore[import-untyped]
from test_gchat_support import addon_event, gchat_running, message_event, start_emulator, texts

from kesoku.testing import ScriptedLLM

PROJECT = "kesoku-emulated"


@pytest.fixture(scope="session")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("pubsub-emulator") / "emulator.log"
    started = start_emulator(str(log))
    if isinstance(started, str):
        pytest.skip(started)
    process, host = started
    yield host
    _end(process)


def _end(process: subprocess.Popen[bytes]) -> None:
    """Stop the emulator this session started (own process group: gcloud starts java as a child)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture
def topic(emulator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str, str]]:
    """A fresh topic and subscription; yields the publisher, topic path and subscription path."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)
    name = uuid.uuid4().hex[:12]
    publisher = pubsub_v1.PublisherClient()
    subscriber = pubsub_v1.SubscriberClient()
    topic_path = publisher.topic_path(PROJECT, f"chat-{name}")
    subscription_path = subscriber.subscription_path(PROJECT, f"kesoku-{name}")
    publisher.create_topic(name=topic_path)
    subscriber.create_subscription(
        name=subscription_path, topic=topic_path, ack_deadline_seconds=10
    )
    yield publisher, topic_path, subscription_path
    subscriber.delete_subscription(subscription=subscription_path)
    publisher.delete_topic(topic=topic_path)
    subscriber.close()
    publisher.transport.close()


def _pending(subscription: str) -> int:
    """Messages the subscription would still deliver (a synchronous pull that acks nothing)."""
    with pubsub_v1.SubscriberClient() as client:
        response = client.pull(subscription=subscription, max_messages=10, timeout=3)
    return len(response.received_messages)


async def test_a_message_through_the_emulator_is_answered_once_and_acked(
    tmp_path: Path, topic: tuple[Any, str, str]
) -> None:
    publisher, topic_path, subscription = topic
    llm = ScriptedLLM([{"text": "Hello from **Kesoku**"}], loop=True)
    async with gchat_running(tmp_path, llm, subscription=subscription) as run:
        data = message_event("hello there")
        await trio.to_thread.run_sync(
            lambda: publisher.publish(topic_path, data).result(timeout=10)
        )
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 2)
        await run.until(lambda: len(run.chat.reactions()) == 1)
        # The same event again (Pub/Sub delivers at least once): dropped by its Chat message name.
        await trio.to_thread.run_sync(
            lambda: publisher.publish(topic_path, data).result(timeout=10)
        )
        await trio.sleep(1.0)
        (user,) = run.user_messages()
        assert user.external_id == "spaces/AAAA/messages/M1.M1" and user.content == "hello there"
        answers = [
            r for r in run.chat.created() if r.body["cardsV2"][0]["cardId"].startswith("answer")
        ]
        assert len(answers) == 1
        assert answers[0].body["cardsV2"][0]["card"]["sections"][0]["widgets"][0]["textParagraph"][
            "text"
        ] == ("Hello from **Kesoku**")
        assert len(run.chat.reactions()) == 1
        await run.stop()
    # Both deliveries were acked: nothing is left to deliver.
    assert await trio.to_thread.run_sync(_pending, subscription) == 0


async def publish(publisher: Any, topic_path: str, data: bytes) -> None:
    await trio.to_thread.run_sync(lambda: publisher.publish(topic_path, data).result(timeout=10))


RESTARTS = 3
"""Adapter restarts on one subscription. Before streams were ended cleanly, each left the emulator a
dead stream taking its share of new events: after the third, an event got through at once one time
in four, and two events per round all got through about once in 600 runs."""


async def test_events_after_adapter_restarts_are_stored_at_once_not_after_the_stream_deadline(
    tmp_path: Path, topic: tuple[Any, str, str]
) -> None:
    publisher, topic_path, subscription = topic
    llm = ScriptedLLM([{"text": "ok"}], loop=True)
    async with gchat_running(tmp_path, llm, subscription=subscription, reaction=None) as run:
        names: list[str] = []
        for restart in range(RESTARTS + 1):
            if restart:
                await run.stop()
                await run.start()
            for i in range(2):
                names.append(f"spaces/AAAA/messages/R{restart}-{i}.R{restart}-{i}")
                await publish(publisher, topic_path, message_event("again", name=names[-1]))
            # An event pushed to a dead stream came back only after the 60 s stream ack deadline,
            # far past the harness's 20 s wait.
            await run.until(lambda: {m.external_id for m in run.user_messages()} == set(names))
        await run.stop()
    assert await trio.to_thread.run_sync(_pending, subscription) == 0


async def test_a_workspace_addon_message_through_the_emulator_is_answered(
    tmp_path: Path, topic: tuple[Any, str, str]
) -> None:
    publisher, topic_path, subscription = topic
    llm = ScriptedLLM([{"text": "Hello from the add-on"}], loop=True)
    async with gchat_running(tmp_path, llm, subscription=subscription, reaction=None) as run:
        await publish(publisher, topic_path, addon_event("hello as an add-on"))
        await run.chat.wait_for(
            lambda: any(
                "Hello from the add-on" in t for r in run.chat.created() for t in texts(r.body)
            )
        )
        (user,) = run.user_messages()
        assert (user.external_id, user.content) == (
            "spaces/AAAA/messages/M1.M1",
            "hello as an add-on",
        )
        assert user.sender == "Ana"
        assert run.chat.in_thread("spaces/AAAA/threads/T1")
        await run.stop()
    assert await trio.to_thread.run_sync(_pending, subscription) == 0
