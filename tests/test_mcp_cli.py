"""`kesoku mcp list` and `kesoku chat` with MCP servers in kesoku.toml,
as the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from test_cli_chat import Terminal, environ
from test_mcp import http_server

from kesoku.host.mcp_commands import bind_arguments
from kesoku.store import Store
from kesoku.vocab.model import Kind, Outcome

SERVER = Path(__file__).resolve().parent / "data" / "mcp" / "server.py"
CLEARED = (
    "KESOKU_CONFIG",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
)
SERVERS = f"""
[[mcp.servers]]
name = "t"
transport = "stdio"
command = '{sys.executable}'
args = ['{SERVER}', "stdio"]

[[mcp.servers]]
name = "bad"
transport = "stdio"
command = '{sys.executable}'
args = ['{SERVER}', "stdio", "--crash-at-start"]

[[mcp.servers]]
name = "off"
transport = "http"
url = "http://127.0.0.1:9/mcp"
enabled = false
"""


def kesoku(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED} | {
        "XDG_STATE_HOME": str(tmp_path / "state")
    }
    return subprocess.run(
        [sys.executable, "-m", "kesoku", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_mcp_list_shows_each_server_its_state_and_tools(tmp_path: Path) -> None:
    (tmp_path / "kesoku.toml").write_text(SERVERS)
    result = kesoku(tmp_path, "mcp", "list", "-c", "kesoku.toml", "--timeout", "20")
    assert result.returncode == 1, result.stderr  # one enabled server failed
    lines = result.stdout.splitlines()
    # Servers are shown as they answer: t and bad start at once, and either may be first.
    heading = lines.index(
        "t (stdio): connected: 12 tool(s), 1 prompt(s), resources (list_resources, read_resource)"
    )
    block = lines[heading + 1 : heading + 14]
    assert all(line.startswith("  ") for line in block)  # t's tools and prompt, under it
    assert "  t__add" in [line[: len("  t__add")] for line in block]
    assert any(
        line.startswith("  t__echo ") and line.endswith("Return the text unchanged.")
        for line in block
    )
    assert "  prompt: /mcp t review code [language]  Ask for a review of some code." in block
    assert (
        "bad (stdio): failed: the server process ended "
        "(stderr: RuntimeError: the server cannot start)" in lines
    )
    assert lines[-1] == "off (http): disabled"
    assert result.stderr == ""


HUNG_AND_WEB = f"""
[[mcp.servers]]
name = "hung"
transport = "stdio"
command = '{sys.executable}'
args = ['{SERVER}', "stdio", "--hang-at-start"]
timeout_s = 1

