"""Text for the terminal: one line per tool call, tool result and status, the same in both modes.

Pure functions over messages: the one-shot and the interactive views differ only in where the lines
go (stdout/stderr vs the scrollback above the prompt) and how they are styled.
"""

from __future__ import annotations

from kesoku.vocab.model import Message, Outcome
from kesoku.vocab.text import plural

TOOL_ICON = "🛠"
RESULT_ICON = "📥"
THOUGHT_ICON = "💭"
SUMMARY_MAX_CHARS = 120
"""A tool result is shown as its first line, cut here: the whole result is in the log and the
trace."""
SPINNER_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
SPINNER_FRAME_S = 0.1
"""Time per spinner frame (the prompt redraws at this interval)."""

# The runtime writes non-completed results as "[outcome] text"; the outcome is shown separately.
_PREFIXES = tuple(f"[{o.value}] " for o in Outcome)


def tool_call_line(call: Message) -> str:
    """``🛠 shell(command='ls')``: the runtime's own summary of the call.

    The summary is already cut at 200 characters.
    """
    return f"{TOOL_ICON} {call.content}"


def tool_result_line(result: Message) -> str:
    """``📥 shell · completed · first line… (+12 lines)``.

    The outcome is always named, truthfully.
    """
    name = result.metadata.tool_name or result.sender
    outcome = result.metadata.outcome or Outcome.COMPLETED
    text = result.content
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("$ "):
        # the shell tool repeats its command line first: the call line shows it already
        lines = lines[1:]
    first = lines[0] if lines else "(no output)"
    if len(first) > SUMMARY_MAX_CHARS:
        first = first[: SUMMARY_MAX_CHARS - 1] + "…"
    more = f" (+{plural(len(lines) - 1, 'line')})" if len(lines) > 1 else ""
    return f"{RESULT_ICON} {name} · {outcome.value} · {first}{more}"


def spinner(elapsed_s: float) -> str:
    """The spinner frame for a moment.

    Every redraw thus shows the right one without a timer of its own.
    """
    return SPINNER_FRAMES[int(elapsed_s / SPINNER_FRAME_S) % len(SPINNER_FRAMES)]


def status_line(label: str, elapsed_s: float) -> str:
    """``⠋ running shell · 3 s``: what the agent is doing and for how long."""
    return f"{spinner(elapsed_s)} {label} · {int(elapsed_s)} s"
