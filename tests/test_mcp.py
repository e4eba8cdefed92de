"""The MCP client against real servers made with the `mcp` SDK: stdio subprocesses, Streamable HTTP.

The server is tests/data/mcp/server.py (MCPServer, what mcp 1.x called FastMCP). Each connection
starts a Python process that imports the SDK (about 1.5 s here), so the tests share a few
connections."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from runtime_harness import serve_runtime
from sandboxing import CONFINED, sandbox_for

from kesoku.config.settings import McpConfig, McpHttpServer, McpStdioServer
from kesoku.mcp.manager import McpManager
from kesoku.testing import ScriptedLLM
from kesoku.tools.base import StaticGuard, Tool, ToolContext
from kesoku.tools.execute import run_tool
from kesoku.tools.paths import PathGates
from kesoku.vocab.model import Kind, Outcome, Session

SERVER = Path(__file__).parent / "data" / "mcp" / "server.py"
CONNECT_S = 20.0
"""Generous: a server process's cold start imports the SDK (1.5 s warm, more on a busy machine)."""


def stdio(name: str = "t", *flags: str, **kwargs: Any) -> McpStdioServer:
    return McpStdioServer(
        name=name, command=sys.executable, args=(str(SERVER), "stdio", *flags), **kwargs
    )


def manager(*servers: McpStdioServer | McpHttpServer, **kwargs: Any) -> McpManager:
    kwargs.setdefault("connect_timeout_s", CONNECT_S)
    kwargs.setdefault("startup_wait_s", CONNECT_S)
    kwargs.setdefault("backoff_s", (0.2, 0.5))
    return McpManager(McpConfig(servers=servers), **kwargs)


@asynccontextmanager
async def serving(mgr: McpManager) -> AsyncIterator[McpManager]:
    async with trio.open_nursery() as nursery:
        await nursery.start(mgr.serve)
        yield mgr
        nursery.cancel_scope.cancel()


def tool(mgr: McpManager, name: str) -> Tool:
    found = {t.name: t for t in mgr.tools()}
    assert name in found, sorted(found)
    return found[name]


async def call(
    mgr: McpManager,
    session: Session,
    name: str,
    arguments: Mapping[str, object] | None = None,
    **kw: Any,
) -> tuple[str, Outcome, StaticGuard]:
    guard = kw.pop("guard", StaticGuard())
    ctx = ToolContext(session, Path("."), "call-1", guard)
    known = [t.name for t in mgr.tools()]
    text, outcome = await run_tool(tool(mgr, name), name, arguments or {}, ctx, known=known)
    return text, outcome, guard


