"""Token accounting for compaction: context windows, thresholds, and the size of a request.

A request's size is estimated from its characters (about 4 per token for English and code, the
providers' rule of thumb), a fixed cost per image and per document, and the JSON of the tool
schemas; the estimate is then calibrated per session by the provider-reported input tokens of the
last call (:class:`Calibration`), so the provider's own count stays the anchor and only what was
added since is estimated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kesoku.vocab.ir import (
    LLMRequest,
    LLMTurn,
    ToolSpec,
    head_tokens,
    turn_tokens,
)
from kesoku.vocab.transcript import TurnMemo

IMAGE_TOKENS = 1600
"""What one image costs, about: Claude bills ~1,600 tokens for a 1,092 px square, Gemini 258 per
tile."""
DOCUMENT_TOKENS = 3000
"""What one attached document costs before its size is known (a few PDF pages)."""
DEFAULT_WINDOW = 8192
"""Context window assumed for a model neither the table, the config nor its server knows: small on
purpose (llama.cpp's and many Ollama setups' size), since a guess too large means requests the
server cuts or refuses, and one too small only means earlier compaction."""
CHARS_PER_TOKEN = 4
"""The estimate's rule of thumb (:func:`kesoku.vocab.ir.turn_tokens`), used to turn tokens into
bytes."""

# Prefix of the model id → context window in tokens (the providers' model pages, 2026).
_WINDOWS: tuple[tuple[str, int], ...] = (
    ("claude-", 200_000),
    ("gemini-", 1_048_576),
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("o3", 200_000),
    ("o4", 200_000),
)


def known_window(
    windows: Mapping[str, int], provider: str, model: str, local_window: int
) -> int | None:
    """The context window of a model as Kesoku knows it without asking its server, in tokens.

    Args:
        windows: Per-model overrides (``compaction.context_windows``).
        provider: The backend; ``local`` uses ``local_window``.
        model: The model id.
        local_window: ``local.n_ctx``.

    Returns:
        Tokens, or None for a model neither the overrides nor the table know.
    """
    if model in windows:
        return windows[model]
    if provider == "local":
        return local_window
    return next((size for prefix, size in _WINDOWS if model.startswith(prefix)), None)


def reported_or_default(reported: int | None) -> int:
    """The window of a model nobody knows: what its server reported, else :data:`DEFAULT_WINDOW`."""
    return reported if reported is not None else DEFAULT_WINDOW


def estimate_turns(turns: Sequence[LLMTurn]) -> float:
    """Estimated tokens of some turns (uncalibrated)."""
    return sum(map(estimate_turn, turns))


def estimate_turn(turn: LLMTurn) -> float:
    """Estimated tokens of one turn (uncalibrated; :func:`kesoku.vocab.ir.turn_tokens`)."""
    return turn_tokens(turn, image_tokens=IMAGE_TOKENS, document_tokens=DOCUMENT_TOKENS)


def fixed_tokens(system: str, tools: Sequence[ToolSpec]) -> float:
    """Estimated tokens of a system prompt and tool schemas (uncalibrated)."""
    return head_tokens(system, tools)


def estimate_request(request: LLMRequest) -> float:
    """Estimated input tokens of a request (uncalibrated): system prompt, tool schemas and turns."""
    return fixed_tokens(request.system, request.tools) + estimate_turns(request.turns)


class TurnSizes:
    """:func:`estimate_turns` for a request growing step by step: only the new turns are measured.

    The turns of one session's requests are the same objects from call to call (see
    :class:`kesoku.vocab.transcript.Transcript`), so the sizes of the shared prefix (by identity)
    are reused (a :class:`~kesoku.vocab.transcript.TurnMemo` of running totals).
    """

    def __init__(self) -> None:
        self._sums: TurnMemo[float] = TurnMemo()  # running totals: tokens up to each turn

    def estimate(self, turns: Sequence[LLMTurn]) -> float:
        """Estimated tokens of ``turns`` (uncalibrated)."""
        sums = self._sums.update(turns, _add_turn)
        return sums[-1] if sums else 0.0


def _add_turn(total: float | None, turn: LLMTurn) -> float:
    # estimate_turn, without its call: once per turn of a worker's first request
    return (total or 0.0) + turn_tokens(
        turn, image_tokens=IMAGE_TOKENS, document_tokens=DOCUMENT_TOKENS
    )


class Calibration:
    """A session's ratio of provider-counted to estimated input tokens, from its last model call.

    The ratio is clamped to [0.5, 3]: a tokenizer far from 4 characters a token (CJK text, base64)
    moves it, a broken count does not.
    """

    def __init__(self) -> None:
        self.ratio = 1.0

    def update(self, estimated: float, input_tokens: int) -> None:
        """Learn from a finished call: its estimate (uncalibrated) and what the provider counted.

        Args:
            estimated: The estimate of the request as the backend sent it: system prompt and tools
                (:meth:`BaseLLM.head_tokens <kesoku.llm.base.BaseLLM.head_tokens>`) plus turns.
            input_tokens: The provider's count of its input.
        """
        if input_tokens > 0 and estimated > 0:
            self.ratio = min(3.0, max(0.5, input_tokens / estimated))

    def tokens(self, estimated: float) -> int:
        """Calibrated tokens of an estimate."""
        return math.ceil(estimated * self.ratio)
