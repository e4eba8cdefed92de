"""Drain a backend's stream in tests: every event, or the events before the error it ends with.

The stop reason that ends a reply (:class:`StopEvent`) is left out unless ``stops`` is set: the
tests of content compare whole event lists, the tests of stop reasons ask for it."""

from __future__ import annotations

from contextlib import aclosing

from kesoku.llm.base import BaseLLM
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import LLMEvent, LLMRequest, StopEvent


async def events_of(llm: BaseLLM, req: LLMRequest, *, stops: bool = False) -> list[LLMEvent]:
    async with aclosing(llm.stream(req)) as stream:
        return [event async for event in stream if stops or not isinstance(event, StopEvent)]


async def events_until_error(
    llm: BaseLLM, req: LLMRequest, *, stops: bool = False
) -> tuple[list[LLMEvent], BackendError]:
    seen: list[LLMEvent] = []
    try:
        async with aclosing(llm.stream(req)) as stream:
            async for event in stream:
                if stops or not isinstance(event, StopEvent):
                    seen.append(event)
    except BackendError as exc:
        return seen, exc
    raise AssertionError(f"no error after {seen}")
