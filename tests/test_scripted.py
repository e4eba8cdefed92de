"""The scripted backend:
replay order, chunks, delays, retries through the base, errors, scenario files.

The retries of retryable steps are checked by the backend contract, tests/test_backend_contract.py.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest
import trio
import trio.testing

from kesoku.testing import ScriptedLLM, Step
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import (
    LLMEvent,
    LLMRequest,
    LLMTurn,
    StopEvent,
    TextBlock,
    TextDelta,
    ThoughtDelta,
    ToolCallEvent,
    UsageEvent,
)
from kesoku.vocab.model import Usage

REQUEST = LLMRequest(system="s", turns=(LLMTurn("user", (TextBlock("hi"),)),))


async def collect(llm: ScriptedLLM, *, stops: bool = False) -> list[LLMEvent]:
    """The events of a call; the step's stop reason only with ``stops``."""
    async with aclosing(llm.stream(REQUEST)) as events:
        return [e async for e in events if stops or not isinstance(e, StopEvent)]


async def test_a_step_streams_thought_text_calls_usage_in_order() -> None:
    llm = ScriptedLLM(
        [
            {
                "thought": "think",
                "signature": "c2ln",
                "text": ["a", "b"],
                "tool_calls": [{"name": "t", "arguments": {"x": 1}}, {"name": "u", "id": "given"}],
                "usage": {"input_tokens": 3, "output_tokens": 4},
            }
        ]
    )
    events = await collect(llm)
    assert events[:3] == [ThoughtDelta("think", b"sig", "scripted"), TextDelta("a"), TextDelta("b")]
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert [(c.name, c.arguments) for c in calls] == [("t", {"x": 1}), ("u", {})]
    assert calls[1].id == "given"
    assert calls[0].id.startswith("call_")
    assert events[-1] == UsageEvent(Usage(input_tokens=3, output_tokens=4))
    assert llm.requests == [REQUEST]


async def test_generated_call_ids_differ_between_instances() -> None:
    one, two = (
        ScriptedLLM([{"tool_calls": [{"name": "t"}]}]),
        ScriptedLLM([{"tool_calls": [{"name": "t"}]}]),
    )
    (a,), (b,) = await collect(one), await collect(two)
    assert isinstance(a, ToolCallEvent)
    assert isinstance(b, ToolCallEvent)
    assert a.call.id != b.call.id  # a restarted process replaying a script must not reuse ids


async def test_delays_use_the_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    llm = ScriptedLLM([{"text": ["a", "b"], "delay_s": 5}])
    start = trio.current_time()
    assert await collect(llm) == [TextDelta("a"), TextDelta("b")]
    assert trio.current_time() - start == pytest.approx(10)


async def test_errors_that_are_not_retried() -> None:
    llm = ScriptedLLM([{"error": {"message": "bad key", "status": 401, "retryable": True}}])
    with pytest.raises(BackendError, match="bad key") as info:
        await collect(llm)
    assert info.value.auth
    assert llm.calls == 1  # auth errors are never retried
    mid = ScriptedLLM(
        [{"text": "half", "error": {"message": "cut", "retryable": True}}, {"text": "never"}]
    )
    with pytest.raises(BackendError, match="cut"):
        await collect(mid)
    assert mid.calls == 1  # events were streamed: a retry would repeat them


async def test_exhaustion_loop_and_responder() -> None:
    once = ScriptedLLM([{"text": "a"}])
    await collect(once)
    with pytest.raises(BackendError, match="has 1 step and all were used"):
        await collect(once)
    looping = ScriptedLLM([{"text": "a"}, {"text": "b"}], loop=True)
    assert [await collect(looping) for _ in range(3)] == [
        [TextDelta("a")],
        [TextDelta("b")],
        [TextDelta("a")],
    ]
    responder = ScriptedLLM(responder=lambda request: Step(text=f"{len(request.turns)} turns"))
    assert await collect(responder) == [TextDelta("1 turns")]
    with pytest.raises(ValueError, match="not both"):
        ScriptedLLM([{"text": "a"}], responder=lambda r: Step())


def test_scenario_files_and_their_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(
        "model: demo\nloop: true\nsteps:\n  - text: hello\n  - events: [{sleep_s: 1}, {text: x}]\n"
    )
    llm = ScriptedLLM.from_yaml(good)
    assert (llm.model, llm.loop, len(llm.steps), llm.source) == ("demo", True, 2, str(good))
    cases = {
        "steps:\n  - txt: hello\n": (
            "bad.yaml: steps[0].txt: unknown key; did you mean 'text'? (known: text, thought,"
        ),
        "stpes: []\n": (
            "bad.yaml: stpes: unknown key; did you mean 'steps'? (known: model, loop, steps)"
        ),
        "steps:\n  - tool_calls: [{nmae: x}]\n": (
            "steps[0].tool_calls[0].nmae: unknown key; did you mean 'name'?"
        ),
        "steps:\n  - tool_calls: [{name: 3}]\n": (
            "bad.yaml: steps[0].tool_calls[0].name: expected str, got int"
        ),
        "model: demo\n": "bad.yaml: object missing required field steps",
        "steps:\n  - events: [{}]\n": "an event has exactly one of",
        "steps:\n  - {text: a, events: [{text: b}]}\n": "events: an explicit order",
        "steps: [\n": "bad.yaml:2:1: invalid YAML",
        "steps: []\n": "bad.yaml: steps: empty; a scenario needs at least one step",
    }
    bad = tmp_path / "bad.yaml"
    for text, expected in cases.items():
        bad.write_text(text)
        with pytest.raises(ConfigError) as info:
            ScriptedLLM.from_yaml(bad)
        assert expected in str(info.value), (text, str(info.value))
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="cannot read the scenario"):
        ScriptedLLM.from_yaml(tmp_path / "missing.yaml")
