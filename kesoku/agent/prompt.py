"""The system prompt of a turn: persona, rules, tool snippets, skills, project notes, cwd and date.

The prompt is the head of every request, so it must not change between the turns of a session
unless the session's setup changed: providers cache a request's prefix, and a prompt that changed
every minute would make every turn rewrite the whole history to the cache (ARCHITECTURE.md, "A
stable prefix"). The date is given to the day.

Project notes are the AGENTS.md and CLAUDE.md files of the working directory, the convention coding
agents share; each is capped at :data:`MAX_NOTES_BYTES` so a huge file cannot crowd out the history.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from kesoku.tools.base import Tool
from kesoku.vocab.text import valid_text

NOTES_FILES = ("AGENTS.md", "CLAUDE.md")
"""Project notes read from the working directory, in this order."""
MAX_NOTES_BYTES = 32 * 1024
"""The most of one notes file that goes into the prompt."""

RULES = (
    "Rules:\n"
    "- Never claim to have done what you did not do.\n"
    "- Relative paths start at the working directory; writing outside the workspace asks the "
    "user.\n"
    "- A tool result opening with [lost] had an unknown effect: check before repeating it.\n"
    "- A message ending in [interrupted] was cut off: answer the newest.\n"
    "- [file: /absolute/path] on its own line sends that workspace file.\n"
    "- [question: Question? | choice 1 | choice 2] on its own line asks the user to choose.\n"
    "- [redacted:…] hides a secret: never write it into a file or command; edit around it or ask "
    "the user to set the value."
)
"""The rules of every prompt. Each word goes with every model call: a rule is here when the model
needs it and no tool's description or result says it (bench/overhead_bench.py counts it)."""


def read_notes(cwd: Path) -> list[tuple[str, str]]:
    """Return ``(file name, text)`` of each project notes file in ``cwd``.

    Each text is capped, UTF-8, lenient.
    """
    notes: list[tuple[str, str]] = []
    for name in NOTES_FILES:
        path = cwd / name
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_NOTES_BYTES + 1)
        except OSError:
            continue
        text = data[:MAX_NOTES_BYTES].decode("utf-8", "replace")
        if len(data) > MAX_NOTES_BYTES:
            text += f"\n[… {name} cut at {MAX_NOTES_BYTES} bytes]"
        notes.append((name, text.strip()))
    return notes


def build_system_prompt(
    *,
    persona: str,
    tools: Sequence[Tool],
    skills: Sequence[tuple[str, str]],
    notes: Sequence[tuple[str, str]],
    cwd: Path,
    now: dt.datetime,
) -> str:
    """Assemble the system prompt.

    Args:
        persona: ``agent.persona``.
        tools: The tools offered this turn (one snippet line each; the full schemas go with the
            request).
        skills: ``(name, description)`` of each available skill.
        notes: From :func:`read_notes`.
        cwd: The working directory.
        now: The local date (only the day and the time zone are used).

    Returns:
        The prompt text, valid UTF-8 (:func:`kesoku.vocab.text.valid_text`): a working directory
        whose name holds a byte that is not UTF-8 (the OS gives it as a lone surrogate) would
        otherwise fail every request.
    """
    parts = [persona.strip(), RULES]
    if tools:
        parts.append("Tools:\n" + "\n".join(f"- {t.snippet}" for t in tools))
    if skills:
        parts.append(
            "Skills (read one with use_skill):\n" + "\n".join(f"- {n}: {d}" for n, d in skills)
        )
    for name, text in notes:
        parts.append(f"<{name}>\n{text}\n</{name}>")
    parts.append(f"Working directory: {cwd}\nDate: {now:%A %Y-%m-%d %Z}".rstrip())
    return valid_text("\n\n".join(parts))
