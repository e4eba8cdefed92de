"""A small MCP server for the tests, built with the `mcp` SDK's MCPServer (FastMCP in mcp 1.x).

Usage::

    python server.py stdio [--junk] [--only-junk] [--crash-at-start] [--hang-at-start]
    python server.py http            # prints "port N" on stdout once it listens on 127.0.0.1

The misbehaviours are for the client's tests: ``--junk`` prints lines that are not JSON-RPC on
stdout before serving (then serves normally), ``--only-junk`` prints junk and never answers,
``--crash-at-start`` writes a traceback-like line on stderr and exits 3, ``--hang-at-start`` never
reads its stdin."""

from __future__ import annotations

import base64
import os
import socket
import sys
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import (
    BlobResourceContents,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)

server = MCPServer("kesoku-test", instructions="A server for Kesoku's tests.", log_level="CRITICAL")


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(name="dotted.name")
def dotted() -> str:
    """A tool whose name no model provider accepts as is."""
    return "dotted ok"


@server.tool(name="dotted_name")
def underscored() -> str:
    """A tool whose name collides with dotted.name once sanitized."""
    return "underscored ok"


@server.tool(name="a_tool_with_a_very_long_name_that_goes_past_the_sixty_four_character_limit")
def long_named() -> str:
    """A tool whose namespaced name is too long for the providers."""
    return "long ok"


@server.tool()
def picture() -> list[TextContent | ImageContent]:
    """Return a caption and a 1x1 PNG."""
    return [
        TextContent(text="a red dot"),
        ImageContent(data=base64.b64encode(PNG).decode(), mime_type="image/png"),
    ]


@server.tool()
def attachments() -> list[EmbeddedResource]:
    """Return an embedded text resource and an embedded blob."""
    return [
        EmbeddedResource(
            resource=TextResourceContents(
                uri="notes://inline", mime_type="text/plain", text="inline text"
            )
        ),
        EmbeddedResource(
            resource=BlobResourceContents(
                uri="data://bytes",
                mime_type="application/octet-stream",
                blob=base64.b64encode(bytes(300)).decode(),
            )
        ),
    ]


@server.tool()
def big(size: int) -> str:
    """Return ``size`` characters: a head, x's and a tail."""
    return "HEAD" + "x" * max(0, size - 8) + "TAIL"


@server.tool()
def fail(reason: str) -> str:
    """Fail with the reason (an isError result)."""
    raise ValueError(reason)


@server.tool()
def crash() -> str:
    """Die in the middle of the call, saying why on stderr."""
    sys.stderr.write("fatal: the test server crashes on purpose\n")
    sys.stderr.flush()
    os._exit(3)


@server.tool()
def file(path: str, text: str = "") -> str:
    """Write ``text`` to ``path`` when given, else read it; an OSError comes back as text."""
    try:
        if text:
            with open(path, "w") as out:
                out.write(text)
            return f"wrote {path}"
        with open(path) as source:
            return source.read()
    except OSError as exc:
        return f"error: {exc.strerror}"


@server.tool()
async def sleep(seconds: float) -> str:
    """Answer after ``seconds``."""
    await anyio.sleep(seconds)
    return "slept"


@server.resource("notes://readme", name="readme", description="The readme", mime_type="text/plain")
def readme() -> str:
    """The readme's text."""
    return "Hello from the readme."


@server.resource("data://logo", name="logo", description="A PNG", mime_type="image/png")
def logo() -> bytes:
    """A binary resource."""
    return PNG


@server.resource(
    "notes://{name}", name="note", description="A note by name", mime_type="text/plain"
)
def note(name: str) -> str:
    """A templated resource."""
    return f"note {name}"


@server.prompt()
def review(code: str, language: str = "python") -> str:
    """Ask for a review of some code."""
    return f"Please review this {language} code:\n{code}"


def serve_http() -> None:
    """Serve Streamable HTTP on 127.0.0.1 (a free port, printed as ``port N``) until killed."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # before the port is announced: a client connecting early waits in the backlog
    print(f"port {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


def main(argv: list[str]) -> None:
    """Run as the flags say."""
    if "--crash-at-start" in argv:
        sys.stderr.write(
            "Traceback (most recent call last):\nRuntimeError: the server cannot start\n"
        )
        sys.exit(3)
    if "--hang-at-start" in argv:
        time.sleep(3600)  # noqa: TID251 (a separate process, not the event loop)
    if "--junk" in argv or "--only-junk" in argv:
        print("Starting the test server (a banner on stdout, not JSON-RPC)", flush=True)
    if "--only-junk" in argv:
        for _ in range(3600):
            print("still not JSON-RPC", flush=True)
            time.sleep(1)  # noqa: TID251
        return
    if argv and argv[0] == "http":
        serve_http()
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
