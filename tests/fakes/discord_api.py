"""A wire-level fake of Discord (REST API v10, Gateway websocket) for the real discord.py client.

Served on loopback by hypercorn (see :mod:`fakes.server`); point the adapter at it with
``[discord] api_base_url = f"{fake.base_url}/api/v10"`` and ``gateway_url = fake.ws_url``.

Gateway (https://discord.com/developers/docs/events/gateway): text frames of JSON ``{"op", "d", "s",
"t"}``. The fake sends HELLO (op 10), answers IDENTIFY (op 2) with READY and one GUILD_CREATE per
guild, RESUME (op 6) with the missed dispatches and RESUMED, HEARTBEAT (op 1) with HEARTBEAT_ACK (op
11), and can ask the client to RECONNECT (op 7). Dispatches (op 0): READY, GUILD_CREATE,
MESSAGE_CREATE, THREAD_CREATE, INTERACTION_CREATE, RESUMED.

REST (https://discord.com/developers/docs/resources/...): ``GET /users/@me``,
``GET /oauth2/applications/@me``, ``PUT /applications/{app}/commands``, ``GET /channels/{id}``,
``GET|POST /channels/{id}/messages`` (JSON or multipart ``payload_json`` + ``files[n]``),
``PATCH|DELETE /channels/{id}/messages/{mid}``, ``POST /channels/{id}/typing``,
``POST /channels/{id}/messages/{mid}/threads``, ``PUT /channels/{id}/thread-members/@me``,
``POST /interactions/{id}/{token}/callback``, ``POST /webhooks/{app}/{token}`` (follow-ups),
``PATCH /webhooks/{app}/{token}/messages/@original``, and ``GET /attachments/{name}`` (the CDN).
Errors follow the documented JSON error shape ``{"code", "message"}`` (Discord API, "JSON Error
Codes")."""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from .server import Recorded, RequestLog, serve_app

DISCORD_EPOCH_MS = 1420070400000
"""Snowflakes count milliseconds from 2015-01-01 (Discord API, "Snowflakes")."""
BOT_ID = 900000000000000001
GUILD_ID = 900000000000000100
THREAD_EXISTS = 160004
"""JSON error code: "A thread has already been created for this message"."""
MISSING_PERMISSIONS = 50013
"""JSON error code: "You lack permissions to perform that action" (HTTP 403)."""
UPLOAD_LIMIT = 10 * 1024 * 1024
"""A guild's attachment size limit without boosts (Discord API, "Uploading Files")."""


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}+00:00"


def snowflake_time(snowflake: int) -> float:
    """The UNIX time encoded in a snowflake."""
    return ((snowflake >> 22) + DISCORD_EPOCH_MS) / 1000


@dataclass
class FakeUser:
    """A Discord user."""

    id: int
    name: str
    bot: bool = False

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "username": self.name,
            "global_name": self.name,
            "discriminator": "0",
            "avatar": None,
            "bot": self.bot,
        }


@dataclass
class Conn:
    """One gateway websocket connection."""

    send: trio.MemorySendChannel[dict[str, Any]]
    session_id: str | None = None
    closed: bool = False


@dataclass
class GatewaySession:
    """A gateway session: its dispatches in order (seq = index + 1), for RESUME."""

    id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    conn: Conn | None = None