async def wait_for(predicate: Any, timeout_s: float = CONNECT_S) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 (the manager's state has no event to wait on)
            await trio.sleep(0.05)


@asynccontextmanager
async def http_server() -> AsyncIterator[tuple[str, trio.Process]]:
    """The test server over Streamable HTTP on 127.0.0.1 (a free port); killed at the end."""
    async with trio.open_nursery() as nursery:
        command = [sys.executable, str(SERVER), "http"]
        run = functools.partial(trio.run_process, command, stdout=subprocess.PIPE, check=False)
        proc: trio.Process = await nursery.start(run)
        assert proc.stdout is not None
        line = b""
        with trio.fail_after(CONNECT_S):
            while not line.endswith(b"\n"):
                chunk = await proc.stdout.receive_some(100)
                assert chunk, "the HTTP server exited before listening"
                line += chunk
        try:
            yield f"http://127.0.0.1:{int(line.split()[1])}/mcp", proc
        finally:
            proc.kill()
            nursery.cancel_scope.cancel()


async def test_stdio_server_tools_results_resources_and_prompts(session: Session) -> None:
    mgr = manager(stdio("test srv", timeout_s=10.0), max_output_bytes=400)
    async with serving(mgr):
        [status] = mgr.statuses()
        assert status.state == "connected" and status.transport == "stdio"
        names = [t.name for t in mgr.tools()]
        # Namespaced, sanitized ("test srv" → test_srv), collisions settled in sorted original order
        # ("dotted.name" < "dotted_name"), an overlong name cut and hashed; resource tools at the
        # end.
        assert (
            names[0].startswith("test_srv__a_tool_with_a_very_long_name_that")
            and len(names[0]) == 64
        )
        assert names[1:4] == ["test_srv__add", "test_srv__attachments", "test_srv__big"]
        assert "test_srv__dotted_name" in names and "test_srv__dotted_name_2" in names
        assert names[-2:] == ["list_resources", "read_resource"]
        assert tool(mgr, "test_srv__add").parameters["required"] == ["a", "b"]
        assert tool(mgr, "test_srv__add").timeout_s == 10.0

        text, outcome, guard = await call(mgr, session, "test_srv__add", {"a": 2, "b": 40})
        assert (text, outcome) == ("42", Outcome.COMPLETED)
        assert [(s.kind, s.label) for s in guard.taint_sources()] == [("mcp", "test srv")]
        # dotted.name sorts first, so it keeps the plain name and maps back to itself.
        assert (await call(mgr, session, "test_srv__dotted_name"))[0] == "dotted ok"
        assert (await call(mgr, session, "test_srv__dotted_name_2"))[0] == "underscored ok"
        assert (await call(mgr, session, names[0]))[0] == "long ok"

        text, _, _ = await call(mgr, session, "test_srv__picture")
        assert text == "a red dot\n[image: image/png, 70 bytes, not shown]"
        text, _, _ = await call(mgr, session, "test_srv__attachments")
        assert text == (
            "[resource notes://inline (text/plain)]\ninline text\n"
            "[resource data://bytes: application/octet-stream, 300 bytes, not shown]"
        )
        text, outcome, guard = await call(mgr, session, "test_srv__fail", {"reason": "no good"})
        assert outcome is Outcome.FAILED and text.startswith("[failed] ") and "fail" in text
        assert guard.tainted  # an error's text comes from the server too
        text, _, _ = await call(mgr, session, "test_srv__big", {"size": 5000})
        assert (
            len(text.encode()) <= 400
            and text.startswith("HEAD")
            and text.endswith("TAIL")
            and "bytes cut" in text
        )

        text, outcome, guard = await call(mgr, session, "list_resources")
        assert outcome is Outcome.COMPLETED and guard.tainted
        assert text.splitlines() == [
            "server test srv:",
            "  notes://readme — readme (text/plain): The readme",
            "  data://logo — logo (image/png): A PNG",
            "  notes://{name} — note (template): A note by name",
        ]
        assert tool(mgr, "read_resource").parameters["properties"]["server"]["enum"] == ["test srv"]
        text, _, guard = await call(
            mgr, session, "read_resource", {"server": "test srv", "uri": "notes://readme"}
        )
        assert (
            text == "[resource notes://readme (text/plain)]\nHello from the readme."
            and guard.tainted
        )
        text, _, _ = await call(
            mgr, session, "read_resource", {"server": "test srv", "uri": "notes://today"}
        )
        assert text.endswith("note today")
        text, _, _ = await call(
            mgr, session, "read_resource", {"server": "test srv", "uri": "data://logo"}
        )
        assert text == "[resource data://logo: image/png, 70 bytes, not shown]"
        text, outcome, _ = await call(
            mgr, session, "read_resource", {"server": "nope", "uri": "x://y"}
        )
        assert outcome is Outcome.FAILED and "no MCP server named 'nope'" in text

        assert status.prompts == (
            ("review", "Ask for a review of some code.", (("code", True), ("language", False))),
        )
        rendered = await mgr.get_prompt("test srv", "review", {"code": "x = 1"})
        assert rendered == "Please review this python code:\nx = 1"


async def test_include_and_exclude_lists_pick_the_tools(session: Session) -> None:
    mgr = manager(
        stdio("a", include_tools=("echo", "add", "sleep")),
        stdio("b", exclude_tools=("crash",)),
    )
    async with serving(mgr):
        names = {t.name for t in mgr.tools()}
    assert {n for n in names if n.startswith("a__")} == {"a__echo", "a__add", "a__sleep"}
    assert "b__crash" not in names and "b__echo" in names


async def test_streamable_http_server(session: Session) -> None:
    async with http_server() as (url, proc):
        mgr = manager(McpHttpServer(name="web", url=url, headers={"X-Test": "1"}))
        async with serving(mgr):
            assert mgr.statuses()[0].state == "connected"
            text, outcome, guard = await call(mgr, session, "web__echo", {"text": "over http"})
            assert (text, outcome) == ("over http", Outcome.COMPLETED) and guard.tainted
            assert await mgr.get_prompt("web", "review", {"code": "y", "language": "go"}) == (
                "Please review this go code:\ny"
            )
            proc.kill()  # the server goes away: the next call finds out, the tools are withheld
            text, outcome, _ = await call(mgr, session, "web__echo", {"text": "again"})
            assert outcome is Outcome.FAILED and "MCP server web" in text
            await wait_for(lambda: mgr.statuses()[0].state == "failed")
            assert mgr.tools() == ()
            # The first error depends on which request saw the server go (a reset GET stream, a
            # POST); the retries cannot connect at all.
            await wait_for(
                lambda: "ConnectError: all attempts to connect" in (mgr.statuses()[0].error or "")
            )


async def test_runtime_offers_mcp_tools_and_taints_the_session(tmp_path: Path) -> None:
    mgr = manager(stdio("files"))
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "files__echo", "arguments": {"text": "from mcp"}}]},
            {"text": "done"},
        ]
    )
    async with serve_runtime(tmp_path, llm, tool_sources=[mgr]) as h:
        await h.say("go")
        await h.turn_end()
        results = [m for m in h.history() if m.kind is Kind.TOOL_RESULT]
        taint = h.store.taint_sources(h.session.id)
    assert "files__echo" in [t.name for t in llm.requests[0].tools]
    assert results[0].content == "from mcp" and results[0].metadata.outcome is Outcome.COMPLETED
    assert [(s.kind, s.label) for s in taint] == [("mcp", "files")]


