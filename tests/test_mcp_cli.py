"""`kesoku mcp list` and `kesoku chat` with MCP servers in kesoku.toml,
as the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from kesoku_terminal.mcp_commands import bind_arguments
from test_cli_chat import Terminal

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
    assert lines[0] == (
        "t (stdio): connected: 12 tool(s), 1 prompt(s), resources (list_resources, read_resource)"
    )
    assert "  t__add" in [line[: len("  t__add")] for line in lines]
    assert any(
        line.startswith("  t__echo ") and line.endswith("Return the text unchanged.")
        for line in lines
    )
    assert "  prompt: /mcp t review code [language]  Ask for a review of some code." in lines
    assert (
        "bad (stdio): failed: the server process ended "
        "(stderr: RuntimeError: the server cannot start)" in lines
    )
    assert lines[-1] == "off (http): disabled"
    assert result.stderr == ""


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
