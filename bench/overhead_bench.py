"""Fixed overhead per model call: the default config's system prompt and tool schemas, in tokens.

Run: .venv/bin/python bench/overhead_bench.py [--tokenizer o200k|cl100k|gguf] [--persona TEXT]
[--run-code] [--show]   (o200k and cl100k need the bench group: uv pip install -p .venv --group
bench)

Every request opens with the same head: the system prompt (persona, rules, one snippet line per
tool, the skill list, the working directory and the date) and the tools' JSON schemas. The runtime
is built as ``kesoku chat`` builds it (:func:`kesoku.host.build.build_runtime` over the default
config, interactive, so the shell is offered whether or not an OS sandbox works here; a scripted
backend, which changes nothing in the head) and the head is read as a turn reads it
(:func:`kesoku.agent.turn.system_prompt`, ``rt.current_tools()``). The skills are the bundled ones
(their descriptions come from their SKILL.md files); the working directory is a fixed stand-in for
a session workspace, so runs compare; ``--persona`` measures another ``agent.persona``,
``--run-code`` adds run_code (off by default), ``--show`` prints the prompt and the tools' JSON.

Tokenizers: ``o200k`` (default) is o200k_base, the encoding of GPT-4o and later OpenAI models, from
the ``bpe-openai`` package, which ships its BPE file (``tiktoken`` downloads it at run time, which
fails offline; on the same file the two give the same ids). Claude's and Gemini's tokenizers are not
published and count the same text differently, so o200k_base is a reference, not the bill.
``cl100k`` is the GPT-4 encoding; ``gguf`` the bundled local model's own (SmolLM2, through
llama-cpp-python: ``kesoku[local]``, no bench group needed).

Tools are counted as the Claude backend sends them, ``{"name", "description", "input_schema"}``
each, as compact JSON. The OpenAI backend wraps each in ``{"type": "function", "function": {...}}``
(printed as a total, about 5 tokens a tool more); Gemini sends function declarations with
``parametersJsonSchema``. Each provider then renders tools into a prompt format of its own
(Anthropic adds a tool-use system prompt no client controls): these are the tokens Kesoku chooses.
Kesoku's own estimate (:func:`kesoku.vocab.ir.head_tokens`, 4 characters a token) is printed too.

Last measured (2026-12-02, o200k_base, default config: 10 tools, the 3 bundled skills), before and
after issue 20 item 3 (shorter rules, tool texts, snippets and bundled skill descriptions; no
``additionalProperties`` in the schemas; the persona ``You are Kesoku, an autonomous agent: act with
your tools, check your work, answer briefly and truthfully.``; the subagent's description in two
sentences):

    part                                before  after
    persona                                 27     24
    rules                                  219    141
    tool snippets (10 lines, header)       261     98
    skills (bundled SKILL.md texts)        180    103
    working directory and date              39     39
    system prompt, whole                   726    405
    read_file / write_file / edit_file  124/85/108  70/49/72
    list_dir / glob / grep              69/87/124   32/59/88
    shell                                  199    102
    list_skills / use_skill              68/86  36/37
    subagent                               126     84
    tools, whole                         1,078    630
    fixed overhead                       1,804  1,035   (target <= 1,200)
    as OpenAI sends the tools            1,128    681   (tools only)
    run_code, when enabled             133+25  89+18   (schema + snippet)
    the daemon (--daemon: + schedule)        -  1,199   (schedule: 145 + a 19-token snippet)
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from kesoku.agent.prompt import RULES
from kesoku.agent.turn import system_prompt
from kesoku.config.settings import load_config
from kesoku.host.build import build_runtime
from kesoku.store import Store
from kesoku.tools.base import Tool
from kesoku.vocab.ir import head_tokens

TARGET = 1200
"""Tokens of fixed overhead the default tools may cost (issue 20, item 3)."""
SCENARIO = "steps:\n  - text: ok\n"
WORKSPACE = "/home/ana/kesoku/sessions/5f0c2a9e4b7d1836"
"""A session workspace as the default config makes one (``sessions/<16 hex digits>``)."""


def tokenizer(name: str) -> Callable[[str], int]:
    """A function counting the tokens of a text with the named tokenizer."""
    if name in ("o200k", "cl100k"):
        try:
            # untyped, and absent unless the bench group is installed (mypy runs without it)
            bpe_openai: Any = importlib.import_module("bpe_openai")
        except ImportError:
            sys.exit(
                "bpe-openai is not installed: uv pip install -p .venv --group bench "
                "(or pass --tokenizer gguf)"
            )
        encoding = bpe_openai.get_encoding(f"{name}_base")
        return lambda text: len(encoding.encode(text))
    from kesoku.llm.local import default_model_path
    from llama_cpp import Llama

    llama = Llama(model_path=str(default_model_path()), vocab_only=True, verbose=False)
    return lambda text: len(llama.tokenize(text.encode(), add_bos=False, special=False))


def claude_tool(tool: Tool) -> str:
    """One tool as the Claude backend sends it, as compact JSON."""
    spec = {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}
    return json.dumps(spec, ensure_ascii=False, separators=(",", ":"))


def openai_tools(tools: Sequence[Tool]) -> str:
    """The tools as the OpenAI backend sends them (Chat Completions), as compact JSON."""
    specs: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]
    return json.dumps(specs, ensure_ascii=False, separators=(",", ":"))


def line(name: str, tokens: int, total: int = 0) -> None:
    share = f"{tokens / total:6.1%}" if total else ""
    print(f"  {name:<52} {tokens:>6,} {share}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", choices=("o200k", "cl100k", "gguf"), default="o200k")
    parser.add_argument("--persona", help="measure this agent.persona instead of the config's")
    parser.add_argument("--run-code", action="store_true", help="with run_code (off by default)")
    parser.add_argument("--show", action="store_true", help="print the prompt and the tools' JSON")
    parser.add_argument(
        "--daemon", action="store_true", help="the daemon's tools (schedule too), not kesoku chat's"
    )
    args = parser.parse_args()
    count = tokenizer(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "scenario.yaml").write_text(SCENARIO)
        run_code = "[run_code]\nenabled = true\n" if args.run_code else ""
        (folder / "kesoku.toml").write_text(
            f'[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n{run_code}'
        )
        config = load_config(folder / "kesoku.toml", env={})
        store = Store(folder / "kesoku.db")
        try:
            rt = build_runtime(
                config, store, config_file=folder / "kesoku.toml", interactive=not args.daemon
            )
            if args.persona is not None:
                rt.persona = args.persona
            session = store.create_session(
                "terminal", "bench", workspace_root=config.workspace.sessions_dir
            )
            # The same working directory on every run (a temporary folder's random name would move
            # the count by a few tokens): where a config in ~/kesoku puts a session.
            session = msgspec.structs.replace(session, workspace=WORKSPACE)
            prompt = system_prompt(rt, session)
            tools = rt.current_tools()
            cwd = rt.cwd(session)
            skills = rt.skills()
        finally:
            store.close()
    if args.show:
        print(prompt, "\n")
        for tool in tools:
            print(claude_tool(tool))
        print()

    sections = prompt.split("\n\n")
    persona = rt.persona.strip()
    snippets = "Tools:\n" + "\n".join(f"- {t.snippet}" for t in tools)
    tail = next(s for s in sections if s.startswith("Working directory:"))
    skill_part = next((s for s in sections if s.startswith("Skills")), "")
    system_total = count(prompt)
    schemas = {t.name: count(claude_tool(t)) for t in tools}
    tools_total = count("[" + ",".join(claude_tool(t) for t in tools) + "]")
    total = system_total + tools_total

    print(f"Tokenizer: {args.tokenizer}; {len(tools)} tools; working directory {cwd}")
    print("System prompt")
    line("persona (agent.persona)", count(persona), total)
    line("rules", count(RULES), total)
    line(f"tool snippets ({len(tools)} lines and the header)", count(snippets), total)
    for tool in tools:
        line(f"  - {tool.snippet[:46]}", count(f"- {tool.snippet}"))
    line(f"skills ({len(skills)}: the bundled ones)", count(skill_part), total)
    line("working directory and date", count(tail), total)
    line("system prompt, whole (parts + joins)", system_total, total)
    print("Tool schemas (Claude: name, description, input_schema; compact JSON)")
    for name, tokens in schemas.items():
        line(name, tokens, total)
    line("tools, whole (as one JSON array)", tools_total, total)
    print("Total")
    line("fixed overhead (system prompt + tools)", total)
    line("  without the skill list (not Kesoku's text)", total - count(skill_part))
    line("tools as the OpenAI backend sends them", count(openai_tools(tools)))
    estimate = head_tokens(prompt, [t.spec for t in tools])
    line("Kesoku's estimate (head_tokens, 4 chars a token)", estimate)
    verdict = "met" if total <= TARGET else "NOT met"
    print(f"  target (o200k_base): <= {TARGET:,} ({verdict} with {args.tokenizer})")


if __name__ == "__main__":
    main()
