"""One Google Chat space answering 503 holds up only its own replies (the delivery lanes).

The real Chat client (google-apps-chat, REST) against the loopback fake (tests/fakes/chat_api.py),
a real runtime and SQLite file. The client retries a 503 (1 s, then 2 s, …): the space's lane
waits, the other space's replies go out meanwhile.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_gchat_adapter import REPORT, WEEKLY, final_texts, post_scheduled
from test_gchat_support import FakePubSub, gchat_running, texts

from kesoku.testing import ScriptedLLM, Step
from kesoku.vocab.ir import LLMRequest, TextBlock

LANES_LOG = "kesoku.delivery_lanes"
DOWN, UP = "spaces/AAAA", "spaces/BBBB"


async def test_a_space_answering_503_holds_up_only_its_own_replies(
    tmp_path: Path, pubsub: FakePubSub, caplog: pytest.LogCaptureFixture
) -> None:
    def respond(request: LLMRequest) -> Step:
        said = " ".join(b.text for t in request.turns for b in t.blocks if isinstance(b, TextBlock))
        return Step(text="A quiet week." if "Weekly" in said else "Nothing changed.")

    llm = ScriptedLLM(responder=respond)
    async with gchat_running(tmp_path, llm) as run:
        chat, store = run.chat, run.h.store
        assert run.adapter is not None
        run.adapter.delivery.lanes.stuck_after_s = 0.2

        def lane_lines(text: str) -> list[str]:
            lines = [r.getMessage() for r in caplog.records if r.name == LANES_LOG]
            return [line for line in lines if text in line]

        def shown(space: str) -> list[list[str]]:
            """The texts of the messages created in a space, in order."""
            made = [name for name in chat.placed if name.startswith(f"{space}/")]
            bodies = [r.body for r in chat.created() if r.path == f"/v1/{space}/messages"]
            return [texts(b or {}) for b in bodies[len(bodies) - len(made) :]]

        chat.unavailable.add(DOWN)
        await post_scheduled(run, DOWN, REPORT, 1)
        await chat.wait_for(lambda: DOWN in chat.unavailable_answers)
        await post_scheduled(run, UP, WEEKLY, 2)
        await chat.wait_for(lambda: len(shown(UP)) == 2)
        card, answer = shown(UP)
        assert card[0] == "⏰ Scheduler: Weekly summary"
        assert answer == ["A quiet week."]
        assert shown(DOWN) == [], "the other space's turn went out while this one answers 503"
        await chat.wait_for(lambda: lane_lines("still on its way"))
        assert lane_lines("still on its way") == [
            f"gchat: a reply to space {DOWN} is still on its way after 0.2 s; "
            "later replies there wait, other channels go on"
        ]

        chat.unavailable.discard(DOWN)
        await chat.wait_for(lambda: len(shown(DOWN)) == 3)
        card, notice, answer = shown(DOWN)
        assert card[0] == "⏰ Scheduler: Daily report"
        assert len(notice) == 1 and re.fullmatch(
            r"⏳ Replies here were delayed by \d+s\.", notice[0]
        )
        assert answer == ["Nothing changed."]
        card_name = next(name for name in chat.placed if name.startswith(f"{DOWN}/"))
        await chat.wait_for(lambda: "⚡" in " ".join(final_texts(run, card_name)))
        assert len(lane_lines("still on its way")) == 1
        assert lane_lines(f"space {DOWN} reached again")
        await run.stop()
        # Stopped: the cursor is past every message, with nothing held above it.
        assert store.get_cursor("adapter:gchat") == store.last_message_id()
        assert store.cursor_done("adapter:gchat") == []
