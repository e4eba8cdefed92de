"""A loopback fake of the Google Chat REST endpoints the adapter calls, recording every request.

- ``POST /v1/spaces/{space}/messages`` (spaces.messages.create): answers the message with a new name
  (``spaces/{space}/messages/m{n}``) and the thread it went to (``spaces/{space}/threads/{...}``):
  with ``messageReplyOption`` ``REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD`` (or
  ``REPLY_MESSAGE_OR_FAIL``) the thread of ``thread.name``, or of ``thread.threadKey`` (the first
  message with a key starts its thread); otherwise, or with neither, a new thread (the API's
  ``MESSAGE_REPLY_OPTION_UNSPECIFIED`` ignores the thread given);
- ``PUT /v1/spaces/{space}/messages/{message}?updateMask=...`` (spaces.messages.update, what the
  client's ``update_message`` calls; ``PATCH`` is spaces.messages.patch, the same): answers the
  message;
- ``POST /v1/spaces/{space}/messages/{message}/reactions`` (spaces.messages.reactions.create);
- ``GET /v1/media/{resourceName}?alt=media`` (media.download): the bytes of :attr:`ChatFake.media`,
  404 for an unknown resource, or :attr:`ChatFake.media_status` when set (403: no permission).

The official client (google-apps-chat, REST transport) sends JSON bodies with camelCase field names
and enums as integers (``$alt=json;enum-encoding=int``). Source: the Chat API REST reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fakes.server import Recorded, RequestLog


@dataclass
class ChatFake:
    """The fake's state: what it received, and what it serves."""

    log: RequestLog = field(default_factory=RequestLog)
    media: dict[str, bytes] = field(default_factory=dict)
    media_status: int | None = None
    media_gate: trio.Event | None = None
    """When set, media downloads wait for it (a download still running when the adapter stops)."""
    fail_next: list[int] = field(default_factory=list)
    """Statuses to answer the next requests with (a 503 to test retries), one each."""
    changed: trio.Event = field(default_factory=trio.Event)
    placed: dict[str, str] = field(default_factory=dict)
    """A created message's name → the thread it went to."""
    keyed: dict[tuple[str, str], str] = field(default_factory=dict)
    """(space, thread key) → the thread the key started."""
    _count: int = 0

    def created(self) -> list[Recorded]:
        """The messages.create requests, in order."""
        return [r for r in self.log.requests if r.method == "POST" and r.path.endswith("/messages")]

    def patched(self, name: str | None = None) -> list[Recorded]:
        """The messages.update/patch requests (of one message when named)."""
        return [
            r
            for r in self.log.requests
            if r.method in ("PUT", "PATCH") and (name is None or r.path == f"/v1/{name}")
        ]

    def reactions(self) -> list[Recorded]:
        return [r for r in self.log.requests if r.path.endswith("/reactions")]

    def in_thread(self, thread: str) -> list[str]:
        """The names of the messages created in a thread, in order."""
        return [name for name, where in self.placed.items() if where == thread]

    async def wait_for(self, predicate: Any, *, timeout_s: float = 20.0) -> None:
        """Wait until ``predicate()`` holds (checked after each request)."""
        with trio.fail_after(timeout_s):
            while not predicate():
                await self.changed.wait()

    def app(self) -> Starlette:
        async def record(request: Request) -> tuple[Recorded, Response | None]:
            rec = await self.log.record(request)
            self.changed.set()
            self.changed = trio.Event()
            if self.fail_next:
                status = self.fail_next.pop(0)
                return rec, JSONResponse(
                    {"error": {"code": status, "message": "fake failure"}}, status_code=status
                )
            return rec, None

        async def create(request: Request) -> Response:
            rec, failed = await record(request)
            if failed is not None:
                return failed
            space = request.path_params["space"]
            self._count += 1
            body = dict(rec.body or {})
            given = body.get("thread") or {}
            option = rec.query.get("messageReplyOption", "")
            replying = option in ("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD", "1")
            replying |= option in ("REPLY_MESSAGE_OR_FAIL", "2")
            new = f"spaces/{space}/threads/t{self._count}"
            key = given.get("threadKey", "") if replying else ""
            if replying and given.get("name"):
                thread = given["name"]
            elif key:
                thread = self.keyed.setdefault((space, key), new)
            else:
                thread = new
            name = f"spaces/{space}/messages/m{self._count}"
            self.placed[name] = thread
            answer = {"name": thread, **({"threadKey": key} if key else {})}
            body.update(name=name, thread=answer)
            return JSONResponse(body)

        async def patch(request: Request) -> Response:
            rec, failed = await record(request)
            if failed is not None:
                return failed
            body = dict(rec.body or {})
            body["name"] = (
                f"spaces/{request.path_params['space']}/messages/{request.path_params['message']}"
            )
            return JSONResponse(body)

        async def react(request: Request) -> Response:
            rec, failed = await record(request)
            if failed is not None:
                return failed
            parent = (
                f"spaces/{request.path_params['space']}/messages/{request.path_params['message']}"
            )
            return JSONResponse({"name": f"{parent}/reactions/r1", **(rec.body or {})})

        async def media(request: Request) -> Response:
            _, failed = await record(request)
            if failed is not None:
                return failed
            if self.media_gate is not None:
                await self.media_gate.wait()
            if self.media_status is not None:
                return JSONResponse(
                    {"error": {"code": self.media_status}}, status_code=self.media_status
                )
            data = self.media.get(request.path_params["resource"])
            if data is None:
                return JSONResponse({"error": {"code": 404}}, status_code=404)
            return Response(data, media_type="application/octet-stream")

        return Starlette(
            routes=[
                Route("/v1/spaces/{space}/messages", create, methods=["POST"]),
                Route("/v1/spaces/{space}/messages/{message}", patch, methods=["PUT", "PATCH"]),
                Route("/v1/spaces/{space}/messages/{message}/reactions", react, methods=["POST"]),
                Route("/v1/media/{resource:path}", media, methods=["GET"]),
            ]
        )
