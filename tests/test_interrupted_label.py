"""A stopped or interrupted turn reads the same in both chat headers: 🛑 and "(Interrupted)".

The design's label for both; the turn's state (and the trace page's badge) still tells them apart.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from google.apps import chat_v1
from kesoku_discord.convert import header_text
from kesoku_gchat import cards

from kesoku.vocab.metrics import TurnMetrics, TurnState

FIGURES = "turn 2 · context 2K · 1 tool call · 2K tokens · 3.0 s"
DONE = TurnMetrics(
    session_id="s",
    root_id=1,
    state=TurnState.DONE,
    session_turns=2,
    context_tokens=1200,
    tool_calls=1,
    turn_tokens=1500,
    model_calls=1,
    turn_s=3.0,
)


@pytest.mark.parametrize("state", [TurnState.STOPPED, TurnState.INTERRUPTED])
def test_a_stopped_or_interrupted_turn_shows_the_stop_sign_and_interrupted_on_both_chats(
    state: TurnState,
) -> None:
    metrics = msgspec.structs.replace(DONE, state=state)
    line = f"🛑 {FIGURES} (Interrupted)"
    assert metrics.badge == "🛑" and metrics.render() == line
    # Discord: the header's last line.
    assert header_text("⏰ Scheduler: check", metrics.render()) == f"⏰ Scheduler: check\n{line}"
    # Google Chat: the turn card's status, as the official client reads it.
    body = cards.turn_card(status=metrics.render(), entries=[], running=False)
    card = chat_v1.Message.from_json(json.dumps(body)).cards_v2[0].card
    assert card.sections[0].widgets[0].text_paragraph.text == line


def test_the_other_endings_keep_their_labels() -> None:
    rendered = {state: msgspec.structs.replace(DONE, state=state).render() for state in TurnState}
    assert rendered[TurnState.DONE] == f"⚡ {FIGURES}"
    assert rendered[TurnState.FAILED] == f"⚠ {FIGURES} (Failed)"
    assert rendered[TurnState.STEP_LIMIT] == f"🛑 {FIGURES} (Step limit)"
    assert rendered[TurnState.REPEATING] == f"🛑 {FIGURES} (Repeating)"
    assert rendered[TurnState.BUDGET] == f"🛑 {FIGURES} (Spend cap)"
