"""Model fallback: ``agent.fallback = ["claude", "openai"]``, in order, after a backend gives up."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from typing import Any

from kesoku.llm.base import BaseLLM
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import LLMEvent, LLMRequest
from kesoku.vocab.spend import Meter

log = logging.getLogger(__name__)


class FallbackLLM(BaseLLM):
    """Streams from the first backend of a chain that answers.

    A backend gives up when its own retries are spent (or the error is not retryable); the next one
    then gets the same request. Once a backend has streamed an event, its failure is final:
    switching mid-answer would repeat or mix text. Every switch is logged with the error that caused
    it, so a wrong key behind a working fallback is still visible to the operator.

    Args:
        chain: The backends, first choice first (at least one).

    Attributes:
        provider: The first backend's name (what a session asked for).
        used: The provider of the backend that answered last.
    """

    def __init__(self, chain: Sequence[BaseLLM]) -> None:
        if not chain:
            raise ValueError("a fallback chain needs at least one backend")
        first = chain[0]
        super().__init__(first.model, max_retries=0)
        # Per instance: the chain's first choice.
        self.provider = first.provider  # type: ignore[misc]
        self.chain = tuple(chain)
        self.used = first.provider

    async def stream(
        self, request: LLMRequest, *, meter: Meter | None = None
    ) -> AsyncGenerator[LLMEvent, None]:
        """Stream from each backend in turn until one succeeds (see the class docstring).

        Each backend meters its own attempts with ``meter`` (its own model's price); a reached cap
        (:class:`~kesoku.vocab.spend.BudgetExceeded`) ends the chain, no other backend is tried.

        Raises:
            BackendError: The last backend's error when every backend gave up, or the error of a
                backend that failed after it had streamed events.
        """
        error: BackendError | None = None
        for n, llm in enumerate(self.chain):
            emitted = False
            try:
                async for event in llm.stream(request, meter=meter):
                    emitted = True
                    yield event
            except BackendError as exc:
                if emitted or n == len(self.chain) - 1:
                    raise
                error = exc
                log.warning(
                    "%s gave up (%s); falling back to %s",
                    llm.provider,
                    exc,
                    self.chain[n + 1].provider,
                )
                continue
            self.used = llm.provider
            self.calls = sum(b.calls for b in self.chain)
            return
        assert error is not None  # unreachable: the last backend raises or returns above
        raise error

    async def aclose(self) -> None:
        """Close every backend of the chain."""
        for llm in self.chain:
            await llm.aclose()

    async def _discover_window(self) -> int | None:
        """The first backend's window: the one a session asked for."""
        return await self.chain[0].context_window()

    # The chain's members build and parse their own requests.
    def _build_native_input(self, request: LLMRequest) -> Any:
        raise NotImplementedError

    def _call(self, native: Any) -> AsyncIterator[Any]:
        raise NotImplementedError

    def _parse(self, raw: Any) -> Iterable[LLMEvent]:
        raise NotImplementedError
