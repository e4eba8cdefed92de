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

For key-less impersonation (``[gchat] impersonate_service_account``) it also stands in for the IAM
Service Account Credentials API, so one loopback URL is Chat and IAM at once:

- ``POST /v1/projects/-/serviceAccounts/{account}:generateAccessToken``: answers
  ``{"accessToken", "expireTime"}`` to a bearer of one of :attr:`ChatFake.source_tokens` (the
  source credentials' tokens), 401 otherwise. Source: the IAM Credentials REST reference
  (projects.serviceAccounts.generateAccessToken).

The official client (google-apps-chat, REST transport) sends JSON bodies with camelCase field names
and enums as integers (``$alt=json;enum-encoding=int``). Source: the Chat API REST reference."""

from __future__ import annotations

import time
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
    unavailable: set[str] = field(default_factory=set)
    """Spaces (``spaces/…``) whose every request is answered 503 until removed."""
    unavailable_answers: list[str] = field(default_factory=list)
    """The space of each 503 answered for :attr:`unavailable`, in order."""
    changed: trio.Event = field(default_factory=trio.Event)
    placed: dict[str, str] = field(default_factory=dict)
    """A created message's name → the thread it went to."""
    keyed: dict[tuple[str, str], str] = field(default_factory=dict)
    """(space, thread key) → the thread the key started."""
    source_tokens: set[str] = field(default_factory=set)
    """Bearer tokens ``generateAccessToken`` accepts (those of the impersonating credentials)."""
    account_tokens: dict[str, str] = field(default_factory=dict)
    """Tokens ``generateAccessToken`` issued → the service account each stands for."""
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

    def iam_requests(self) -> list[Recorded]:
        """The ``generateAccessToken`` requests, in order."""
        return [r for r in self.log.requests if r.path.endswith(":generateAccessToken")]

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
            space = f"spaces/{request.path_params.get('space')}"
            if space in self.unavailable:
                self.unavailable_answers.append(space)
                return rec, JSONResponse(
                    {"error": {"code": 503, "message": "fake outage"}}, status_code=503
                )
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

        async def generate_access_token(request: Request) -> Response:
            rec = await self.log.record(request)
            bearer = rec.headers.get("authorization", "").removeprefix("Bearer ")
            if bearer not in self.source_tokens:
                error = {"code": 401, "status": "UNAUTHENTICATED", "message": "no valid token"}
                return JSONResponse({"error": error}, status_code=401)
            issued = f"account-token-{len(self.account_tokens) + 1}"
            self.account_tokens[issued] = request.path_params["account"]
            expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
            return JSONResponse({"accessToken": issued, "expireTime": expires})

        return Starlette(
            routes=[
                Route(
                    "/v1/projects/-/serviceAccounts/{account}:generateAccessToken",
                    generate_access_token,
                    methods=["POST"],
                ),
                Route("/v1/spaces/{space}/messages", create, methods=["POST"]),
                Route("/v1/spaces/{space}/messages/{message}", patch, methods=["PUT", "PATCH"]),
                Route("/v1/spaces/{space}/messages/{message}/reactions", react, methods=["POST"]),
                Route("/v1/media/{resource:path}", media, methods=["GET"]),
            ]
        )
