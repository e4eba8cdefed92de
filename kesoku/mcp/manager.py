"""``McpManager``: the MCP servers of ``[[mcp.servers]]`` as a tool source of the runtime.

Task tree (inside ``Runtime.serve``)::

    McpManager.serve ─┬─ stop watcher (outside the shield: sees the runtime's cancellation)
                      └─ links scope (shielded) ── one task per enabled server:
                                                   connect, serve, reconnect

Lifecycle of a server: connect (spawn or reach it, MCP handshake, list tools and prompts within
``connect_timeout_s``), then offer its tools until the connection ends, then withhold them and try
again after a backoff: 1 s, doubling to at most 60 s, ±20 % jitter; the backoff starts over once a
connection lasted 60 s. Every failure is one log line naming the server and the reason (the last
line of its stderr, lines on stdout that were not JSON-RPC). ``serve`` reports started once every
server's first attempt ended, or after ``startup_wait_s`` (a slow server keeps connecting in the
background).

Stopping: when the runtime is cancelled the tools are withdrawn at once, but the connections stay up
until the MCP calls in flight end (a running tool batch is shielded and finishes, ARCHITECTURE.md
"Task tree"), bounded by the longest ``timeout_s`` of the servers plus :data:`DRAIN_EXTRA_S`; then
the servers are stopped.

Trust: whatever an MCP server returns is outside the workspace's trust: every tool or resource
result adds the taint source ``mcp: <server>`` to the session.
"""

from __future__ import annotations

import functools
import logging
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import trio

from kesoku.config.settings import McpConfig, McpStdioServer, ShellConfig
from kesoku.mcp import convert
from kesoku.mcp.client import Connection, describe, load_sdk, open_connection
from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.output import cap_output
from kesoku.vocab.errors import ToolError

if TYPE_CHECKING:
    from mcp_types import Prompt
    from mcp_types import Tool as McpTool

    from kesoku.mcp.client import McpServerConfig
    from kesoku.tools.sandbox import Sandbox

log = logging.getLogger(__name__)

