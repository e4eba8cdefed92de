"""Everyday prompts answered by the bundled offline model via ``kesoku chat``, as a user runs it.

Run: .venv/bin/python bench/local_prompts_bench.py [--tools] [--only N,N] [--timeout-s S]
(needs kesoku[local]; about 1-2 minutes on 2 cores in plain mode, several in tools mode)

Each prompt is one one-shot ``kesoku chat "PROMPT"`` (a fresh process, as a user types it) in a
fresh temporary folder of its own, with no API key in the environment, so the factory picks the
bundled SmolLM2-135M model; ``--tools`` writes ``[local] tools = true`` in that folder's kesoku.toml
(the tools mode: the grammar-constrained JSON replies and the tool loop). Each prompt has a checker
of the correct answer (for the file prompt: the file exists in the session folder with the content
asked for). Per prompt it prints: correct or not, the wall time of the whole command (start-up and
model load included) and its CPU time (user + system: the figure to trust on a busy machine), the
model calls of the turn (the turn logs, one file per call, failed calls included), the input tokens
of those calls (the prompt the model evaluated, ~7 ms of CPU each), the tools offered on the first
call and the tool calls made, the exit code, and the start of the answer; then the totals.

Times depend on the machine; the greedy decoding makes the answers themselves repeatable.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

VENV_BIN = Path(sys.executable).parent
KESOKU = VENV_BIN / "kesoku"
CLEARED = (
    "KESOKU_CONFIG",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
)
"""What would make the factory pick another backend than the bundled model."""

Check = Callable[[str, Path], bool]
"""A checker: (the answer on stdout, the session folder) -> correct."""


def has(*words: str) -> Check:
    """Correct when every word appears (case-insensitive, whole words)."""
    patterns = [re.compile(rf"\b{re.escape(w)}\b", re.IGNORECASE) for w in words]
    return lambda answer, _: all(p.search(answer) for p in patterns)


def has_any(*words: str) -> Check:
    """Correct when one of the words appears (case-insensitive, whole words)."""
    checks = [has(w) for w in words]
    return lambda answer, folder: any(c(answer, folder) for c in checks)


def today(answer: str, _: Path) -> bool:
    """Today's date in any usual form: ISO, or the day, the month (name or number) and the year."""
    now = dt.date.today()
    if now.isoformat() in answer:
        return True
    month = rf"(?:{now:%B}|{now:%b}|0?{now.month})"
    day = rf"0?{now.day}(?:st|nd|rd|th)?"
    forms = (rf"\b{day}\W+{month}\W+{now.year}\b", rf"\b{month}\W+{day}\W+{now.year}\b")
    return any(re.search(form, answer, re.IGNORECASE) for form in forms)


def file_written(answer: str, folder: Path) -> bool:
    """notes.txt exists in the session folder and holds "hello"."""
    path = folder / "notes.txt"
    return path.is_file() and "hello" in path.read_text(errors="replace").lower()


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    check: Check


PROMPTS = (
    Prompt("arithmetic", "What is 17 * 23?", has("391")),
    Prompt("today's date", "What is today's date?", today),
    Prompt("capital", "What is the capital of France?", has("Paris")),
    Prompt("fact", "What is the largest planet in the solar system?", has("Jupiter")),
    Prompt("yes/no", "Is the Earth round? Answer yes or no.", has("yes")),
    Prompt("count", "How many days are in a week?", has_any("7", "seven")),
    Prompt("translation", "Translate 'thank you' into French.", has("merci")),
    Prompt(
        "summary",
        "Summarize in one sentence: The team meeting moved from Monday to Tuesday because the "
        "projector was broken. The budget for next year was approved.",
        has("Tuesday", "budget"),
    ),
    Prompt("list", "List the three primary colors.", has("red", "blue")),
    Prompt("division", "What is 100 divided by 4?", has_any("25", "twenty-five")),
    Prompt("create a file", "Create a file notes.txt containing the word hello.", file_written),
)


@dataclass(frozen=True)
class Outcome:
    correct: bool
    wall_s: float
    cpu_s: float
    model_calls: int
    input_tokens: int
    tools_offered: int
    tool_calls: int
    exit_code: int
    answer: str


