"""Turn and session metrics: one struct every adapter renders the same way."""

from __future__ import annotations

from enum import StrEnum

import msgspec


class TurnState(StrEnum):
    """How a turn ended."""

    DONE = "done"
    """The model answered."""
    INTERRUPTED = "interrupted"
    """A new user message cut it; the worker pivoted to that message."""
    STOPPED = "stopped"
    """Someone stopped it (/stop, the stop button, Ctrl-C)."""
    STEP_LIMIT = "step_limit"
    """It reached ``agent.max_steps_per_turn`` model calls."""
    FAILED = "failed"
    """The model call or the runtime failed; the user was told why."""
    REPEATING = "repeating"
    """The model made a call again after it was told the call repeats (kesoku.agent.repeat)."""
    BUDGET = "budget"
    """A spend cap was reached before a model call (kesoku.observe.spend); the user was told
    which."""


_BADGES = {
    TurnState.DONE: "⚡",
    TurnState.INTERRUPTED: "🛑",
    TurnState.STOPPED: "🛑",
    TurnState.STEP_LIMIT: "🛑",
    TurnState.FAILED: "⚠",
    TurnState.REPEATING: "🛑",
    TurnState.BUDGET: "🛑",
}
_SUFFIXES = {
    TurnState.DONE: "",
    TurnState.INTERRUPTED: " (Interrupted)",
    TurnState.STOPPED: " (Interrupted)",  # the design's label for both; the state tells them apart
    TurnState.STEP_LIMIT: " (Step limit)",
    TurnState.FAILED: " (Failed)",
    TurnState.REPEATING: " (Repeating)",
    TurnState.BUDGET: " (Spend cap)",
}


class TurnMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """Figures of one finished turn and of its session.

    Attributes:
        session_id: The session.
        root_id: The user message that opened the turn.
        state: How the turn ended.
        session_turns: User turns processed in the session, this one included.
        context_tokens: Input tokens of the turn's last model call (the context window in use).
        tool_calls: Tool calls run in the turn.
        turn_tokens: Input plus output tokens of all the turn's model calls.
        model_calls: Model calls in the turn.
        turn_s: Wall time of the turn, seconds.
        spend: The session's spend and how near it is to its tightest cap (``$0.042 · 61% of
            budget.day_usd``); empty when nothing priced was spent and no cap applies.
    """

    session_id: str
    root_id: int
    state: TurnState
    session_turns: int
    context_tokens: int
    tool_calls: int
    turn_tokens: int
    model_calls: int
    turn_s: float
    spend: str = ""

    @property
    def badge(self) -> str:
        """⚡ for a finished turn, 🛑 for an interrupted or stopped one, ⚠ for a failed one."""
        return _BADGES[self.state]

    def render(self) -> str:
        """One line: ``⚡ turn 3 · context 12K · 2 tool calls · 15K tokens · $0.04 · 4.2 s``.

        A turn that did not end done says how after the figures: an interrupted or stopped one
        ``🛑 … (Interrupted)`` (the design's label for both), a failed one ``⚠ … (Failed)``, and
        ``(Step limit)``, ``(Repeating)``, ``(Spend cap)`` after 🛑.
        """
        calls = "1 tool call" if self.tool_calls == 1 else f"{self.tool_calls} tool calls"
        spend = f"{self.spend} · " if self.spend else ""
        return (
            f"{self.badge} turn {self.session_turns} · context {_k(self.context_tokens)} · "
            f"{calls} · {_k(self.turn_tokens)} tokens · {spend}{self.turn_s:.1f} s"
            f"{_SUFFIXES[self.state]}"
        )


def _k(tokens: int) -> str:
    """Tokens in integer K (the seed's unit), rounding up; below 1,000 the count itself.

    ``0K`` would read as "some", ``1K`` for 40 tokens as 25 times more.
    """
    return str(tokens) if tokens < 1000 else f"{-(-tokens // 1000)}K"
