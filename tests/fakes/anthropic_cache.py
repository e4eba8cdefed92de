"""Prompt-cache accounting for the Anthropic wire fake: the usage the documented rules give.

Set ``AnthropicFake.input_usage = PromptCache(clock).usage`` and every successful reply's usage
carries ``input_tokens``, ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` as
Anthropic's documented breakpoint rules give them for the request body received ("Prompt caching",
https://platform.claude.com/docs/en/build-with-claude/prompt-caching; "Extended thinking",
https://platform.claude.com/docs/en/build-with-claude/extended-thinking; "Adaptive thinking",
https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking):

- The prompt is ``tools``, ``system``, then ``messages``, block by block; the prefix hash at a block
  covers every block up to and including it ("Prompt caching caches the full prefix").
- Writes happen only at breakpoints: a block's ``cache_control``, or a top-level ``cache_control``
  (automatic caching: the last block that is not thinking). A breakpoint whose prefix is shorter
  than the model's minimum cacheable length (:func:`min_cacheable_tokens`) writes nothing ("Cache
  limitations").
- Reads: from the last breakpoint back, each breakpoint checks at most 20 positions, itself the
  first, for an entry an earlier request wrote ("How automatic prefix checking works": the lookback
  window is 20 blocks; the lookback finds prior writes, not stable content).
- An entry lives 5 minutes (``"ttl": "1h"``: an hour) and is refreshed each time it is read.
- Thinking parameters (``thinking``: enabled or disabled, the budget, adaptive or not),
  ``tool_choice`` and the presence of images invalidate the messages part only ("What invalidates
  the cache"; Adaptive thinking, "Prompt caching"): they are hashed into every message block, not
  into tools or system. ``output_config.effort`` is not listed there and is not hashed. The model
  is hashed into every block.
- Models before Opus 4.5 and Sonnet 4.6, and every Haiku, strip the thinking blocks that come before
  the last user message with non-tool-result content; with thinking off, the current tool loop's
  thinking is stripped too ("Thinking block context removal"): stripped blocks are not part of the
  prefix and are not counted.
- ``cache_read_input_tokens`` is the prefix up to the hit, ``cache_creation_input_tokens`` the
  tokens from there to the last breakpoint written, ``input_tokens`` the rest ("Tracking cache
  performance": total = read + creation + input).

Tokens are counted with a simple deterministic rule, not Anthropic's tokenizer: a block costs
``ceil(characters / 4)`` of its compact JSON (``cache_control`` left out).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

LOOKBACK_BLOCKS = 20
"""Positions a breakpoint checks for an earlier write, itself the first."""
TTL_S = {"5m": 300.0, "1h": 3600.0}
"""An entry's lifetime per ``cache_control.ttl`` (default ``5m``)."""
_THINKING = ("thinking", "redacted_thinking")


def _version(model: str) -> tuple[str, tuple[int, int] | None]:
    """The family (opus, sonnet, haiku, fable, mythos) and the version of a model id."""
    name = model.rsplit("/", 1)[-1].split("@", 1)[0].lower()
    family = next((f for f in ("opus", "sonnet", "haiku", "fable", "mythos") if f in name), "")
    numbers = [int(p) for p in re.split(r"[-.]", name) if p.isdigit() and len(p) <= 2]
    version = (numbers[0], numbers[1] if len(numbers) > 1 else 0) if numbers else None
    return family, version


def min_cacheable_tokens(model: str) -> int:
    """The model's minimum cacheable prompt length ("Prompt caching", "Cache limitations").

    512 for Claude Fable 5, Mythos 5 and Opus 5 on; 2,048 for Mythos Preview, Opus 4.7 and Haiku
    3.5; 4,096 for Opus 4.5, Opus 4.6 and Haiku 4.5; 1,024 for the others (Opus 4.8, the Sonnets,
    Opus 4.1 and 4).
    """
    family, version = _version(model)
    if family in ("fable", "mythos"):
        return 2048 if version is None else 512
    if family == "opus" and version is not None:
        if version >= (5, 0):
            return 512
        if version == (4, 7):
            return 2048
        if (4, 5) <= version <= (4, 6):
            return 4096
    if family == "haiku":
        return 4096 if version is not None and version >= (4, 5) else 2048
    return 1024


def keeps_thinking(model: str) -> bool:
    """Whether earlier turns' thinking blocks stay in context (Opus 4.5+, Sonnet 4.6+, newer)."""
    family, version = _version(model)
    if family in ("fable", "mythos"):
        return True
    if family == "opus":
        return version is not None and version >= (4, 5)
    if family == "sonnet":
        return version is not None and version >= (4, 6)
    return False


@dataclass
class _Entry:
    expires_at: float


@dataclass(frozen=True)
class Accounted:
    """What one request read, wrote and sent uncached.

    Attributes:
        total: Every input token (read + written + uncached).
        read: ``cache_read_input_tokens``.
        written: ``cache_creation_input_tokens``.
        uncached: ``input_tokens``.
        thinking: The request's ``thinking`` and ``output_config`` as compact JSON.
        breakpoints: How many breakpoints the request had.
        hit: The flat block position of the cache hit, -1 for none.
        blocks: How many blocks the prompt had (after stripping).
    """

    total: int
    read: int
    written: int
    uncached: int
    thinking: str
    breakpoints: int
    hit: int
    blocks: int


@dataclass
class _Block:
    hash: bytes
    tokens: int
    ttl: str | None  # None: not a breakpoint


