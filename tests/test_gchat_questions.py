"""``[question: … | …]`` on Google Chat with many choices and long ones.

Chat shows a question's choices as a Markdown list in the answer card (one text paragraph, so no
button count nor a ``selectionInput``'s 100 items bound them), and the user answers by writing the
choice. The real Chat client against the loopback fake (tests/fakes/chat_api.py), the real runtime
with a scripted model.
"""

from __future__ import annotations

from pathlib import Path

from test_gchat_support import FakePubSub, gchat_running, message_event, texts

from kesoku.testing import ScriptedLLM
from kesoku.vocab.ir import TextBlock

LONG = "an option whose text runs well past what a button or a menu option can show: " + "x" * 90


async def test_thirty_choices_are_all_listed_in_full_and_the_thirtieth_reaches_the_agent(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    choices = [f"choice {n}" for n in range(1, 30)] + [LONG]
    llm = ScriptedLLM(
        [
            {"text": "[question: Which one? | " + " | ".join(choices) + "]"},
            {"text": "The long one."},
        ]
    )
    async with gchat_running(tmp_path, llm, reaction=None) as run:
        pubsub.publish(message_event("pick one"))
        await run.chat.wait_for(lambda: len(run.chat.created()) >= 2)
        answer = run.chat.created()[1]
        assert texts(answer.body) == ["**Which one?**\n" + "\n".join(f"- {c}" for c in choices)]
        pubsub.publish(message_event(LONG, name="spaces/AAAA/messages/M2.M2"))
        await run.until(lambda: len(llm.requests) >= 2)
        last = llm.requests[1].turns[-1]
        assert [b.text for b in last.blocks if isinstance(b, TextBlock)][-1].endswith(LONG)
        await run.chat.wait_for(
            lambda: any(texts(r.body) == ["The long one."] for r in run.chat.created())
        )