async def test_a_call_in_flight_finishes_before_the_servers_stop(session: Session) -> None:
    mgr = manager(stdio("slow"))
    results: list[tuple[str, Outcome]] = []
    async with trio.open_nursery() as outer:
        with trio.CancelScope() as runtime_scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(mgr.serve)
                sleep = tool(mgr, "slow__sleep")

                async def shielded_call() -> None:
                    # A tool batch is shielded from the runtime's cancellation (ARCHITECTURE.md,
                    # "Task tree").
                    with trio.CancelScope(shield=True):
                        ctx = ToolContext(session, Path("."), "c", StaticGuard())
                        results.append(
                            await run_tool(sleep, sleep.name, {"seconds": 0.5}, ctx, known=[])
                        )

                outer.start_soon(shielded_call)
                await trio.sleep(0.1)
                runtime_scope.cancel()
        assert mgr.tools() == ()  # withdrawn at once
    assert results == [("slept", Outcome.COMPLETED)]


async def test_no_enabled_server_starts_nothing() -> None:
    mgr = manager(stdio("off", enabled=False))
    async with serving(mgr):
        assert mgr.tools() == ()
        assert [(s.name, s.state) for s in mgr.statuses()] == [("off", "disabled")]


@pytest.mark.parametrize("mode", CONFINED)
async def test_a_sandboxed_server_writes_only_its_folder_and_sees_no_secrets(
    session: Session, tmp_path: Path, mode: str
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("CANARY-MCP")
    folder = tmp_path / "srv"
    folder.mkdir()
    sandbox = sandbox_for(mode, tmp_path, gates=PathGates(home=home))
    mgr = manager(stdio("box", sandbox=True, cwd=str(folder)), sandbox=sandbox)
    async with serving(mgr):
        inside, _, _ = await call(
            mgr, session, "box__file", {"path": str(folder / "a.txt"), "text": "x"}
        )
        outside, _, _ = await call(
            mgr, session, "box__file", {"path": str(tmp_path / "b.txt"), "text": "x"}
        )
        secret, _, _ = await call(
            mgr, session, "box__file", {"path": str(home / ".ssh" / "id_rsa")}
        )
    assert inside == f"wrote {folder / 'a.txt'}"
    # refused, or written in the sandbox's private /tmp
    assert not (tmp_path / "b.txt").exists(), outside
    assert secret.startswith("error: ") and "CANARY" not in secret
    assert (folder / "a.txt").read_text() == "x"


async def test_a_server_that_asks_for_a_sandbox_does_not_start_without_one(tmp_path: Path) -> None:
    sandbox = sandbox_for("off", tmp_path)
    mgr = manager(stdio("box", sandbox=True), sandbox=sandbox, backoff_s=(30.0, 30.0))
    async with serving(mgr):
        await wait_for(lambda: mgr.statuses()[0].state == "failed")
        [status] = mgr.statuses()
    assert mgr.tools() == ()
    assert status.error is not None
    assert (
        'sandbox = true, but there is no OS sandbox: off ([sandbox] mode = "off")' in status.error
    )
