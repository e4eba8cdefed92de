"""One connection to one MCP server, over stdio or Streamable HTTP, with the official ``mcp`` SDK.

The SDK (``mcp`` 2.x) is anyio-based and runs on trio as it is. What this module adds around its
``Client``:

- The SDK is imported in a worker thread on first use (:func:`load_sdk`): ``import mcp`` costs about
  1.1–1.4 s of CPU with bytecode present (pydantic models for the whole protocol), far over the
  event loop's 25 ms step budget.
- A relay between the transport and the session sees what the SDK would only log: lines on a stdio
  server's stdout that are not JSON-RPC (counted, the first few logged, named in failure reports)
  and the end of the stream (:attr:`Connection.closed`, with a reason).
- A stdio server's stderr goes to a pipe read here: its last lines explain a crash ("exited: ...").
- Handshake: ``mode="auto"`` (``server/discover`` on 2026-07-28 servers, the ``initialize``
  handshake on older ones); the response cache is off, since a listing is wanted fresh after a
  ``list_changed``.

Wire formats: MCP 2025-11-25 and 2026-07-28 (modelcontextprotocol.io/specification), stdio framing
is one JSON-RPC message per line; Streamable HTTP is POST plus SSE at one endpoint.
"""

from __future__ import annotations

import collections
import functools
import importlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, TextIO

import trio

from kesoku import __version__
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.text import decode_json

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client._transport import Transport, TransportStreams
    from mcp.shared._stream_protocols import ReadStream
    from mcp.shared.message import SessionMessage
    from mcp_types import Prompt, Resource, ResourceTemplate
    from mcp_types import Tool as McpTool

    from kesoku.config.settings import McpHttpServer, McpStdioServer
    from kesoku.tools.sandbox import Sandbox

    McpServerConfig = McpStdioServer | McpHttpServer

log = logging.getLogger(__name__)

SDK_MODULES = (
    "mcp",
    "mcp.client.stdio",
    "mcp.client.streamable_http",
    "httpx2",
    # Imported by the SDK at the first result with an output schema (about 50 ms): not on the loop.
    "jsonschema",
    "jsonschema.validators",
    "referencing",
)
"""Imported together by :func:`load_sdk`."""
STDERR_LINES = 20
"""Last lines of a stdio server's stderr kept for failure reports."""
STDERR_LINE_BYTES = 2000
"""A longer stderr line is cut.

Memory then stays bounded even for a server printing megabytes without newlines.
"""
STDERR_GRACE_S = 0.5
"""After a stdio server's stdout ends, the wait for the rest of its stderr (the crash message)."""
JUNK_LOGGED = 3
"""Lines on stdout that are not JSON-RPC logged per connection; more are only counted."""
MAX_PAGES = 100
"""Pages of a listing read at most: a server whose cursor never ends cannot hang a connection."""
HTTP_CONNECT_TIMEOUT_S = 30.0
"""Connect, write and pool timeout of the HTTP client (the SDK's default)."""
HTTP_READ_TIMEOUT_S = 300.0
"""The HTTP client's read timeout: a server may hold an SSE stream open this long between events."""

_sdk_loaded = False


async def load_sdk() -> None:
    """Import the ``mcp`` SDK in a worker thread, once.

    It takes about 1.2 s of CPU; the loop runs meanwhile.
    """
    global _sdk_loaded
    if not _sdk_loaded:
        await trio.to_thread.run_sync(_import_sdk)
        _sdk_loaded = True


def _import_sdk() -> None:
    for name in SDK_MODULES:
        importlib.import_module(name)
    # The stdio transport logs every line that is not JSON-RPC with a full traceback, at ERROR. The
    # relay below reports those lines once per connection in one line, naming the server.
    logging.getLogger("mcp.client.stdio").addFilter(_drop_parse_errors)


def _drop_parse_errors(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Failed to parse JSONRPC message")


def describe(exc: BaseException) -> str:
    """One line for an exception: the first leaf of nested groups, its type and message."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"cannot start {exc.filename}: no such program"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _junk_text(exc: Exception) -> str:
    """A parse error's offending line (pydantic keeps it as the error's input), else the error."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            found = errors()
        except Exception:  # a ValidationError-like object whose errors() fails: fall back to str()
            found = None
        if found and isinstance(found[0].get("input"), str):
            return str(found[0]["input"])
    return str(exc)


def _salvaged(exc: Exception) -> Any:
    r"""The message of a line the SDK could not parse only for a lone surrogate escape, else None.

    pydantic's JSON parser refuses an escaped lone surrogate (``"\ud800"``: "unexpected end of hex
    escape") that a server written in another language may well send; the request would then wait
    for its answer until it timed out. The standard library's json reads it (:func:`decode_json`,
    the surrogate becomes U+FFFD), and the value is validated as the SDK would have.
    """
    line = _junk_text(exc)
    if "\\u" not in line:
        return None
    from mcp.shared.message import SessionMessage
    from mcp_types import jsonrpc_message_adapter

    try:
        return SessionMessage(
            jsonrpc_message_adapter.validate_python(decode_json(line), by_name=False)
        )
    # not JSON (msgspec.DecodeError), or not JSON-RPC (pydantic's ValidationError)
    except ValueError:
        return None