@dataclass
class PromptCache:
    """The cache of one workspace, fed request bodies in the order the API receives them.

    Args:
        clock: Seconds now (the test's wall clock; entries expire by it).

    Attributes:
        records: One :class:`Accounted` per request, in order.
    """

    clock: Callable[[], float]
    records: list[Accounted] = field(default_factory=list)
    _entries: dict[bytes, _Entry] = field(default_factory=dict)

    def usage(self, body: dict[str, Any]) -> dict[str, int]:
        """Account one request; returns the input part of its usage (Messages API field names)."""
        model = str(body.get("model", ""))
        blocks = _blocks(body)
        prefix: list[int] = []
        running = 0
        for block in blocks:
            running += block.tokens
            prefix.append(running)
        now = self.clock()
        breakpoints = [i for i, b in enumerate(blocks) if b.ttl is not None]
        hit = self._lookup(blocks, breakpoints, now)
        read = prefix[hit] if hit >= 0 else 0
        if hit >= 0:
            entry = self._entries[blocks[hit].hash]
            entry.expires_at = max(entry.expires_at, now + TTL_S["5m"])
        minimum = min_cacheable_tokens(model)
        written_to = 0
        for i in breakpoints:
            if prefix[i] < minimum:
                continue
            block = blocks[i]
            expires = now + TTL_S.get(block.ttl or "5m", TTL_S["5m"])
            entry = self._entries.setdefault(block.hash, _Entry(expires))
            entry.expires_at = max(entry.expires_at, expires)
            written_to = max(written_to, prefix[i])
        total = running
        cached_to = max(read, written_to)
        record = Accounted(
            total=total,
            read=read,
            written=max(0, written_to - read),
            uncached=total - cached_to,
            thinking=_compact(
                {"thinking": body.get("thinking"), "output_config": body.get("output_config")}
            ),
            breakpoints=len(breakpoints),
            hit=hit,
            blocks=len(blocks),
        )
        self.records.append(record)
        return {
            "input_tokens": record.uncached,
            "cache_read_input_tokens": record.read,
            "cache_creation_input_tokens": record.written,
        }

    def _lookup(self, blocks: Sequence[_Block], breakpoints: Sequence[int], now: float) -> int:
        """The longest live entry in the lookback windows, from the last breakpoint back."""
        for b in reversed(breakpoints):
            for i in range(b, max(b - LOOKBACK_BLOCKS, -1), -1):
                entry = self._entries.get(blocks[i].hash)
                if entry is not None and entry.expires_at > now:
                    return i
        return -1

    @property
    def read_share(self) -> float:
        """The share of all input tokens read from the cache."""
        total = sum(r.total for r in self.records)
        return sum(r.read for r in self.records) / total if total else 0.0


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def block_tokens(block: dict[str, Any]) -> int:
    """The fake's token count of a block: 4 characters a token of its JSON."""
    return (len(_compact({k: v for k, v in block.items() if k != "cache_control"})) + 3) // 4


def _ttl(block: dict[str, Any]) -> str | None:
    control = block.get("cache_control")
    return str(control.get("ttl", "5m")) if isinstance(control, dict) else None


def _blocks(body: dict[str, Any]) -> list[_Block]:
    """The prompt's blocks in cache order, each with its cumulative prefix hash."""
    model = str(body.get("model", ""))
    out: list[_Block] = []
    digest = hashlib.blake2b(model.encode(), digest_size=16).digest()

    def add(block: dict[str, Any], salt: str, ttl: str | None) -> None:
        nonlocal digest
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        digest = hashlib.blake2b(
            digest + (salt + _compact(plain)).encode(), digest_size=16
        ).digest()
        out.append(_Block(digest, block_tokens(block), ttl))

    for tool in body.get("tools") or ():
        add(tool, "tool", _ttl(tool))
    system = body.get("system")
    if isinstance(system, str) and system:
        system = [{"type": "text", "text": system}]
    for block in system or ():
        add(block, "system", _ttl(block))
    messages = [_content(m) for m in body.get("messages") or ()]
    messages = _strip_thinking(messages, model, thinking_on=_thinking_on(body))
    images = any(b.get("type") == "image" for _, content in messages for b in content)
    # Thinking parameters, tool_choice and images invalidate the messages part only.
    salt = _compact([body.get("thinking"), body.get("tool_choice"), images])
    for i, (role, content) in enumerate(messages):
        for j, block in enumerate(content):
            add(block, f"{salt}|{i}|{role}|{j == 0}", _ttl(block))
    control = body.get("cache_control")
    if isinstance(control, dict):  # automatic caching: the last block that can be cached
        flat = [b for _, content in messages for b in content]
        for k in range(len(flat) - 1, -1, -1):
            if flat[k].get("type") not in _THINKING:
                at = len(out) - len(flat) + k
                if out[at].ttl is None:
                    out[at].ttl = str(control.get("ttl", "5m"))
                break
    return out


def _content(message: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    return str(message.get("role")), list(content or ())


def _thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def _strip_thinking(
    messages: list[tuple[str, list[dict[str, Any]]]], model: str, *, thinking_on: bool
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The messages as the model reads them: stripped thinking blocks left out (see the module)."""
    last_user = -1
    for i, (role, content) in enumerate(messages):
        if role == "user" and any(b.get("type") != "tool_result" for b in content):
            last_user = i
    keep_earlier = keeps_thinking(model)
    out = []
    for i, (role, content) in enumerate(messages):
        strip = (i < last_user and not keep_earlier) or (i > last_user and not thinking_on)
        if role == "assistant" and strip:
            content = [b for b in content if b.get("type") not in _THINKING]
        out.append((role, content))
    return out


__all__ = [
    "LOOKBACK_BLOCKS",
    "Accounted",
    "PromptCache",
    "block_tokens",
    "keeps_thinking",
    "min_cacheable_tokens",
]
