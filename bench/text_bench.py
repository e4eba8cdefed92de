"""Valid-text benchmark: what the boundary check costs on already valid text (kesoku.vocab.text).

Run: .venv/bin/python bench/text_bench.py [--rounds R]

Every message the store writes goes through ``valid_message`` and every event a backend parses
through ``valid_event``; nearly all of it is valid, so what counts is the cost of finding that out.
Target: a message or an event costs a few µs, a small fraction of a store insert (~26 µs) and of
the runtime's ~0.5 ms loop overhead per tool round trip; a 32 KB tool output (the shell's cap) tens
of µs. The last lines show the slow path (text with a lone surrogate) for scale. Medians of R
rounds.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

import msgspec
from kesoku.vocab.ir import TextDelta, ToolCallBlock, ToolCallEvent, valid_event
from kesoku.vocab.model import Kind, Metadata, Outcome, Role, in_turn, user_text, valid_message
from kesoku.vocab.text import valid_text

from _util import median, per_call, report

OUTPUT_CHARS = 32_000
SHORT = (
    "The tests pass now; I changed `parse_reply` in kesoku/vocab/markup.py and ran pytest again."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    root_dir = Path(__file__).resolve().parent.parent / "kesoku"
    # mostly ASCII
    code = "".join(p.read_text() for p in sorted(root_dir.glob("*.py")))[:OUTPUT_CHARS]
    prose = ("Zoë’s café — naïve “quotes” " * 2000)[:OUTPUT_CHARS]  # Latin-1, BMP punctuation
    # wide characters and emoji
    cjk = ("検索結果: ファイルが見つかりません。😀 " * 2000)[:OUTPUT_CHARS]
    lone = code[: OUTPUT_CHARS - 1] + "\ud800"
    root = msgspec.structs.replace(user_text("s", "go"), id=1)  # as posted
    call = in_turn(
        root,
        Role.ASSISTANT,
        Kind.TOOL_CALL,
        "shell(command='pytest -q tests/test_markup.py')",
        metadata=Metadata(
            tool_name="shell", tool_arguments={"command": "pytest -q tests/", "timeout_s": 60}
        ),
    )
    result_meta = Metadata(tool_name="shell", call_id="c1", outcome=Outcome.COMPLETED)
    result = in_turn(root, Role.TOOL, Kind.TOOL_RESULT, code, parent_id=2, metadata=result_meta)
    answer = in_turn(root, Role.ASSISTANT, Kind.TEXT, SHORT)
    delta = TextDelta("Hello, ")
    event = ToolCallEvent(ToolCallBlock("call_1", "shell", {"command": "ls -la", "timeout_s": 30}))
    figures: dict[str, list[float]] = {}

    def measure(name: str, fn: Callable[[], object], calls: int) -> None:
        figures.setdefault(name, []).append(per_call(fn, calls))

    for _ in range(args.rounds):
        measure("valid_message(), a short answer", functools.partial(valid_message, answer), 5000)
        measure(
            "valid_message(), a tool call (content + arguments)",
            functools.partial(valid_message, call),
            5000,
        )
        measure(
            "valid_message(), a 32 KB tool result (code)",
            functools.partial(valid_message, result),
            500,
        )
        measure("valid_event(), a text delta", functools.partial(valid_event, delta), 5000)
        measure("valid_event(), a tool call", functools.partial(valid_event, event), 5000)
        for name, text in (("prose, Latin-1", prose), ("CJK and emoji", cjk)):
            measure(f"valid_text(), 32 KB of {name}", functools.partial(valid_text, text), 200)
        measure(
            "valid_text(), 32 KB with a lone surrogate (slow path)",
            functools.partial(valid_text, lone),
            200,
        )
    assert valid_message(call) is call
    assert valid_message(result) is result
    assert valid_event(event) is event
    assert valid_text(cjk) is cjk
    assert valid_text(prose) is prose
    assert valid_text(lone).endswith("\ufffd")
    for name, times in figures.items():
        report(name, median(times) * 1e6, "µs", "a few µs" if "32 KB" not in name else "")


if __name__ == "__main__":
    main()
