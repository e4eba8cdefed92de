"""The two markers an answer may hold for a chat surface.

The markers are ``[file: /abs/path]`` and ``[question: … | …]``. One parser for every adapter
(Discord, Google Chat, the terminal), so the rules are the same everywhere:

- ``[file: /absolute/path]`` asks the adapter to send that file (only if
  :func:`kesoku.tools.paths.check_share` allows it; otherwise the adapter says why in one line).
- ``[question: Which one? | Option A | Option B]`` asks the user to choose; the choices become
  buttons or select menus (Discord) or a list (Google Chat). Every choice is kept (repeats once):
  an adapter that cannot show them all as buttons lists them in full. A question without choices
  is plain text.
- Inside a fenced code block (```` ``` ````) nothing is a marker: a model showing the syntax is not
  using it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_MARKER = re.compile(r"\[(file|question):\s*([^\]\n]*)\]")
_FENCE = re.compile(r"^\s*(```|~~~)", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class TextPart:
    """Plain answer text (markdown)."""

    text: str


@dataclass(frozen=True, slots=True)
class FilePart:
    """A file to send: ``path`` as the model wrote it (``check_share`` it before sending)."""

    path: str


@dataclass(frozen=True, slots=True)
class QuestionPart:
    """A question with choices."""

    text: str
    choices: tuple[str, ...]


Part = TextPart | FilePart | QuestionPart


def parse_reply(text: str) -> list[Part]:
    """Split an answer into text, files and questions, in order.

    Args:
        text: The model's answer.

    Returns:
        The parts; text parts are never empty or whitespace-only (the whitespace around a marker on
        its own line is dropped with it).
    """
    parts: list[Part] = []
    pending: list[str] = []

    def flush() -> None:
        chunk = "".join(pending).strip("\n")
        pending.clear()
        if chunk.strip():
            parts.append(TextPart(chunk))

    for inside_fence, segment in _fenced(text):
        if inside_fence:
            pending.append(segment)
            continue
        position = 0
        for match in _MARKER.finditer(segment):
            pending.append(segment[position : match.start()])
            position = match.end()
            kind, body = match.group(1), match.group(2).strip()
            if kind == "file" and body:
                flush()
                parts.append(FilePart(body))
            elif kind == "question":
                question, *choices = [piece.strip() for piece in body.split("|")]
                kept = tuple(dict.fromkeys(c for c in choices if c))
                if kept:
                    flush()
                    parts.append(QuestionPart(question, kept))
                else:
                    pending.append(question)
            else:
                pending.append(match.group(0))
        pending.append(segment[position:])
    flush()
    return parts


def _fenced(text: str) -> list[tuple[bool, str]]:
    """``(inside a code fence, text)`` runs; an unclosed fence runs to the end."""
    runs: list[tuple[bool, str]] = []
    inside = False
    position = 0
    for match in _FENCE.finditer(text):
        line_end = text.find("\n", match.end())
        boundary = match.start() if not inside else (len(text) if line_end < 0 else line_end + 1)
        runs.append((inside, text[position:boundary]))
        position = boundary
        inside = not inside
    runs.append((inside, text[position:]))
    return [(i, t) for i, t in runs if t]
