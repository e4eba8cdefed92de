"""Start-up stays light: help screens and a scripted chat import no model SDK, discord or Pub/Sub.

Each case runs the real CLI entry point in a fresh interpreter and reports ``sys.modules`` at exit
(bench/startup_bench.py measures the time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from kesoku.testing.fakes import anthropic_api, gemini_api, gemini_replies, openai_api
from kesoku.testing.fakes.server import serve_app

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("anthropic", "google.genai", "openai", "discord", "google.cloud.pubsub_v1", "llama_cpp")
SDKS = {"claude": "anthropic", "gemini": "google.genai", "openai": "openai"}
# What a help screen never needs either: the runtime, the event loop, the input library.
HELP_NEEDS_NONE_OF = (
    *HEAVY,
    "trio",
    "prompt_toolkit",
    "kesoku.agent.runtime",
    "kesoku.host.daemon",
)

PROBE = """
import json, sys
from kesoku.cli import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
sys.stdout.flush()
with open(sys.argv[2], "w") as out:
    json.dump(sorted(sys.modules), out)
"""


def probe(args: list[str], report: Path) -> list[str]:
    """The command running the CLI with ``args`` and writing its ``sys.modules`` to ``report``."""
    return [sys.executable, "-c", PROBE, json.dumps(args), str(report)]


def probe_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "KESOKU_CONFIG"
    }


def loaded_modules(args: list[str], tmp_path: Path, *, cwd: Path = REPO) -> set[str]:
    report = tmp_path / "modules.json"
    result = subprocess.run(
        probe(args, report),
        cwd=cwd,
        env=probe_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert report.exists(), result.stderr
    return set(json.loads(report.read_text()))


def present(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [name for name in names if name in modules]


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["chat", "--help"],
        ["start", "--help"],
        ["service", "--help"],
        ["service", "install", "--help"],
    ],
)
def test_help_screens_import_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    assert present(loaded_modules(args, tmp_path), HELP_NEEDS_NONE_OF) == []


@pytest.mark.parametrize("args", [[], ["--help"], ["-h"], ["--version"]])
def test_the_overview_needs_neither_cyclopts_nor_rich(args: list[str], tmp_path: Path) -> None:
    assert present(loaded_modules(args, tmp_path), ("cyclopts", "rich", "msgspec", "trio")) == []


def test_the_overview_lists_exactly_the_commands_of_the_cli() -> None:
    from kesoku.cli import COMMANDS, build_app, overview

    registered = {name for name in build_app() if not name.startswith("-")}
    assert registered == {name for name, _, _ in COMMANDS}
    listed = overview().split("Commands:\n", 1)[1].split("\n\n", 1)[0]
    assert {line.split()[0] for line in listed.splitlines()} == registered


@pytest.mark.parametrize("group", ["sessions", "schedule", "mcp", "skills", "config", "service"])
def test_a_groups_help_gives_each_command_its_line(group: str) -> None:
    from kesoku.cli import build_app

    commands = {name for name in build_app()[group] if not name.startswith("-")}
    shown = subprocess.run(
        [sys.executable, "-m", "kesoku", group, "--help"],
        env=probe_env() | {"COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    rows = [line.strip("│ ").split(None, 1) for line in shown.splitlines() if line.startswith("│ ")]
    described = {row[0] for row in rows if len(row) == 2 and row[0] in commands}
    assert described == commands, shown  # each with its docstring's first line, not a bare name


def test_a_scripted_one_shot_chat_imports_no_sdk(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text("steps: [{text: 'hi there'}]\n")
    (tmp_path / "kesoku.toml").write_text(
        '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n'
    )
    modules = loaded_modules(
        ["chat", "-c", str(tmp_path / "kesoku.toml"), "hello"], tmp_path, cwd=tmp_path
    )
    assert "kesoku.agent.runtime" in modules  # it really ran
    assert present(modules, (*HEAVY, "prompt_toolkit")) == []


@asynccontextmanager
async def cloud_fake(llm: str) -> AsyncIterator[str]:
    """The wire fake of ``llm``'s API answering "Paris." on loopback; yields its config section."""
    if llm == "claude":
        claude = anthropic_api.AnthropicFake()
        claude.handler = lambda _body: anthropic_api.text_reply("Paris.")
        async with claude.serve() as url:
            yield f'[claude]\napi_key = "{claude.api_key}"\nbase_url = "{url}"\n'
    elif llm == "gemini":
        gemini = gemini_api.GeminiFake(handler=lambda _body: gemini_replies.answer("Paris."))
        async with serve_app(gemini.app) as url:
            yield f'[gemini]\napi_key = "test-key"\nbase_url = "{url}"\n'
    else:
        openai = openai_api.OpenAIFake()
        openai.handler = lambda _body: openai_api.text_reply("Paris.")
        async with openai.serve() as url:
            yield f'[openai]\napi_key = "{openai.api_key}"\nbase_url = "{url}"\n'


@pytest.mark.parametrize("llm", ["claude", "gemini", "openai"])
async def test_a_cloud_one_shot_chat_imports_its_sdk_without_unused_transports(
    llm: str, tmp_path: Path
) -> None:
    # the SDKs' aiohttp transport (asyncio) and httpcore2's HTTP/2 (h2) are never used: 100 ms each
    report = tmp_path / "modules.json"
    async with cloud_fake(llm) as section:
        (tmp_path / "kesoku.toml").write_text(section)
        args = ["chat", "-c", str(tmp_path / "kesoku.toml"), "--llm", llm, "capital of France?"]
        done = await trio.run_process(
            probe(args, report),
            cwd=tmp_path,
            env=probe_env() | {"XDG_STATE_HOME": str(tmp_path / "state")},
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert "Paris." in done.stdout.decode(), done.stderr.decode()
    modules = set(json.loads(report.read_text()))
    assert SDKS[llm] in modules
    others = [sdk for sdk in SDKS.values() if sdk != SDKS[llm]]
    assert present(modules, ("aiohttp", "h2", *others)) == []