class FakeDiscord:
    """The fake's state: one guild with text channels, users, messages, threads and interactions."""

    def __init__(self) -> None:
        self.log = RequestLog()
        self.bot = FakeUser(BOT_ID, "kesoku", bot=True)
        self.users: dict[int, FakeUser] = {BOT_ID: self.bot}
        self.channels: dict[int, dict[str, Any]] = {}
        self.messages: dict[int, dict[str, Any]] = {}  # id -> payload (deleted ones removed)
        self.deleted: list[int] = []
        self.uploads: dict[int, list[tuple[str, bytes]]] = {}  # message id -> files
        self.attachments: dict[str, bytes] = {}
        self.interaction_replies: list[dict[str, Any]] = []
        self.interaction_channels: dict[str, int] = {}  # token -> channel
        self.interaction_messages: dict[str, int] = {}  # interaction id -> the clicked message
        self.typing: list[int] = []
        self.commands: list[dict[str, Any]] = []
        self.sessions: dict[str, GatewaySession] = {}
        self.identifies = 0
        self.resumes = 0
        self.peer_wins_thread_race = False
        self.refuse_threads = False
        """Thread creation is refused with 403 Missing Permissions (the bot lacks Create Public
        Threads in the channel)."""
        self.attachment_status: dict[str, int] = {}
        """CDN keys (the last part of an attachment's url) answered with this HTTP status."""
        self.max_upload_bytes = UPLOAD_LIMIT
        self.unavailable: set[int] = set()
        """Channels whose every REST call is answered 503 Service Unavailable (discord.py raises
        ``DiscordServerError`` at once: it retries only 500, 502, 504 and 524)."""
        self.unavailable_answers: list[int] = []
        """The channel of each 503 answered, in order."""
        self.base_url = ""
        self.token: str | None = None
        """The bot token the REST API accepts (``Authorization: Bot TOKEN``); None: any."""
        self.app_flags = 0
        """The application's flags (``GET /oauth2/applications/@me``): 1 << 19 is the Message
        Content intent of a bot in under 100 servers."""
        self._last_id = 0
        self._changed = trio.Event()
        self._session_ids = itertools.count(1)

    # -- ids and waiting --------------------------------------------------------------------------

    def new_id(self) -> int:
        """A snowflake of now, strictly increasing."""
        now = ((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22) | 1
        self._last_id = max(self._last_id + 1, now)
        return self._last_id

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, check: Callable[[], Any], *, timeout_s: float = 10.0) -> Any:
        """Wait until ``check()`` returns something truthy
        (looked at on every change of the fake's state)."""
        with trio.fail_after(timeout_s):
            while not (found := check()):
                # also look again now and then: ``check`` may read other state
                with trio.move_on_after(0.05):
                    await self._changed.wait()
            return found

    # -- the world --------------------------------------------------------------------------------

    def add_user(self, user_id: int, name: str, *, bot: bool = False) -> FakeUser:
        user = self.users[user_id] = FakeUser(user_id, name, bot)
        return user

    def add_channel(self, name: str, *, channel_id: int | None = None) -> int:
        cid = channel_id or self.new_id()
        self.channels[cid] = {
            "id": str(cid),
            "type": 0,
            "guild_id": str(GUILD_ID),
            "name": name,
            "position": len(self.channels),
            "permission_overwrites": [],
            "nsfw": False,
            "parent_id": None,
            "topic": f"the {name} channel",
            "last_message_id": None,
            "rate_limit_per_user": 0,
        }
        return cid

    def _thread(self, parent: int, thread_id: int, name: str, owner: int) -> dict[str, Any]:
        thread = {
            "id": str(thread_id),
            "type": 11,
            "guild_id": str(GUILD_ID),
            "parent_id": str(parent),
            "owner_id": str(owner),
            "name": name,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "message_count": 0,
            "member_count": 1,
            "thread_metadata": {
                "archived": False,
                "auto_archive_duration": 1440,
                "archive_timestamp": _iso(time.time()),
                "locked": False,
            },
        }
        self.channels[thread_id] = thread
        self.dispatch("THREAD_CREATE", {**thread, "newly_created": True})
        return thread

    def start_thread(
        self, parent: int, name: str, *, owner: int, from_message: int | None = None
    ) -> int:
        """A user (or peer bot) starts a thread; a thread from a message takes the message's id."""
        thread_id = from_message or self.new_id()
        self._thread(parent, thread_id, name, owner)
        return thread_id

    def guild_payload(self) -> dict[str, Any]:
        members = [
            {
                "user": u.payload(),
                "roles": [],
                "joined_at": _iso(time.time()),
                "deaf": False,
                "mute": False,
                "flags": 0,
            }
            for u in self.users.values()
        ]
        return {
            "id": str(GUILD_ID),
            "name": "Test Guild",
            "owner_id": str(next(iter(self.users))),
            "icon": None,
            "unavailable": False,
            "member_count": len(members),
            "members": members,
            "channels": [c for c in self.channels.values() if c["type"] == 0],
            "threads": [c for c in self.channels.values() if c["type"] == 11],
            "roles": [
                {
                    "id": str(GUILD_ID),
                    "name": "@everyone",
                    "permissions": "2251799813685247",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                }
            ],
            "emojis": [],
            "stickers": [],
            "features": [],
            "large": False,
            "premium_tier": 0,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "system_channel_flags": 0,
            "preferred_locale": "en-US",
        }

    # -- what users do ----------------------------------------------------------------------------

    def user_says(
        self,
        channel_id: int,
        author: FakeUser,
        content: str,
        *,
        mentions: tuple[FakeUser, ...] = (),
        attachments: tuple[tuple[str, bytes, str], ...] = (),
        reply_to: int | None = None,
    ) -> dict[str, Any]:
        """A user posts a message (MESSAGE_CREATE); attachments: (filename, data, content type).

        ``reply_to``: the message it replies to (Discord's Reply: ``message_reference``, with the
        message itself as ``referenced_message``).
        """
        files = []
        for name, data, mime in attachments:
            key = str(self.new_id())
            self.attachments[key] = data
            files.append(
                {
                    "id": str(self.new_id()),
                    "filename": name,
                    "size": len(data),
                    "content_type": mime,
                    "url": f"{self.base_url}/attachments/{key}",
                    "proxy_url": f"{self.base_url}/attachments/{key}",
                }
            )
        message = self._message(
            channel_id,
            author,
            content,
            mentions=[m.payload() for m in mentions],
            files=files,
            reference=reply_to,
        )
        self.dispatch("MESSAGE_CREATE", message)
        return message

    def _message(
        self,
        channel_id: int,
        author: FakeUser,
        content: str,
        *,
        mentions: list[dict[str, Any]] | None = None,
        files: list[dict[str, Any]] | None = None,
        components: list[Any] | None = None,
        mention_everyone: bool = False,
        reference: int | None = None,
    ) -> dict[str, Any]:
        mid = self.new_id()
        message = {
            "id": str(mid),
            "channel_id": str(channel_id),
            "guild_id": str(GUILD_ID),
            "author": author.payload(),
            "member": {
                "roles": [],
                "joined_at": _iso(time.time()),
                "deaf": False,
                "mute": False,
                "flags": 0,
            },
            "content": content,
            "timestamp": _iso(snowflake_time(mid)),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": mention_everyone,
            "mentions": mentions or [],
            "mention_roles": [],
            "attachments": files or [],
            "embeds": [],
            "pinned": False,
            "type": 0,
            "flags": 0,
            "components": components or [],
        }
        if reference is not None:
            message["message_reference"] = {
                "type": 0,
                "message_id": str(reference),
                "channel_id": str(channel_id),
                "guild_id": str(GUILD_ID),
            }
            # One level deep, as Discord sends it (the referenced message keeps its own
            # message_reference, without its message); None: the message was deleted.
            referenced = self.messages.get(reference)
            message["referenced_message"] = (
                None
                if referenced is None
                else {k: v for k, v in referenced.items() if k != "referenced_message"}
            )
        self.messages[mid] = message
        self._touch()
        return message

    def _interaction(
        self, itype: int, channel_id: int, user: FakeUser, data: dict[str, Any], **extra: Any
    ) -> str:
        iid = self.new_id()
        channel = self.channels[channel_id]
        payload = {
            "id": str(iid),
            "application_id": str(BOT_ID),
            "type": itype,
            "data": data,
            "guild_id": str(GUILD_ID),
            "channel_id": str(channel_id),
            "channel": channel,
            "member": {
                "user": user.payload(),
                "roles": [],
                "joined_at": _iso(time.time()),
                "permissions": "8",
                "deaf": False,
                "mute": False,
                "flags": 0,
            },
            "token": f"token-{iid}",
            "version": 1,
            "app_permissions": "2251799813685247",
            "locale": "en-US",
            "guild_locale": "en-US",
            "entitlements": [],
            "authorizing_integration_owners": {},
            "attachment_size_limit": self.max_upload_bytes,
            "context": 0,
            **extra,
        }
        self.interaction_channels[payload["token"]] = channel_id
        if "message" in extra:
            self.interaction_messages[str(iid)] = int(extra["message"]["id"])
        self.dispatch("INTERACTION_CREATE", payload)
        return str(iid)

    def click(self, message_id: int, custom_id: str, user: FakeUser) -> str:
        """A user clicks a button
        (INTERACTION_CREATE type 3, MESSAGE_COMPONENT, component_type 2)."""
        message = self.messages[message_id]
        return self._interaction(
            3,
            int(message["channel_id"]),
            user,
            {"custom_id": custom_id, "component_type": 2},
            message=message,
        )

    def select(self, message_id: int, custom_id: str, values: list[str], user: FakeUser) -> str:
        """A user picks options of a string select menu
        (INTERACTION_CREATE type 3, MESSAGE_COMPONENT, component_type 3, ``values``)."""
        message = self.messages[message_id]
        return self._interaction(
            3,
            int(message["channel_id"]),
            user,
            {"custom_id": custom_id, "component_type": 3, "values": values},
            message=message,
        )

    def slash(self, channel_id: int, name: str, user: FakeUser) -> str:
        """A user runs a slash command (INTERACTION_CREATE type 2, APPLICATION_COMMAND)."""
        command = next(c for c in self.commands if c["name"] == name)
        return self._interaction(
            2, channel_id, user, {"id": command["id"], "name": name, "type": 1}
        )

    # -- the gateway ------------------------------------------------------------------------------

    def dispatch(self, event: str, data: dict[str, Any]) -> None:
        """Send a dispatch (op 0) to every gateway session; a disconnected one gets it on RESUME."""
        for session in self.sessions.values():
            frame = {"op": 0, "t": event, "s": len(session.events) + 1, "d": data}
            session.events.append(frame)
            if session.conn is not None and not session.conn.closed:
                try:
                    session.conn.send.send_nowait(frame)
                except trio.WouldBlock:  # a stalled client: drop the connection, it will resume
                    session.conn.closed = True
        self._touch()

    def ask_reconnect(self) -> None:
        """Send RECONNECT (op 7): the client closes and resumes."""
        for session in self.sessions.values():
            if session.conn is not None and not session.conn.closed:
                session.conn.send.send_nowait({"op": 7, "d": None})

    def replay(self, message: dict[str, Any]) -> None:
        """Resend an already delivered MESSAGE_CREATE (what Discord may do around a reconnect)."""
        self.dispatch("MESSAGE_CREATE", message)

    async def _gateway(self, ws: WebSocket) -> None:
        await ws.accept()
        send, receive = trio.open_memory_channel[dict[str, Any]](1000)
        conn = Conn(send)
        await ws.send_text(json.dumps({"op": 10, "d": {"heartbeat_interval": 45000}}))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, ws, receive, conn)
                try:
                    while True:
                        frame = json.loads(await ws.receive_text())
                        self._on_frame(frame, conn)
                except WebSocketDisconnect:
                    nursery.cancel_scope.cancel()
        finally:
            conn.closed = True
            self._touch()

    async def _writer(
        self, ws: WebSocket, receive: trio.MemoryReceiveChannel[dict[str, Any]], conn: Conn
    ) -> None:
        async for frame in receive:
            await ws.send_text(json.dumps(frame))
            if frame["op"] == 7:
                conn.closed = True

    def _on_frame(self, frame: dict[str, Any], conn: Conn) -> None:
        op, data = frame["op"], frame.get("d") or {}
        if op == 1:
            conn.send.send_nowait({"op": 11, "d": None})
        elif op == 2:
            self.identifies += 1
            session = GatewaySession(f"session-{next(self._session_ids)}", conn=conn)
            self.sessions = {session.id: session}  # one bot, one live session
            ready = {
                "v": 10,
                "user": self.bot.payload(),
                "guilds": [{"id": str(GUILD_ID), "unavailable": True}],
                "session_id": session.id,
                "resume_gateway_url": self.ws_url,
                "application": {"id": str(BOT_ID), "flags": 0},
            }
            self.dispatch("READY", ready)
            self.dispatch("GUILD_CREATE", self.guild_payload())
        elif op == 6:
            self.resumes += 1
            session = self.sessions[data["session_id"]]
            session.conn = conn
            for missed in session.events[data["seq"] or 0 :]:
                conn.send.send_nowait(missed)
            self.dispatch("RESUMED", {})
        self._touch()

    @property
    def ws_url(self) -> str:
        return self.base_url.replace("http://", "ws://") + "/"

    # -- REST -------------------------------------------------------------------------------------

    async def _rest(self, request: Request) -> Response:
        rec = await self.log.record(request)
        refused = self.token is not None and rec.headers.get("authorization") != f"Bot {self.token}"
        if refused and rec.path.startswith("/api/"):  # the CDN's attachments need no token
            return _error(401, 0, "401: Unauthorized")
        try:
            return await self._route(request)
        finally:
            self._touch()

    async def _route(self, request: Request) -> Response:
        method, path = request.method, request.url.path.removeprefix("/api/v10")
        parts = path.strip("/").split("/")
        if path == "/users/@me":
            return _json(self.bot.payload())
        if path == "/oauth2/applications/@me":
            return _json(
                {
                    "id": str(BOT_ID),
                    "name": "kesoku",
                    "description": "",
                    "icon": None,
                    "bot_public": True,
                    "bot_require_code_grant": False,
                    "verify_key": "k",
                    "flags": self.app_flags,
                    "owner": self.bot.payload(),
                    "team": None,
                    "summary": "",
                }
            )
        if parts[0] == "applications" and parts[-1] == "commands" and method == "PUT":
            body = await request.json()
            self.commands = [
                {
                    **c,
                    "id": str(self.new_id()),
                    "application_id": str(BOT_ID),
                    "version": "1",
                    "default_member_permissions": None,
                }
                for c in body
            ]
            return _json(self.commands)
        if parts[0] == "channels":
            return await self._channel_route(request, method, parts)
        if parts[0] == "interactions" and parts[-1] == "callback":
            body, files = await _form(request)
            self.interaction_replies.append({**body, "files": files})
            data = body.get("data") or {}
            clicked = self.interaction_messages.get(parts[1])
            refused = components_problem(data.get("components") or [])
            if refused:
                return _error(400, 50035, f"Invalid Form Body: components: {refused}")
            # UPDATE_MESSAGE edits the clicked message
            if body.get("type") == 7 and clicked in self.messages:
                self.messages[clicked].update(
                    {k: v for k, v in data.items() if k in ("content", "components")}
                )
            return _json(
                {
                    "interaction": {
                        "id": parts[1],
                        "type": 3,
                        "response_message_loading": body.get("type") == 5,
                        "response_message_ephemeral": bool(data.get("flags", 0) & 64),
                    }
                }
            )
        if parts[0] == "webhooks":
            body, files = await _form(request)
            self.interaction_replies.append({**body, "files": files})
            message = self._message(
                self.interaction_channels.get(parts[2], next(iter(self.channels))),
                self.bot,
                body.get("content") or "",
            )
            return _json(message)
        if parts[0] == "attachments":
            if parts[1] not in self.attachments:  # gone from the CDN
                return _error(404, 0, "404: Not Found")
            if parts[1] in self.attachment_status:
                status = self.attachment_status[parts[1]]
                return Response(f"{status}: failing", status_code=status)
            return Response(self.attachments[parts[1]], media_type="application/octet-stream")
        return _error(404, 0, f"404: no route {method} {path}")

    async def _channel_route(self, request: Request, method: str, parts: list[str]) -> Response:
        cid = int(parts[1])
        if cid not in self.channels:
            return _error(404, 10003, "Unknown Channel")
        if cid in self.unavailable:
            self.unavailable_answers.append(cid)
            return _error(503, 0, "503: Service Unavailable")
        rest = parts[2:]
        if not rest and method == "GET":
            return _json(self.channels[cid])
        if rest == ["typing"]:
            self.typing.append(cid)
            return Response(status_code=204)
        if rest == ["thread-members", "@me"]:
            self.channels[cid]["joined"] = True
            return Response(status_code=204)
        if rest == ["messages"] and method == "GET":
            listed = [m for m in self.messages.values() if m["channel_id"] == str(cid)]
            limit = int(request.query_params.get("limit", 50))
            return _json(sorted(listed, key=lambda m: -int(m["id"]))[:limit])
        if rest == ["messages"] and method == "POST":
            return await self._create_message(request, cid)
        if len(rest) == 2 and rest[0] == "messages":
            mid = int(rest[1])
            if mid not in self.messages:
                return _error(404, 10008, "Unknown Message")
            if method == "GET":
                return _json(self.messages[mid])
            if method == "DELETE":
                del self.messages[mid]
                self.deleted.append(mid)
                return Response(status_code=204)
            if method == "PATCH":
                body = await _body(request)
                refused = components_problem(body.get("components") or [])
                if refused:
                    return _error(400, 50035, f"Invalid Form Body: components: {refused}")
                self.messages[mid].update(
                    {k: v for k, v in body.items() if k in ("content", "components")}
                )
                return _json(self.messages[mid])
        if len(rest) == 3 and rest[0] == "messages" and rest[2] == "threads":
            mid = int(rest[1])
            body = await request.json()
            if self.refuse_threads:
                return _error(403, MISSING_PERMISSIONS, "Missing Permissions")
            if self.peer_wins_thread_race and mid not in self.channels:
                peer = self.add_user(self.new_id(), "peer-bot", bot=True)
                self._thread(cid, mid, body["name"], peer.id)
            if mid in self.channels:
                return _error(
                    400, THREAD_EXISTS, "A thread has already been created for this message"
                )
            return _json(self._thread(cid, mid, body["name"], BOT_ID), status=201)
        return _error(404, 0, f"404: no route {method} /{'/'.join(parts)}")

    async def _create_message(self, request: Request, cid: int) -> Response:
        body, files = await _form(request)
        if sum(len(data) for _, data in files) > self.max_upload_bytes:
            return _error(413, 40005, "Request entity too large")
        content = body.get("content") or ""
        if not content.strip() and not files and not body.get("components"):
            return _error(400, 50006, "Cannot send an empty message")
        if len(content) > 2000:
            return _error(
                400, 50035, "Invalid Form Body: content: Must be 2000 or fewer in length."
            )
        refused = components_problem(body.get("components") or [])
        if refused:
            return _error(400, 50035, f"Invalid Form Body: components: {refused}")
        attachments = [
            {
                "id": str(self.new_id()),
                "filename": n,
                "size": len(d),
                "url": f"{self.base_url}/x/{n}",
                "proxy_url": f"{self.base_url}/x/{n}",
            }
            for n, d in files
        ]
        reference = (body.get("message_reference") or {}).get("message_id")
        message = self._message(
            cid,
            self.bot,
            content,
            files=attachments,
            components=body.get("components"),
            reference=int(reference) if reference else None,
        )
        message["allowed_mentions"] = body.get("allowed_mentions")
        self.uploads[int(message["id"])] = files
        self.dispatch("MESSAGE_CREATE", message)
        return _json(message)

    # -- queries for tests ------------------------------------------------------------------------

    def requests(self, method: str, path_pattern: str) -> list[Recorded]:
        """The requests received of a method whose path matches a regular expression (fullmatch)."""
        return [
            r
            for r in self.log.requests
            if r.method == method and re.fullmatch(path_pattern, r.path) is not None
        ]

    def bot_messages(self, channel_id: int) -> list[dict[str, Any]]:
        """The bot's live (not deleted) messages in a channel, oldest first."""
        return [
            m
            for m in self.messages.values()
            if m["channel_id"] == str(channel_id) and m["author"]["id"] == str(BOT_ID)
        ]

    def app(self) -> Starlette:
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        return Starlette(
            routes=[
                WebSocketRoute("/", self._gateway),
                Route("/api/v10/{path:path}", self._rest, methods=methods),
                Route("/attachments/{path:path}", self._rest, methods=["GET"]),
            ]
        )