class Connection:
    """A live connection to one server (made by :func:`open_connection`).

    Attributes:
        config: The server's ``[[mcp.servers]]`` entry.
        client: The SDK client (set once the handshake passed).
        closed: Set when the connection ended; :attr:`reason` then says why.
        changed: Set when the server announced that its tools or prompts changed (cleared by the
            reader).
        junk_lines: Lines on stdout that were not JSON-RPC.
    """

    def __init__(self, config: McpServerConfig, *, sandbox: Sandbox | None = None) -> None:
        self.config = config
        self.sandbox = sandbox
        """Wraps a stdio server with ``sandbox = true``; None: such a server cannot start."""
        self.name = config.name
        self._client: Client | None = None
        self.closed = trio.Event()
        self.reason: str | None = None
        self.changed = trio.Event()
        self.junk_lines = 0
        self.first_junk: str | None = None
        self.stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stderr_done = trio.Event()
        self._errlog: TextIO | None = None
        self.on_close: Callable[[], None] | None = None
        """Called once when the connection ends (the manager withdraws the tools at once)."""

    @property
    def client(self) -> Client:
        """The SDK client; raises RuntimeError before the handshake passed."""
        if self._client is None:
            raise RuntimeError(f"MCP server {self.name}: not connected yet")
        return self._client

    def close(self, reason: str) -> None:
        """Mark the connection ended (the first reason given is kept)."""
        if not self.closed.is_set():
            self.reason = self.explain(reason)
            self.closed.set()
            if self.on_close is not None:
                self.on_close()

    def explain(self, problem: str) -> str:
        """``problem`` with what the server printed.

        That is the last stderr line and the first junk line on stdout.
        """
        hints = []
        if self.stderr:
            hints.append(f"stderr: {self.stderr[-1]}")
        if self.junk_lines:
            first = self.first_junk or ""
            first = first if len(first) <= 120 else first[:119] + "…"
            hints.append(f"{self.junk_lines} line(s) on stdout were not JSON-RPC, first: {first!r}")
        return f"{problem} ({'; '.join(hints)})" if hints else problem

    # -- listings -------------------------------------------------------------------------------

    async def list_tools(self) -> list[McpTool]:
        """Every tool (all pages); empty when the server has no tools capability."""
        if self.client.server_capabilities.tools is None:
            return []
        out: list[McpTool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.client.list_tools(cursor=cursor)
            out.extend(page.tools)
            if not (cursor := page.next_cursor):
                break
        return out

    async def list_prompts(self) -> list[Prompt]:
        """Every prompt (all pages); empty when the server has no prompts capability."""
        if self.client.server_capabilities.prompts is None:
            return []
        out: list[Prompt] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.client.list_prompts(cursor=cursor)
            out.extend(page.prompts)
            if not (cursor := page.next_cursor):
                break
        return out

    @property
    def has_resources(self) -> bool:
        """The server offers resources."""
        return self.client.server_capabilities.resources is not None

    async def list_resources(self) -> tuple[list[Resource], list[ResourceTemplate]]:
        """Every resource and resource template (all pages)."""
        resources: list[Resource] = []
        templates: list[ResourceTemplate] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.client.list_resources(cursor=cursor)
            resources.extend(page.resources)
            if not (cursor := page.next_cursor):
                break
        from mcp import MCPError

        cursor = None
        try:
            for _ in range(MAX_PAGES):
                tpage = await self.client.list_resource_templates(cursor=cursor)
                templates.extend(tpage.resource_templates)
                if not (cursor := tpage.next_cursor):
                    break
        except MCPError:  # templates are optional: a server may not implement the method
            pass
        return resources, templates

    # -- plumbing -------------------------------------------------------------------------------

    async def _on_message(self, message: Any) -> None:
        """The session's handler for notifications and transport errors."""
        if isinstance(message, Exception):
            self._junk(message)
        elif getattr(message, "method", None) in (
            "notifications/tools/list_changed",
            "notifications/prompts/list_changed",
        ):
            self.changed.set()

    def _junk(self, exc: Exception) -> None:
        self.junk_lines += 1
        text = _junk_text(exc)
        if self.first_junk is None:
            self.first_junk = text
        if self.junk_lines <= JUNK_LOGGED:
            log.warning(
                "MCP server %s: ignored a line on stdout that is not JSON-RPC: %.200r",
                self.name,
                text,
            )
        elif self.junk_lines == JUNK_LOGGED + 1:
            log.warning(
                "MCP server %s: more lines on stdout are not JSON-RPC; no longer logged", self.name
            )

    async def _relay(
        self,
        read: ReadStream[SessionMessage | Exception],
        send: trio.MemorySendChannel[SessionMessage | Exception],
    ) -> None:
        """Pass the server's messages on; count junk; note the end of the stream."""
        async with send:
            async for item in read:
                if isinstance(item, Exception):
                    salvaged = _salvaged(item)
                    if salvaged is None:
                        # the session would only log it: the request waits for its answer
                        self._junk(item)
                        continue
                    item = salvaged
                await send.send(item)
        if self._errlog is not None:
            with trio.move_on_after(STDERR_GRACE_S):  # the crash message may still be in the pipe
                await self._stderr_done.wait()
        self.close(
            "the server closed the connection"
            if self._errlog is None
            else "the server process ended"
        )

    async def _read_stderr(self, fd: int) -> None:
        try:
            async with trio.lowlevel.FdStream(fd) as stream:
                pending = b""
                while chunk := await stream.receive_some(65536):
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        self._stderr_line(line)
                    if len(pending) > STDERR_LINE_BYTES:
                        self._stderr_line(pending)
                        pending = b""
                if pending:
                    self._stderr_line(pending)
        finally:
            self._stderr_done.set()

    def _stderr_line(self, raw: bytes) -> None:
        line = raw[:STDERR_LINE_BYTES].decode("utf-8", errors="replace").rstrip()
        if line:
            self.stderr.append(line)
            log.debug("MCP server %s stderr: %s", self.name, line)

    async def _transport(self, stack: AsyncExitStack, nursery: trio.Nursery) -> Transport:
        from kesoku.config.settings import McpStdioServer

        cfg = self.config
        if isinstance(cfg, McpStdioServer):
            from mcp.client.stdio import StdioServerParameters, stdio_client

            read_fd, write_fd = os.pipe()
            self._errlog = os.fdopen(write_fd, "w")
            # closed once spawned (below); this covers a failed spawn
            stack.callback(self._errlog.close)
            nursery.start_soon(self._read_stderr, read_fd)
            command, args = cfg.command, list(cfg.args)
            if cfg.sandbox:
                if self.sandbox is None:
                    raise OperatorError("sandbox = true, but this process has no sandbox settings")
                wrapped = await trio.to_thread.run_sync(
                    self.sandbox.server_command, command, args, cfg.cwd
                )
                command, args = wrapped[0], wrapped[1:]
            params = StdioServerParameters(
                command=command, args=args, env=dict(cfg.env) or None, cwd=cfg.cwd
            )
            return stdio_client(params, errlog=self._errlog)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        # Built in a thread: creating the client's SSL context takes tens of ms of CPU.
        make = functools.partial(
            httpx2.AsyncClient,
            headers=dict(cfg.headers),
            timeout=httpx2.Timeout(HTTP_CONNECT_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S),
        )
        http = await stack.enter_async_context(await trio.to_thread.run_sync(make))
        return streamable_http_client(cfg.url, http_client=http)

    @asynccontextmanager
    async def _watched(self, transport: Transport) -> AsyncIterator[TransportStreams]:
        """The transport with the relay in front of its read stream."""
        # the SDK is loaded by now; the channel's type is needed at run time
        from mcp.shared import message

        async with transport as (read, write):
            if self._errlog is not None:
                # the child has its copy; ours would keep the pipe open after it exits
                self._errlog.close()
            send, receive = trio.open_memory_channel[message.SessionMessage | Exception](0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._relay, read, send)
                try:
                    with receive:
                        yield receive, write
                finally:
                    nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_connection(conn: Connection) -> AsyncIterator[Connection]:
    """Start or reach ``conn``'s server, pass the MCP handshake, and yield the connection.

    Args:
        conn: A new connection (:class:`Connection` of the server's config); made by the caller so
            it can read what the server printed even when the handshake never ends.

    Yields:
        ``conn``; its :attr:`~Connection.closed` is set when the server goes away.

    Raises:
        OSError: A stdio server's program cannot be started (``FileNotFoundError``: no such
            program).
        mcp.MCPError: The server refused the handshake, or closed the connection during it.
        Exception: An HTTP server cannot be reached (``httpx2`` errors, possibly in an
            ExceptionGroup); a Streamable HTTP transport that loses the server ends the block with
            such an error.

    Cancellation:
        The SDK stops a stdio server on the way out (close stdin, wait 2 s, SIGTERM the process
        group, SIGKILL 2 s later), shielded and bounded; an HTTP session is ended with a DELETE.
    """
    await load_sdk()
    from mcp import Client
    from mcp_types import Implementation

    try:
        async with AsyncExitStack() as stack:
            nursery = await stack.enter_async_context(trio.open_nursery())
            stack.callback(nursery.cancel_scope.cancel)  # runs after the client is closed (LIFO)
            transport = await conn._transport(stack, nursery)
            client = Client(
                conn._watched(transport),
                mode="auto",
                cache=None,
                message_handler=conn._on_message,
                client_info=Implementation(name="kesoku", version=__version__),
            )
            conn._client = await stack.enter_async_context(client)
            yield conn
    except Exception as exc:
        conn.close(describe(exc))
        raise
    finally:
        conn.close("the connection was closed")


def prompt_arguments(prompt: Prompt) -> Sequence[tuple[str, bool]]:
    """``(name, required)`` of a prompt's arguments, in the server's order."""
    return [(arg.name, bool(arg.required)) for arg in prompt.arguments or ()]