STARTUP_WAIT_S = 5.0
"""``serve`` reports started after every server's first attempt, or after this long at most."""
CONNECT_TIMEOUT_S = 30.0
"""Start (or reach), handshake and first listings of a server must end within this."""
BACKOFF_FIRST_S = 1.0
"""Wait before the first reconnection; doubled after each failure."""
BACKOFF_MAX_S = 60.0
"""The longest wait between attempts."""
BACKOFF_RESET_S = 60.0
"""A connection that lasted this long starts the backoff over."""
JITTER = 0.2
"""Each wait is scaled by a random factor in ``1 ± JITTER`` so servers do not retry in lockstep."""
CLOSED_WAIT_S = 1.0
"""After a call failed because the connection closed, how long to wait for the reason (stderr)."""
DRAIN_EXTRA_S = 5.0
"""At shutdown, calls in flight get the longest ``timeout_s`` plus this before servers stop."""
State = Literal["disabled", "connecting", "connected", "failed"]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What ``kesoku mcp list`` and ``/mcp`` show about a server.

    Attributes:
        name: The configured name.
        transport: ``stdio`` or ``http``.
        state: ``disabled``, ``connecting``, ``connected`` or ``failed`` (waiting to retry).
        error: Why the last connection failed or ended.
        tools: ``(offered name, first line of the description)`` of the tools offered now.
        resources: The server offers resources.
        prompts: ``(name, description, ((argument, required), ...))`` of its prompts.
        retry_in_s: Seconds until the next attempt, when failed.
    """

    name: str
    transport: str
    state: State
    error: str | None
    tools: tuple[tuple[str, str], ...]
    resources: bool
    prompts: tuple[tuple[str, str, tuple[tuple[str, bool], ...]], ...]
    retry_in_s: float | None


class _Server:
    """One configured server: its state, connection and tools (owned by its task)."""

    def __init__(self, config: McpServerConfig, prefix: str) -> None:
        self.config = config
        self.prefix = prefix
        self.state: State = "connecting" if config.enabled else "disabled"
        self.error: str | None = None
        self.conn: Connection | None = None
        self.tools: tuple[Tool, ...] = ()
        self.prompts: tuple[Prompt, ...] = ()
        self.resources = False
        self.retry_at: float | None = None
        self.tried = False


def first_line(text: str | None) -> str:
    """The first non-empty line of ``text`` ('' when none)."""
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


class McpManager:
    """The tool source of the MCP servers (:class:`kesoku.agent.runtime.ToolSource`).

    Args:
        config: ``[mcp]`` of kesoku.toml.
        max_output_bytes: Cap of one result's text (head and tail kept; ``shell.max_output_bytes``).
        connect_timeout_s: See :data:`CONNECT_TIMEOUT_S`.
        startup_wait_s: See :data:`STARTUP_WAIT_S`.
        backoff_s: ``(first, longest)`` wait between attempts (:data:`BACKOFF_FIRST_S`,
            :data:`BACKOFF_MAX_S`).
        sandbox: Confines the stdio servers with ``sandbox = true``; None: they fail to start.
        connect_timeouts: Seconds per server name, instead of ``connect_timeout_s`` for that server
            (``kesoku mcp list`` gives each server its own ``timeout_s``).
        on_first_try: Called with a server's status once its first attempt ended, connected or
            failed (in the manager's task: it must not block).
    """

    name = "mcp"

    def __init__(
        self,
        config: McpConfig,
        *,
        max_output_bytes: int = ShellConfig().max_output_bytes,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        startup_wait_s: float = STARTUP_WAIT_S,
        backoff_s: tuple[float, float] = (BACKOFF_FIRST_S, BACKOFF_MAX_S),
        sandbox: Sandbox | None = None,
        connect_timeouts: Mapping[str, float] | None = None,
        on_first_try: Callable[[ServerStatus], None] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.connect_timeouts = dict(connect_timeouts or {})
        self.on_first_try = on_first_try
        prefixes = convert.server_prefixes([s.name for s in config.servers])
        self._servers = {s.name: _Server(s, prefixes[s.name]) for s in config.servers}
        self.max_output_bytes = max_output_bytes
        self.connect_timeout_s = connect_timeout_s
        self.startup_wait_s = startup_wait_s
        self.backoff_s = backoff_s
        self._tools: tuple[Tool, ...] = ()
        self._stopping = False
        self._in_flight = 0
        self._drained: trio.Event | None = None
        self._first_tries = trio.Event()
        self.resource_timeout_s = max((s.timeout_s for s in config.servers), default=60.0)

    # -- what the runtime and the adapters ask --------------------------------------------------

    def tools(self) -> Sequence[Tool]:
        """The tools of the servers connected now.

        Then list_resources and read_resource, if any of them offers resources.
        """
        return self._tools

    def statuses(self) -> list[ServerStatus]:
        """Every configured server, in config order."""
        return [self._status(s) for s in self._servers.values()]

    def _status(self, s: _Server) -> ServerStatus:
        now = trio.current_time() if self._running() else None
        retry = max(0.0, s.retry_at - now) if s.retry_at is not None and now is not None else None
        return ServerStatus(
            name=s.config.name,
            transport="stdio" if isinstance(s.config, McpStdioServer) else "http",
            state=s.state,
            error=s.error,
            tools=tuple((t.name, first_line(t.description)) for t in s.tools),
            resources=s.resources,
            prompts=tuple(
                (
                    p.name,
                    first_line(p.description),
                    tuple((a.name, bool(a.required)) for a in p.arguments or ()),
                )
                for p in s.prompts
            ),
            retry_in_s=retry if s.state == "failed" else None,
        )

    async def get_prompt(self, server_name: str, prompt: str, arguments: Mapping[str, str]) -> str:
        """Render a server's prompt as one user message (:func:`kesoku.mcp.convert.prompt_text`).

        Raises:
            LookupError: No such server, it is not connected, or the server refused (the message
                says which).
            TimeoutError: No answer within the server's ``timeout_s``.
        """
        server, conn = self._connected(server_name)
        from mcp import MCPError

        try:
            with trio.fail_after(server.config.timeout_s):
                result = await conn.client.get_prompt(prompt, dict(arguments))
        except MCPError as exc:
            raise LookupError(f"MCP server {server_name}: {exc.message}") from None
        return convert.prompt_text(result)

    def _connected(self, server_name: str) -> tuple[_Server, Connection]:
        server = self._servers.get(server_name)
        if server is None:
            known = ", ".join(self._servers) or "none"
            raise LookupError(f"no MCP server named {server_name!r} (configured: {known})")
        conn = server.conn
        if server.state != "connected" or conn is None or conn.closed.is_set():
            why = f": {server.error}" if server.error else ""
            raise LookupError(f"MCP server {server_name} is {server.state}{why}")
        return server, conn

    def _running(self) -> bool:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            return False
        return True

    # -- serving ----------------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every enabled server connected until cancelled.

        Cancellation:
            Tools are withdrawn at once; connections close once the calls in flight end (bounded,
            see the module docstring); stdio servers are then stopped by the SDK (bounded, about 6 s
            at worst).
        """
        enabled = [s for s in self._servers.values() if s.config.enabled]
        if not enabled:
            task_status.started()
            return
        drain_s = max(s.config.timeout_s for s in enabled) + DRAIN_EXTRA_S
        async with trio.open_nursery() as outer:
            # Shielded: the runtime's cancellation must not cut the connections under a tool batch
            # that is itself shielded; the stop watcher cancels this scope once calls drained
            # (bounded).
            links = trio.CancelScope(shield=True)
            outer.start_soon(self._stop_when_cancelled, links, drain_s)
            with links:
                async with trio.open_nursery() as nursery:
                    for server in enabled:
                        nursery.start_soon(
                            self._keep_connected, server, name=f"mcp server {server.config.name}"
                        )
                    with trio.move_on_after(self.startup_wait_s):
                        await self._first_tries.wait()
                    task_status.started()

    async def _stop_when_cancelled(self, links: trio.CancelScope, drain_s: float) -> None:
        try:
            await trio.sleep_forever()
        finally:
            self._stopping = True
            self._rebuild()
            # Shielded so the calls of a finishing tool batch keep their connection; bounded by
            # drain_s.
            with trio.CancelScope(shield=True), trio.move_on_after(drain_s):
                if self._in_flight:
                    self._drained = trio.Event()
                    await self._drained.wait()
            links.cancel()

    async def _keep_connected(self, server: _Server) -> None:
        failures = 0
        while True:
            server.state, server.retry_at = "connecting", None
            try:
                reason, up_s = await self._connect_once(server)
            except Exception as exc:  # a bug here must not end the other servers or the runtime
                log.exception("MCP server %s: unexpected error", server.config.name)
                reason, up_s = describe(exc), 0.0
            if up_s >= BACKOFF_RESET_S:
                failures = 0
            first, longest = self.backoff_s
            delay = min(longest, first * 2**failures) * random.uniform(1 - JITTER, 1 + JITTER)
            failures += 1
            server.state, server.error = "failed", reason
            server.retry_at = trio.current_time() + delay
            what = "disconnected" if up_s else "failed"
            log.warning(
                "MCP server %s %s: %s; its tools are withheld; retrying in %.1f s",
                server.config.name,
                what,
                reason,
                delay,
            )
            self._tried(server)
            await trio.sleep(delay)

    async def _connect_once(self, server: _Server) -> tuple[str, float]:
        """Connect, serve until the connection ends; ``(why it ended, seconds it was up)``."""
        conn = Connection(server.config, sandbox=self.sandbox)
        conn.on_close = functools.partial(self._closed, server, conn)
        connected_at: float | None = None
        limit_s = self.connect_timeouts.get(server.config.name, self.connect_timeout_s)
        try:
            # Kesoku's own import of the SDK (about 1.2 s, once) is not the server's time
            await load_sdk()
            with trio.CancelScope() as scope:
                scope.deadline = trio.current_time() + limit_s
                async with open_connection(conn):
                    await self._load(server, conn)
                    scope.deadline = math.inf
                    connected_at = trio.current_time()
                    self._attach(server, conn)
                    try:
                        await self._follow(server, conn)
                    finally:
                        self._detach(server)
        except BaseExceptionGroup as group:
            # Stopped while an error was on its way (a spawn failing as the daemon stops): the SDK's
            # task groups bundle both; the stop wins, and the error must not escape the runtime's
            # nursery.
            cancelled, _ = group.split(trio.Cancelled)
            if cancelled is not None:
                raise cancelled from None
            reason = conn.reason or describe(group)
        except Exception as exc:
            reason = conn.reason or describe(exc)
        else:
            if scope.cancelled_caught:
                reason = conn.explain(f"no answer to the MCP handshake within {limit_s:g} s")
            else:
                reason = conn.reason or "the connection was closed"
        up_s = trio.current_time() - connected_at if connected_at is not None else 0.0
        return reason, up_s

    async def _follow(self, server: _Server, conn: Connection) -> None:
        """List again whenever the server says its tools or prompts changed.

        Runs until the connection ends.
        """
        while not conn.closed.is_set():
            async with trio.open_nursery() as nursery:

                async def wait(
                    event: trio.Event, scope: trio.CancelScope = nursery.cancel_scope
                ) -> None:
                    await event.wait()
                    scope.cancel()

                nursery.start_soon(wait, conn.closed)
                nursery.start_soon(wait, conn.changed)
            if conn.changed.is_set() and not conn.closed.is_set():
                conn.changed = trio.Event()
                await self._load(server, conn)
                self._attach(server, conn)

    async def _load(self, server: _Server, conn: Connection) -> None:
        """List the server's tools and prompts.

        The tools offered are built under provider-safe names.
        """
        from mcp import MCPError

        cfg = server.config
        listed = await conn.list_tools()
        names = {t.name for t in listed}
        unknown = sorted((set(cfg.include_tools) | set(cfg.exclude_tools)) - names)
        if unknown:
            log.warning(
                "MCP server %s: include/exclude_tools name unknown tools: %s",
                cfg.name,
                ", ".join(unknown),
            )
        wanted = {
            t.name: t
            for t in listed
            if (not cfg.include_tools or t.name in cfg.include_tools)
            and t.name not in cfg.exclude_tools
        }
        offered = convert.tool_names(server.prefix, wanted)
        server.tools = tuple(
            self._tool(server, conn, name, wanted[original]) for name, original in offered.items()
        )
        try:
            server.prompts = tuple(await conn.list_prompts())
        except MCPError as exc:  # prompts are optional: the tools still work
            log.warning("MCP server %s: cannot list prompts: %s", cfg.name, exc.message)
            server.prompts = ()
        server.resources = conn.has_resources

    def _attach(self, server: _Server, conn: Connection) -> None:
        first = server.conn is not conn
        server.conn, server.state, server.error = conn, "connected", None
        self._rebuild()
        self._tried(server)
        if first:
            log.info(
                "MCP server %s: connected (protocol %s): %d tools, %d prompts%s",
                server.config.name,
                conn.client.protocol_version,
                len(server.tools),
                len(server.prompts),
                ", resources" if server.resources else "",
            )

    def _closed(self, server: _Server, conn: Connection) -> None:
        """The connection ended: withdraw the tools now, before the server's task gets to run."""
        if server.conn is conn:
            server.state, server.error = "failed", conn.reason
        self._rebuild()

    def _detach(self, server: _Server) -> None:
        server.conn, server.tools, server.prompts, server.resources = None, (), (), False
        self._rebuild()

    def _tried(self, server: _Server) -> None:
        if not server.tried and self.on_first_try is not None:
            self.on_first_try(self._status(server))
        server.tried = True
        if all(s.tried for s in self._servers.values() if s.config.enabled):
            self._first_tries.set()

    def _rebuild(self) -> None:
        if self._stopping:
            self._tools = ()
            return
        tools: list[Tool] = []
        with_resources: list[str] = []
        for s in self._servers.values():
            if s.state == "connected" and s.conn is not None and not s.conn.closed.is_set():
                tools.extend(s.tools)
                if s.resources:
                    with_resources.append(s.config.name)
        if with_resources:
            tools.extend(self._resource_tools(with_resources))
        self._tools = tuple(tools)

    # -- tools ------------------------------------------------------------------------------------

    def _tool(self, server: _Server, conn: Connection, name: str, spec: McpTool) -> Tool:
        original = spec.name

        async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            result = await self._request(
                server, conn, ctx, lambda: conn.client.call_tool(original, dict(arguments))
            )
            text = convert.call_result_text(result, self.max_output_bytes)
            if result.is_error:
                raise ToolError(text)
            return text

        schema = dict(spec.input_schema) if isinstance(spec.input_schema, dict) else {}
        schema.setdefault("type", "object")
        description = (
            spec.description
            or spec.title
            or f"The {original} tool of MCP server {server.config.name}."
        )
        return Tool(name, description, run, schema, timeout_s=server.config.timeout_s)

    async def _request(
        self, server: _Server, conn: Connection, ctx: ToolContext, call: Callable[[], Awaitable[_T]]
    ) -> _T:
        """Make one request of ``conn``; failures become ToolError; an answer taints the session."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        name = server.config.name
        if self._stopping or conn.closed.is_set():
            raise ToolError(
                f"MCP server {name} is not connected ({conn.reason or 'stopping'}); try again later"
            )
        self._in_flight += 1
        try:
            result = await call()
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                with trio.move_on_after(CLOSED_WAIT_S):
                    await conn.closed.wait()
                raise ToolError(
                    f"MCP server {name} went away during the call: {conn.reason or exc.message}"
                ) from None
            ctx.guard.add_taint("mcp", name)  # the error's text is the server's
            raise ToolError(f"MCP server {name}: {exc.message}") from None
        except Exception as exc:  # an answer the SDK cannot parse, an input request it cannot serve
            raise ToolError(f"MCP server {name}: {describe(exc)}") from None
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._drained is not None:
                self._drained.set()
        ctx.guard.add_taint("mcp", name)
        return result

    def _resource_tools(self, servers: list[str]) -> tuple[Tool, Tool]:
        server_param = {"type": "string", "enum": servers, "description": "The MCP server."}

        async def list_resources(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            wanted = arguments.get("server")
            names = (
                [wanted] if isinstance(wanted, str) else [n for n in servers if n in self._servers]
            )
            parts = []
            for name in names:
                try:
                    server, conn = self._connected(name)
                except LookupError as exc:
                    raise ToolError(str(exc)) from None
                resources, templates = await self._request(server, conn, ctx, conn.list_resources)
                lines = [f"server {name}:"]
                for r in resources:
                    facts = ", ".join(
                        x for x in (r.mime_type, f"{r.size:,} bytes" if r.size else None) if x
                    )
                    extra = f" ({facts})" if facts else ""
                    lines.append(
                        f"  {r.uri} — {r.name}{extra}: {first_line(r.description)}".rstrip(": ")
                    )
                for t in templates:
                    lines.append(
                        (
                            f"  {t.uri_template} — {t.name} (template): {first_line(t.description)}"
                        ).rstrip(": ")
                    )
                if len(lines) == 1:
                    lines.append("  (no resources)")
                parts.append("\n".join(lines))
            return cap_output("\n".join(parts), self.max_output_bytes)

        async def read_resource(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            try:
                server, conn = self._connected(str(arguments.get("server")))
            except LookupError as exc:
                raise ToolError(str(exc)) from None
            uri = str(arguments.get("uri"))
            result = await self._request(server, conn, ctx, lambda: conn.client.read_resource(uri))
            return convert.resource_result_text(result, self.max_output_bytes)

        return (
            Tool(
                "list_resources",
                "List the resources (files, records, documents) the MCP servers offer: "
                "URI, name, type.\n"
                "A URI template such as notes://{name} can be read with its parameters filled in.",
                list_resources,
                {"type": "object", "properties": {"server": server_param}},
                timeout_s=self.resource_timeout_s,
            ),
            Tool(
                "read_resource",
                (
                    "Read one resource of an MCP server by URI (see list_resources); "
                    "binary content is only described."
                ),
                read_resource,
                {
                    "type": "object",
                    "properties": {
                        "server": server_param,
                        "uri": {"type": "string", "description": "Its URI."},
                    },
                    "required": ["server", "uri"],
                },
                timeout_s=self.resource_timeout_s,
            ),
        )