def run(prompt: Prompt, *, tools: bool, timeout_s: float) -> Outcome:
    """One ``kesoku chat "PROMPT"`` in a fresh folder; the outcome from stdout and the turn logs."""
    with tempfile.TemporaryDirectory(prefix="kesoku-prompts-") as tmp:
        folder = Path(tmp)
        (folder / "kesoku.toml").write_text("[local]\ntools = true\n" if tools else "")
        env = {k: v for k, v in os.environ.items() if k not in CLEARED}
        env["XDG_STATE_HOME"] = str(folder / "state")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        try:
            done = subprocess.run(
                [str(KESOKU), "chat", "-c", str(folder / "kesoku.toml"), prompt.text],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            answer, code = done.stdout, done.returncode
            if code == 2:  # a setup error: nothing was asked
                raise SystemExit(f"kesoku chat failed to start: {done.stderr.strip()[-500:]}")
        except subprocess.TimeoutExpired:
            answer, code = "", -1
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        sessions = [p for p in (folder / "sessions").glob("[!.]*") if p.is_dir()]
        session = sessions[0] if len(sessions) == 1 else folder
        logs = sorted(session.glob("llm-turn-*.log.yaml"), key=_log_index)
        offered, calls, tokens = _log_figures(logs)
        return Outcome(
            correct=prompt.check(answer, session),
            wall_s=wall,
            cpu_s=cpu,
            model_calls=len(logs),
            input_tokens=tokens,
            tools_offered=offered,
            tool_calls=calls,
            exit_code=code,
            answer=" ".join(answer.split()),
        )


def _log_index(path: Path) -> int:
    digits = re.findall(r"\d+", path.name)
    return int(digits[-1]) if digits else 0


def _log_figures(logs: list[Path]) -> tuple[int, int, int]:
    """From the turn logs: (tools offered on the first call, tool calls made, input tokens)."""
    offered = calls = tokens = 0
    for n, path in enumerate(logs):
        entry = yaml.safe_load(path.read_text()) or {}
        if n == 0:
            offered = len(entry.get("tools") or ())
        response = entry.get("response") or {}
        calls += len(response.get("tool_calls") or ())
        tokens += ((response.get("usage") or {}).get("input_tokens")) or 0
    return offered, calls, tokens


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tools", action="store_true", help="write [local] tools = true")
    parser.add_argument("--only", default="", help="prompt numbers to run (1-based, comma list)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per prompt")
    args = parser.parse_args()
    chosen = [PROMPTS[int(n) - 1] for n in args.only.split(",")] if args.only else list(PROMPTS)

    mode = "tools ([local] tools = true)" if args.tools else "default (plain chat)"
    print(
        f"bundled-model prompts: {len(chosen)} prompts, {mode}, one `kesoku chat` each "
        f"(Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {dt.date.today()})"
    )
    print(
        f"{'#':>2}  {'prompt':<14} {'ok':<3} {'wall s':>6} {'cpu s':>5} {'calls':>5} "
        f"{'in tok':>6} {'tools':>5} {'used':>4} {'exit':>4}  answer"
    )
    outcomes: list[Outcome] = []
    for n, prompt in enumerate(chosen, 1):
        o = run(prompt, tools=args.tools, timeout_s=args.timeout_s)
        outcomes.append(o)
        answer = o.answer if len(o.answer) <= 50 else o.answer[:49] + "…"
        print(
            f"{n:>2}  {prompt.name:<14} {'yes' if o.correct else 'NO':<3} {o.wall_s:>6.1f} "
            f"{o.cpu_s:>5.1f} {o.model_calls:>5} {o.input_tokens:>6} {o.tools_offered:>5} "
            f"{o.tool_calls:>4} {o.exit_code:>4}  {answer!r}",
            flush=True,
        )
    walls = sorted(o.wall_s for o in outcomes)
    print(
        f"total: {sum(o.correct for o in outcomes)}/{len(outcomes)} correct, "
        f"{sum(walls):.1f} s wall (median {walls[len(walls) // 2]:.1f} s, max {walls[-1]:.1f} s), "
        f"{sum(o.cpu_s for o in outcomes):.1f} s CPU, {sum(o.model_calls for o in outcomes)} model "
        f"calls, {sum(o.input_tokens for o in outcomes):,} input tokens, "
        f"{sum(o.tool_calls for o in outcomes)} tool calls, "
        f"{sum(o.exit_code != 0 for o in outcomes)} non-zero exits"
    )


if __name__ == "__main__":
    main()