def components_problem(rows: list[Any]) -> str:
    """What Discord would refuse in a message's components, or ``""`` (Discord API, "Component
    Reference"): at most 5 action rows; a row holds 1 to 5 buttons or exactly one select menu; a
    button label at most 80 characters; a custom id at most 100, unique in the message; a string
    select 1 to 25 options, labels and values at most 100 characters, a placeholder at most 150."""
    if len(rows) > 5:
        return f"{len(rows)} action rows, at most 5"
    seen: set[str] = set()
    for r, row in enumerate(rows):
        items = row.get("components") or []
        if row.get("type") != 1 or not items:
            return f"row {r} is not an action row with components"
        selects = [c for c in items if c.get("type") == 3]
        if (selects and len(items) != 1) or len(items) > 5:
            return f"row {r}: {len(items)} components ({len(selects)} select menus)"
        for item in items:
            custom_id = str(item.get("custom_id") or "")
            if len(custom_id) > 100 or (custom_id and custom_id in seen):
                return f"row {r}: custom_id {custom_id[:40]!r} too long or repeated"
            seen.add(custom_id)
            if item.get("type") == 2 and len(str(item.get("label") or "")) > 80:
                return f"row {r}: a button label over 80 characters"
            if item.get("type") == 3:
                options = item.get("options") or []
                if not 1 <= len(options) <= 25:
                    return f"row {r}: {len(options)} select options, 1 to 25"
                if len(str(item.get("placeholder") or "")) > 150:
                    return f"row {r}: a placeholder over 150 characters"
                for option in options:
                    texts = (str(option.get("label", "")), str(option.get("value", "")))
                    if max(len(t) for t in texts) > 100:
                        return f"row {r}: a select option over 100 characters"
    return ""


