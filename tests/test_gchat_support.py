"""Pub/Sub peers for the Google Chat tests (no tests here): in-process gRPC fake, real emulator.

The fake serves the three Subscriber RPCs the streaming pull uses — ``StreamingPull`` (bidi),
``Acknowledge`` and ``ModifyAckDeadline`` (acks and lease changes go as unary calls in
google-cloud-pubsub 2.x; a deadline of 0 is a nack) — through grpc generic handlers over the
proto-plus types the library ships, so the real ``SubscriberClient`` talks to it unchanged. It runs
on gRPC's own threads; tests reach it from trio through worker threads or its thread-safe methods.

The emulator is the one the development and CI machines have (``gcloud beta emulators pubsub`` ships
it as a jar): one per test session, fresh topic and subscription names per test.
"""

from __future__ import annotations

import copy
import functools
import glob
import itertools
import json
import shutil
import socket
import subprocess
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent import futures
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import trio
from fakes.chat_api import ChatFake
from fakes.server import serve_app
from google.auth.credentials import AnonymousCredentials
from google.pubsub_v1.types import (
    AcknowledgeRequest,
    ModifyAckDeadlineRequest,
    PubsubMessage,
    ReceivedMessage,
    StreamingPullRequest,
    StreamingPullResponse,
)
from kesoku_gchat.adapter import GChatAdapter
from kesoku_gchat.chat_api import ChatApi
from kesoku_gchat.pubsub import Puller, default_subscriber
from runtime_harness import Harness, serve_runtime

from kesoku.config.settings import Config, GChatConfig
from kesoku.host.adapters import AdapterContext
from kesoku.llm.base import BaseLLM
from kesoku.observe.spend import Budget
from kesoku.tools.base import Tool
from kesoku.tools.paths import PathGates
from kesoku.vocab.model import Message

EMULATOR_JARS = (
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/lib/cloud-pubsub-emulator-*-all.jar"
)
EMULATOR_START_S = 30.0
"""The emulator's port opens in about 1 s here; a loaded CI machine gets much longer."""


@dataclass
class FakePubSub:
    """A Subscriber service with one queue: publish, and see what was acked and nacked."""

    ready: deque[tuple[str, bytes]] = field(default_factory=deque)
    outstanding: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    acked: list[str] = field(default_factory=list)
    """Message ids, in ack order."""
    nacked: list[str] = field(default_factory=list)
    deliveries: list[str] = field(default_factory=list)
    """Message ids, once per delivery (a redelivery repeats an id)."""
    cond: threading.Condition = field(default_factory=threading.Condition)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def publish(self, data: bytes) -> str:
        with self.cond:
            message_id = str(next(self._ids))
            self.ready.append((message_id, data))
            self.cond.notify_all()
            return message_id

    def wait(self, predicate: object, timeout_s: float = 20.0) -> bool:
        """Block (in a worker thread) until ``predicate()`` holds."""
        assert callable(predicate)
        with self.cond:
            return bool(self.cond.wait_for(predicate, timeout=timeout_s))

    # -- the RPCs -------------------------------------------------------------------------------

    def streaming_pull(
        self, requests: Iterator[StreamingPullRequest], context: grpc.ServicerContext
    ) -> Iterator[StreamingPullResponse]:
        next(requests)  # the opening request names the subscription
        mine: set[str] = set()
        ended: list[bool] = []

        def drain() -> None:
            # Later requests (heartbeats) must be read, or the client's stream stalls; their end
            # (the client half-closed the stream to stop) ends the stream, as Pub/Sub does.
            _drain(requests)
            with self.cond:
                ended.append(True)
                self.cond.notify_all()

        threading.Thread(target=drain, daemon=True).start()

        def lease_lost() -> None:
            # The stream ended (the subscriber closed): what it held unacked is delivered again, as
            # Pub/Sub does once the ack deadline passes.
            with self.cond:
                ended.append(True)
                for ack_id in mine:
                    found = self.outstanding.pop(ack_id, None)
                    if found is not None:
                        self.ready.append(found)
                self.cond.notify_all()

        context.add_callback(lease_lost)
        while context.is_active() and not ended:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.ready) or bool(ended), timeout=0.2)
                batch = []
                while self.ready and not ended:
                    message_id, data = self.ready.popleft()
                    ack_id = f"ack-{message_id}-{uuid.uuid4().hex[:6]}"
                    self.outstanding[ack_id] = (message_id, data)
                    mine.add(ack_id)
                    self.deliveries.append(message_id)
                    batch.append(
                        ReceivedMessage(
                            ack_id=ack_id, message=PubsubMessage(data=data, message_id=message_id)
                        )
                    )
                if batch:
                    self.cond.notify_all()  # a test may wait for a delivery
            if batch:
                yield StreamingPullResponse(received_messages=batch)

    def acknowledge(self, request: AcknowledgeRequest, context: grpc.ServicerContext) -> bytes:
        with self.cond:
            for ack_id in request.ack_ids:
                found = self.outstanding.pop(ack_id, None)
                if found is not None:
                    self.acked.append(found[0])
            self.cond.notify_all()
        return b""

    def modify_ack_deadline(
        self, request: ModifyAckDeadlineRequest, context: grpc.ServicerContext
    ) -> bytes:
        if request.ack_deadline_seconds == 0:  # a nack: deliver again
            with self.cond:
                for ack_id in request.ack_ids:
                    found = self.outstanding.pop(ack_id, None)
                    if found is not None:
                        self.nacked.append(found[0])
                        self.ready.append(found)
                self.cond.notify_all()
        return b""

    def handler(self) -> grpc.GenericRpcHandler:
        def empty(_: bytes) -> bytes:
            return b""  # google.protobuf.Empty serializes to no bytes

        return grpc.method_handlers_generic_handler(
            "google.pubsub.v1.Subscriber",
            {
                "StreamingPull": grpc.stream_stream_rpc_method_handler(
                    self.streaming_pull,
                    request_deserializer=StreamingPullRequest.deserialize,
                    response_serializer=StreamingPullResponse.serialize,
                ),
                "Acknowledge": grpc.unary_unary_rpc_method_handler(
                    self.acknowledge,
                    request_deserializer=AcknowledgeRequest.deserialize,
                    response_serializer=empty,
                ),
                "ModifyAckDeadline": grpc.unary_unary_rpc_method_handler(
                    self.modify_ack_deadline,
                    request_deserializer=ModifyAckDeadlineRequest.deserialize,
                    response_serializer=empty,
                ),
            },
        )