[[mcp.servers]]
name = "web"
transport = "http"
url = "{{url}}"
"""
HANG_GUARD_S = 15.0
"""Far over what the command takes (the hung server's 1 s, then 2 s for the SDK to stop it); far
under the 30 s of --timeout that a server's own timeout_s must override."""


async def test_mcp_list_shows_each_server_as_it_answers_within_its_own_timeout(
    tmp_path: Path,
) -> None:
    async with http_server() as (url, _):
        (tmp_path / "kesoku.toml").write_text(HUNG_AND_WEB.format(url=url))
        command = [sys.executable, "-m", "kesoku", "mcp", "list", "-c", "kesoku.toml"]
        proc = await trio.lowlevel.open_process(
            command,
            cwd=tmp_path,
            env=environ(tmp_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        out = err = b""
        try:
            with trio.fail_after(HANG_GUARD_S):
                while b"\n" not in out:
                    chunk = await proc.stdout.receive_some()
                    assert chunk, f"the command ended: {out!r}"
                    out += chunk
                # The healthy server, second in the config, is shown while the command still
                # waits for the first one.
                assert out.startswith(b"web (http): connected: 12 tool(s)"), out
                assert proc.poll() is None
                while chunk := await proc.stdout.receive_some():
                    out += chunk
                while chunk := await proc.stderr.receive_some():
                    err += chunk
                assert await proc.wait() == 1  # one enabled server did not connect
        finally:
            proc.kill()
    lines = out.decode().splitlines()
    assert any(
        line.startswith("  web__echo ") and line.endswith("Return the text unchanged.")
        for line in lines
    )
    # its own timeout_s (1 s), not the 30 s of --timeout
    assert lines[-1] == "hung (stdio): failed: no answer to the MCP handshake within 1 s"
    assert err == b""


def test_mcp_list_without_servers_says_how_to_add_one(tmp_path: Path) -> None:
    (tmp_path / "kesoku.toml").write_text("")
    result = kesoku(tmp_path, "mcp", "list", "-c", "kesoku.toml")
    assert result.returncode == 0
    assert result.stdout.startswith("no MCP servers configured: add a [[mcp.servers]] table")


def test_a_one_shot_chat_calls_an_mcp_tool(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(
        "model: mcp-demo\nsteps:\n"
        '  - tool_calls:\n      - {name: t__echo, arguments: {text: "from the MCP server"}}\n'
        '  - text: "done"\n'
    )
    config = '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n' + SERVERS
    (tmp_path / "kesoku.toml").write_text(config)
    result = kesoku(tmp_path, "chat", "-c", "kesoku.toml", "use the tool")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    # The failing server is reported on stderr in one line and does not stop the chat.
    assert "MCP server bad failed: the server process ended (stderr: RuntimeError" in result.stderr
    store = Store(tmp_path / "kesoku.db")
    try:
        [session] = store.list_sessions()
        results = [m for m in store.history(session.id) if m.kind is Kind.TOOL_RESULT]
        taint = store.taint_sources(session.id)
    finally:
        store.close()
    assert [(m.content, m.metadata.outcome) for m in results] == [
        ("from the MCP server", Outcome.COMPLETED)
    ]
    assert [(s.kind, s.label) for s in taint] == [("mcp", "t")]


def test_bind_arguments_takes_names_and_positions() -> None:
    spec = [("code", True), ("language", False)]
    assert bind_arguments(spec, ["x = 1"]) == {"code": "x = 1"}
    assert bind_arguments(spec, ["language=go", "x"]) == {"language": "go", "code": "x"}
    assert bind_arguments(spec, ["code=a=b", "go"]) == {"code": "a=b", "language": "go"}
    assert bind_arguments(spec, ["1+1=2"]) == {"code": "1+1=2"}  # not a name before "=": a value
    for words, error in (
        ([], "missing code"),
        (["x", "y", "z"], "too many values"),
        (["lang=go", "x"], "unknown argument 'lang'"),
        (["code=1", "code=2"], "code is given twice"),
    ):
        with pytest.raises(ValueError, match=error):
            bind_arguments(spec, words)


def test_a_prompt_becomes_the_message_of_an_interactive_chat(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text('model: mcp-demo\nsteps:\n  - text: "Looks fine."\n')
    config = '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n' + SERVERS
    (tmp_path / "kesoku.toml").write_text(config)
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.type("/mcp\r")
        term.wait_for("t (connected): 12 tools")
        term.wait_for("  /mcp t review code [language]  Ask for a review of some code.")
        term.wait_for("bad (failed): the server process ended")
        term.type("/mcp t review\r")
        term.wait_for("/mcp: missing code; usage: /mcp t review code [language]")
        term.type('/mcp t review "x = 1" language=go\r')
        term.wait_for("sending t's prompt review (33 characters) as your message")
        term.wait_for("Looks fine.")
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    store = Store(tmp_path / "kesoku.db")
    try:
        [session] = store.list_sessions()
        users = [m.content for m in store.history(session.id) if m.role == "user"]
        taint = store.taint_sources(session.id)
    finally:
        store.close()
    assert users == ["Please review this go code:\nx = 1"]
    assert [(s.kind, s.label) for s in taint] == [("mcp", "t")]
