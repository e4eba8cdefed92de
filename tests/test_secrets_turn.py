"""Whole turns where a real shell tool prints a token, a password URL and a secret of the daemon's
environment, and the model echoes them: none reaches the database file (and its WAL), a turn log,
the trace page, an export or what the model provider is sent (kesoku.config.redact at the
gateway)."""

from __future__ import annotations

import functools
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import msgspec
import pytest
import trio
import yaml
from runtime_harness import echo, serve_runtime
from test_cli_chat import environ, kesoku

from kesoku.config.redact import Redactor
from kesoku.config.settings import Config, load_config
from kesoku.host.build import build_runtime
from kesoku.llm.scripted import ScriptedLLM
from kesoku.observe.trace import render_trace
from kesoku.store import Store
from kesoku.vocab.events import TurnEnded
from kesoku.vocab.ir import ToolResultBlock
from kesoku.vocab.model import Kind, user_text

TOKEN = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
PASSWORD = "hunter2-Secret"
DEPLOY_TOKEN = "Zq9xVw7LmR2tY8pK"  # the value of $DEPLOY_TOKEN in the daemon's environment
OPENAI_KEY = "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2"
SECRETS = (TOKEN, PASSWORD, DEPLOY_TOKEN, OPENAI_KEY)
# The shell builds each secret from pieces, so only its output holds the whole value.
PRINT = (
    "printf '%s%s%s\\n' ghp_ 0123456789abcdefghij ABCDEFGHIJ012345;"
    " printf 'DATABASE_URL=%s:%s%s@%s\\n' postgres://app hunter2 -Secret db.internal/app;"
    " printf '%s%s\\n' Zq9xVw7L mR2tY8pK"
)
MASKED_OUTPUT = (
    "[redacted:github-token]\n"
    "DATABASE_URL=postgres://app:[redacted:password]@db.internal/app\n"
    "[redacted:$DEPLOY_TOKEN]\n"
)
STEPS = [
    {
        "thought": "Let me print the settings.",
        "tool_calls": [
            {"name": "shell", "arguments": {"command": PRINT}, "id": "call_print"},
            {"name": "shell", "arguments": {"command": f"echo {OPENAI_KEY}"}, "id": "call_echo"},
        ],
    },
    {
        "thought": f"The URL is postgres://app:{PASSWORD}@db.internal/app.",
        "text": f"Your token is {TOKEN} and the deploy token {DEPLOY_TOKEN}.",
    },
]


CONFIG = """
[agent]
llm = "scripted"
project_dir = "project"
[scripted]
path = "scenario.yaml"
"""
NOTES = f"Staging: postgres://app:{PASSWORD}@db.internal/app\n"


def setup(tmp_path: Path) -> Path:
    """A scripted chat whose project notes (AGENTS.md: the system prompt) hold the password too."""
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump({"model": "secrets", "steps": STEPS}))
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "AGENTS.md").write_text(NOTES)
    (tmp_path / "kesoku.toml").write_text(CONFIG)
    return tmp_path / "kesoku.toml"


def records(tmp_path: Path, store: Store, session_id: str) -> dict[str, bytes]:
    """The bytes of every record of the session: database (and WAL), turn logs, trace page."""
    files = {p.name: p.read_bytes() for p in tmp_path.glob("kesoku.db*") if p.is_file()}
    workspace = Path(next(s.workspace for s in store.list_sessions()))
    logs = sorted(workspace.glob("llm-turn-*.log.yaml"))
    assert len(logs) == 2  # one per model call
    files |= {p.name: p.read_bytes() for p in logs}
    files["trace.html"] = render_trace(store, session_id).encode()
    return files


def assert_no_secret(named: dict[str, bytes]) -> None:
    leaks = [(name, s) for name, data in named.items() for s in SECRETS if s.encode() in data]
    assert leaks == []


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    monkeypatch.setenv("DEPLOY_TOKEN", DEPLOY_TOKEN)
    return load_config(setup(tmp_path))