def _drain(requests: Iterator[StreamingPullRequest]) -> None:
    """Read a stream's later requests until it ends (a cancelled stream raises: it ended)."""
    try:
        for _ in requests:
            pass
    except Exception:  # grpc ends the iterator of a cancelled RPC with an error of its own
        return


def start_fake() -> tuple[FakePubSub, grpc.Server, str]:
    """Serve a :class:`FakePubSub` on a loopback port; returns it, its server and ``host:port``."""
    fake = FakePubSub()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((fake.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return fake, server, f"127.0.0.1:{port}"


# -- the real emulator ----------------------------------------------------------------------------


def emulator_command(port: int) -> list[str] | None:
    """How to start the emulator here, or None when it is not installed."""
    jars = sorted(glob.glob(EMULATOR_JARS))
    java = shutil.which("java")
    if jars and java:
        return [java, "-jar", jars[-1], "--host=127.0.0.1", f"--port={port}"]
    gcloud = shutil.which("gcloud")
    if gcloud:
        return [gcloud, "beta", "emulators", "pubsub", "start", f"--host-port=127.0.0.1:{port}"]
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_emulator(log_path: str) -> tuple[subprocess.Popen[bytes], str] | str:
    """Start the emulator; returns the process and ``host:port``, or why it cannot run."""
    port = free_port()
    command = emulator_command(port)
    if command is None:
        return "the Pub/Sub emulator is not installed (no emulator jar with java, no gcloud)"
    with open(log_path, "wb") as log:
        # A session of its own: the tests end the whole group (gcloud runs java as a child).
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    ready = threading.Event()
    deadline = EMULATOR_START_S
    while deadline > 0:
        if process.poll() is not None:
            return (
                f"the Pub/Sub emulator exited at start (code {process.returncode}); see {log_path}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process, f"127.0.0.1:{port}"
        except OSError:
            ready.wait(0.2)
            deadline -= 0.2
    process.kill()
    return f"the Pub/Sub emulator did not open its port within {EMULATOR_START_S:g} s"


# -- events and a running adapter -----------------------------------------------------------------

DATA = Path(__file__).parent / "data" / "gchat"
SUBSCRIPTION = "projects/kesoku-test/subscriptions/chat"


def event(kind: str = "message", **changes: Any) -> dict[str, Any]:
    """A Chat event from tests/data/gchat (``message`` or ``card_clicked``);
    ``changes`` go into ``message``."""
    raw: dict[str, Any] = copy.deepcopy(json.loads((DATA / f"{kind}.json").read_text()))
    raw["message"].update(changes)
    return raw


def message_event(text: str, *, name: str = "spaces/AAAA/messages/M1.M1", **changes: Any) -> bytes:
    """A MESSAGE event as Pub/Sub carries it (UTF-8 JSON)."""
    return json.dumps(
        event(name=name, text=f"@Kesoku {text}", argumentText=f" {text}", **changes)
    ).encode()


def addon_event(text: str, *, name: str = "spaces/AAAA/messages/M1.M1", **changes: Any) -> bytes:
    """The MESSAGE of :func:`message_event` in the Google Workspace add-on format (UTF-8 JSON)."""
    classic = json.loads(message_event(text, name=name, **changes))
    return json.dumps(
        {
            "commonEventObject": {"hostApp": "CHAT", "platform": "WEB"},
            "authorizationEventObject": {"systemIdToken": "a.b.c"},
            "chat": {
                "user": classic["user"],
                "eventTime": classic["eventTime"],
                "messagePayload": {"space": classic["space"], "message": classic["message"]},
            },
        }
    ).encode()


def texts(body: dict[str, object]) -> list[str]:
    """The text paragraphs of a recorded message body, in order."""
    out = []
    for card in body.get("cardsV2", []):  # type: ignore[attr-defined]
        for section in card["card"]["sections"]:
            out += [w["textParagraph"]["text"] for w in section["widgets"] if "textParagraph" in w]
    return out


def click_event(function: str, **parameters: str) -> bytes:
    """A CARD_CLICKED event of a button with ``function`` and ``parameters``."""
    raw = event("card_clicked")
    raw["common"] = {"invokedFunction": function, "parameters": parameters}
    raw["action"] = {
        "actionMethodName": function,
        "parameters": [{"key": k, "value": v} for k, v in parameters.items()],
    }
    return json.dumps(raw).encode()


@dataclass
class GChatRun:
    """A runtime, the Chat fake and a running adapter."""

    h: Harness
    chat: ChatFake
    base_url: str
    gchat: GChatConfig
    nursery: trio.Nursery
    subscription: str
    card_interval_s: float
    adapter: GChatAdapter | None = None
    scope: trio.CancelScope | None = None

    async def start(self) -> GChatAdapter:
        """Start (or restart) the adapter over the same runtime and fakes."""
        app = AnonymousCredentials()  # type: ignore[no-untyped-call]
        user = app if self.gchat.reaction_emoji else None  # anonymous: one will do for both
        api = await ChatApi.connect(app, endpoint=self.base_url, user=user)
        puller = Puller(self.subscription, default_subscriber(None))
        adapter = GChatAdapter(
            AdapterContext.of(self.h.rt),
            self.gchat,
            api,
            puller,
            card_interval_s=self.card_interval_s,
        )

        async def run(
            task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as inner:
                    await inner.start(adapter.serve)
                    task_status.started(scope)

        self.scope = await self.nursery.start(run)
        self.adapter = adapter
        return adapter

    async def stop(self) -> None:
        assert self.scope is not None
        self.scope.cancel()
        await trio.sleep(0.2)  # let the pull stream close

    def user_messages(self) -> list[Message]:
        return (
            [m for m in self.h.store.history(self.session_id()) if m.role == "user"]
            if self.sessions()
            else []
        )

    def sessions(self) -> list[Any]:
        return self.h.store.list_sessions(adapter=self.gchat.chatbot_id)

    def session_id(self) -> str:
        (session,) = self.sessions()
        return str(session.id)

    async def until(self, predicate: Callable[[], object], *, timeout_s: float = 20.0) -> None:
        """Poll ``predicate`` (store state) until it holds."""
        with trio.fail_after(timeout_s):
            while not predicate():  # noqa: ASYNC110 -- the store has no event to wait on
                await trio.sleep(0.02)


@asynccontextmanager
async def gchat_running(
    tmp_path: Path,
    llm: BaseLLM,
    *,
    subscription: str = SUBSCRIPTION,
    tools: Sequence[Tool] = (),
    reaction: str | None = "👀",
    card_interval_s: float = 0.05,
    gates: PathGates | None = None,
    **gchat_options: Any,
) -> AsyncIterator[GChatRun]:
    """A served runtime, the Chat fake on loopback, and the adapter pulling ``subscription``.

    The caller points the Pub/Sub client at a peer (``PUBSUB_EMULATOR_HOST``) first. ``gates`` are
    the runtime's path gates (default: only the database protected, nothing shared);
    ``gchat_options`` more of ``[gchat]`` (its spend caps apply, as in the daemon).
    """
    chat = ChatFake()
    gchat = GChatConfig(
        enabled=True, subscription=subscription, reaction_emoji=reaction, **gchat_options
    )
    budget = functools.partial(Budget.from_config, Config(gchat=gchat))
    async with (
        serve_app(chat.app()) as base_url,
        serve_runtime(tmp_path, llm, tools=tools, gates=gates, budget=budget) as h,
        trio.open_nursery() as nursery,
    ):
        run = GChatRun(h, chat, base_url, gchat, nursery, subscription, card_interval_s)
        await run.start()
        yield run
        nursery.cancel_scope.cancel()