def _json(data: Any, *, status: int = 200) -> Response:
    # discord.py parses a body as JSON only when Content-Type is exactly application/json.
    return Response(json.dumps(data), status_code=status, media_type="application/json")


def _error(status: int, code: int, message: str) -> Response:
    return JSONResponse(
        {"code": code, "message": message}, status_code=status, media_type="application/json"
    )


async def _body(request: Request) -> dict[str, Any]:
    body, _ = await _form(request)
    return body


async def _form(request: Request) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
    """A JSON body, or a multipart one: ``payload_json`` and ``files[n]``
    (Discord API, "Uploading Files")."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        files: list[tuple[str, bytes]] = []
        async with request.form() as form:  # closes the uploads' spooled temporary files
            body = dict(json.loads(str(form["payload_json"])))
            for key, value in form.multi_items():
                if key.startswith("files[") and not isinstance(value, str):
                    files.append((value.filename or "", await value.read()))
        return body, files
    raw = await request.body()
    return (dict(json.loads(raw)) if raw else {}), []


@asynccontextmanager
async def serve_discord() -> AsyncIterator[FakeDiscord]:
    """Serve a fresh fake on loopback; ``fake.base_url`` and ``fake.ws_url`` are set."""
    fake = FakeDiscord()
    async with serve_app(fake.app()) as url:
        fake.base_url = url
        yield fake
