"""Serve a Starlette app on 127.0.0.1:<free port> in the test's trio run (hypercorn's trio worker).

Every fake records the requests it received (method, path, query, headers, JSON body) so tests can
assert the exact bodies an SDK sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.requests import Request


@dataclass
class Recorded:
    """One request a fake received."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass
class RequestLog:
    """The requests of one fake, in arrival order."""

    requests: list[Recorded] = field(default_factory=list)

    async def record(self, request: Request) -> Recorded:
        """Record a request (its body decoded as JSON when it is JSON) and return the record."""
        raw = await request.body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        rec = Recorded(
            request.method,
            request.url.path,
            dict(request.query_params),
            {k.lower(): v for k, v in request.headers.items()},
            body,
        )
        self.requests.append(rec)
        return rec


@asynccontextmanager
async def serve_app(app: Starlette) -> AsyncIterator[str]:
    """Serve ``app`` on loopback; yields its base URL (``http://127.0.0.1:PORT``)."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = logging.getLogger("kesoku.testing.fakes")
    config.graceful_timeout = 0.1
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(serve, app, config)
        yield binds[0]
        nursery.cancel_scope.cancel()