async def test_a_whole_turn_keeps_printed_secrets_out_of_every_record_and_the_request(
    tmp_path: Path, config: Config, store: Store
) -> None:
    # As `kesoku start` and `kesoku chat` build it (in a thread: it reads files).
    build = functools.partial(build_runtime, config, store, config_file=tmp_path / "kesoku.toml")
    rt = await trio.to_thread.run_sync(build)
    session = rt.gateway.open_session("terminal", "t")
    llm = rt.llm_for(session)
    assert isinstance(llm, ScriptedLLM)
    async with trio.open_nursery() as nursery:
        with rt.hub.subscribe() as events:
            await nursery.start(rt.serve)
            await rt.gateway.post(user_text(session.id, "show me the settings"))
            async for event in events:
                if isinstance(event, TurnEnded):
                    break
        nursery.cancel_scope.cancel()  # the turn-log writer writes what it has, then stops
    history = store.history(session.id)
    results = {m.parent_id: m.content for m in history if m.kind is Kind.TOOL_RESULT}
    calls = {m.metadata.call_id: m for m in history if m.kind is Kind.TOOL_CALL}
    assert MASKED_OUTPUT in results[calls["call_print"].id]
    # The call is stored and run with its masked arguments.
    echo_call = calls["call_echo"]
    assert echo_call.metadata.tool_arguments == {"command": "echo [redacted:openai-key]"}
    assert "\n[redacted:openai-key]\n" in results[echo_call.id]
    answer = "Your token is [redacted:github-token] and the deploy token [redacted:$DEPLOY_TOKEN]."
    assert history[-1].content == answer
    # In a thread: rendering the trace page reads and parses the turn logs.
    named = await trio.to_thread.run_sync(records, tmp_path, store, session.id)
    assert "kesoku.db-wal" in named  # the store is open: its WAL is read too
    sent = {f"request {i}": msgspec.json.encode(r) for i, r in enumerate(llm.requests, 1)}
    (print_result, _) = llm.requests[1].turns[-1].blocks  # what the model got back
    assert len(sent) == 2 and isinstance(print_result, ToolResultBlock)
    assert MASKED_OUTPUT in print_result.content
    system = llm.requests[0].system
    assert "Staging: postgres://app:[redacted:password]@db.internal/app" in system
    assert_no_secret(named | sent)


def test_the_cli_turn_trace_and_export_never_show_the_secrets(tmp_path: Path) -> None:
    setup(tmp_path)
    config = str(tmp_path / "kesoku.toml")
    chat = subprocess.run(
        [sys.executable, "-m", "kesoku", "chat", "-c", config, "show me the settings"],
        cwd=tmp_path,
        env=environ(tmp_path, DEPLOY_TOKEN=DEPLOY_TOKEN),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert chat.returncode == 0, chat.stderr
    with closing(Store(tmp_path / "kesoku.db")) as store:
        (session,) = store.list_sessions()
        named = records(tmp_path, store, session.id)
    trace = kesoku(tmp_path, "trace", session.id, "-o", "-")
    export = kesoku(tmp_path, "sessions", "export", session.id)
    assert (trace.returncode, export.returncode) == (0, 0), trace.stderr + export.stderr
    named |= {
        "kesoku trace": trace.stdout.encode(),
        "kesoku sessions export": export.stdout.encode(),
    }
    assert_no_secret(named)
    for name in ("kesoku trace", "kesoku sessions export", "llm-turn-2.log.yaml"):
        assert b"postgres://app:[redacted:password]@db.internal/app" in named[name], name
        assert b"[redacted:github-token]" in named[name], name


async def test_a_subagents_tool_results_reach_its_model_masked(tmp_path: Path) -> None:
    llm = ScriptedLLM(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"task": "read the token"}}]},
            {"tool_calls": [{"name": "echo", "arguments": {"text": f"token {TOKEN}"}}]},  # child
            {"text": f"The token is {TOKEN}."},  # the child's conclusion
            {"text": "Done."},
        ]
    )
    served = serve_runtime(tmp_path, llm, tools=[echo()], subagent_max_steps=3, redactor=Redactor())
    async with served as h:
        await h.say("go")
        await h.turn_end()
        history = h.history()
    # The child's history never passes the gateway: its tool results are masked as they are made.
    (result,) = llm.requests[2].turns[-1].blocks
    assert isinstance(result, ToolResultBlock)
    assert result.content == "token [redacted:github-token]"
    # Its conclusion is the subagent's tool result, masked by the gateway like any other.
    conclusion = next(m for m in history if m.kind is Kind.TOOL_RESULT)
    assert conclusion.content == "The token is [redacted:github-token]."
    assert_no_secret({"request 4": msgspec.json.encode(llm.requests[3])})
