"""Drain a backend's stream in tests: every event, or the events before the error it ends with."""

from __future__ import annotations

from contextlib import aclosing

from kesoku.errors import BackendError
from kesoku.llm.base import BaseLLM
from kesoku.llm.ir import LLMEvent, LLMRequest


async def events_of(llm: BaseLLM, req: LLMRequest) -> list[LLMEvent]:
    async with aclosing(llm.stream(req)) as stream:
        return [event async for event in stream]


async def events_until_error(llm: BaseLLM, req: LLMRequest) -> tuple[list[LLMEvent], BackendError]:
    seen: list[LLMEvent] = []
    try:
        async with aclosing(llm.stream(req)) as stream:
            async for event in stream:
                seen.append(event)
    except BackendError as exc:
        return seen, exc
    raise AssertionError(f"no error after {seen}")
