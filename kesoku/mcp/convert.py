"""Provider-safe tool names for MCP tools, and MCP results as the text a model reads.

Names: every provider has a rule for tool names; the strictest together is
:data:`TOOL_NAME_RULE` (OpenAI and Claude: ``^[a-zA-Z0-9_-]{1,64}$``; Gemini: starts with a letter
or ``_``, at most 64). An MCP tool is offered as ``<server>__<tool>``: other characters become
``_``, a name too long is cut and given a hash of the original, and names that still collide get
``_2``, ``_3``… in the order of the original names, so the mapping does not depend on the order a
server lists its tools in. A server prefix never holds ``__`` (runs of ``_`` are made one), so names
of two servers never collide.

Results: the :class:`~kesoku.tools.base.Tool` interface returns text, so text blocks are kept,
embedded text resources are inlined under a header, and images, audio and blobs are described by
type and size (the bytes stay out of the context). Wire format: the MCP schema's ``ContentBlock``
(2025-11-25 and 2026-07-28 revisions), as the ``mcp_types`` package models it.

Only type names come from the SDK here (under TYPE_CHECKING): this module imports nothing heavy.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from kesoku.tools.output import cap_output

if TYPE_CHECKING:
    from mcp_types import (
        BlobResourceContents,
        CallToolResult,
        ContentBlock,
        GetPromptResult,
        ReadResourceResult,
        TextResourceContents,
    )

MAX_NAME_CHARS = 64
"""The longest tool name every provider accepts."""
TOOL_NAME_RULE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_-]{0,63}$")
"""A name every provider accepts (OpenAI, Claude, Gemini, llama.cpp's OpenAI-compatible server)."""
MAX_PREFIX_CHARS = 24
"""The longest server prefix: a long server name must leave room for its tools' names."""
SEPARATOR = "__"
"""Between the server prefix and the tool name (kesoku.toml documents ``<name>__<tool>``)."""
_HASH_CHARS = 8
_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_RUNS = re.compile(r"_+")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:_HASH_CHARS]


def _fit(name: str, limit: int, *original: str) -> str:
    """``name`` if it fits in ``limit`` characters, else its start and a hash of ``original``."""
    if len(name) <= limit:
        return name
    return f"{name[: limit - _HASH_CHARS - 1].rstrip('_')}_{_digest(*original)}"


def sanitize(text: str) -> str:
    """``text`` with each character outside ``[a-zA-Z0-9_-]`` replaced by ``_`` (``_`` if empty)."""
    return _BAD_CHARS.sub("_", text) or "_"


def server_prefixes(names: Sequence[str]) -> dict[str, str]:
    """The prefix of each server's tools, in config order.

    Args:
        names: The configured server names (unique, as the config guarantees).

    Returns:
        ``{server name: prefix}``: sanitized, runs of ``_`` made one, starting with a letter or
        ``_``, never ending with ``_`` (``mcp`` when nothing is left), at most
        :data:`MAX_PREFIX_CHARS`; a prefix already taken by an earlier server gets ``_2``, ``_3``… A
        prefix never holds ``__``, so the first ``__`` of an offered name ends it and two servers
        never offer the same name.
    """
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        base = _RUNS.sub("_", sanitize(name)).strip("_") or "mcp"
        if not (base[0].isascii() and base[0].isalpha()):
            base = "_" + base  # Gemini: a name starts with a letter or an underscore
        base = _fit(base, MAX_PREFIX_CHARS, name)
        prefix, n = base, 2
        while prefix in taken:
            suffix = f"_{n}"
            prefix, n = base[: MAX_PREFIX_CHARS - len(suffix)].rstrip("_") + suffix, n + 1
        taken.add(prefix)
        out[name] = prefix
    return out


def tool_names(prefix: str, originals: Iterable[str]) -> dict[str, str]:
    """The names one server's tools are offered under.

    Args:
        prefix: The server's prefix (from :func:`server_prefixes`).
        originals: The tools' names as the server lists them.

    Returns:
        ``{offered name: original name}``, every offered name matching :data:`TOOL_NAME_RULE`.
        Collisions after sanitizing are settled in sorted order of the original names: the first
        keeps the plain name, the next get ``_2``, ``_3``…
    """
    out: dict[str, str] = {}
    for original in sorted(set(originals)):
        base = _fit(f"{prefix}{SEPARATOR}{sanitize(original)}", MAX_NAME_CHARS, prefix, original)
        name, n = base, 2
        while name in out:
            suffix = f"_{n}"
            name, n = base[: MAX_NAME_CHARS - len(suffix)] + suffix, n + 1
        out[name] = original
    return out


# -- results --------------------------------------------------------------------------------------


def decoded_size(data: str) -> int:
    """Bytes encoded by a base64 string (without decoding it)."""
    data = data.strip()
    return max(0, len(data) * 3 // 4 - (len(data) - len(data.rstrip("="))))


def _resource_text(contents: TextResourceContents | BlobResourceContents) -> str:
    mime = contents.mime_type or "unknown type"
    if hasattr(contents, "text"):
        return f"[resource {contents.uri} ({mime})]\n{contents.text}"
    return f"[resource {contents.uri}: {mime}, {decoded_size(contents.blob):,} bytes, not shown]"


def block_text(block: ContentBlock) -> str:
    """One content block as text.

    Returns:
        The text of a text block; an embedded text resource under a ``[resource URI (type)]``
        header; ``[image: image/png, 1,234 bytes, not shown]`` for an image, audio or blob; a
        resource link as its URI, name, type, size and description.
    """
    if block.type == "text":
        return block.text
    if block.type == "image" or block.type == "audio":
        return f"[{block.type}: {block.mime_type}, {decoded_size(block.data):,} bytes, not shown]"
    if block.type == "resource":
        return _resource_text(block.resource)
    if block.type == "resource_link":
        facts = [f"name {block.name}"]
        if block.mime_type:
            facts.append(block.mime_type)
        if block.size is not None:
            facts.append(f"{block.size:,} bytes")
        described = f": {block.description}" if block.description else ""
        return f"[resource link {block.uri} ({', '.join(facts)}){described}]"
    # a block type newer than this code
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"


def call_result_text(result: CallToolResult, max_bytes: int) -> str:
    """The text of a ``tools/call`` result, capped at ``max_bytes`` (head and tail kept).

    Blocks are joined by newlines; a result with no blocks but ``structuredContent`` shows it as
    JSON; an empty result reads ``(no content)``. ``isError`` is the caller's to act on.
    """
    parts = [block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return cap_output("\n".join(parts) or "(no content)", max_bytes)


def resource_result_text(result: ReadResourceResult, max_bytes: int) -> str:
    """The text of a ``resources/read`` result: text contents inline, blobs described; capped."""
    parts = [_resource_text(contents) for contents in result.contents]
    return cap_output("\n\n".join(parts) or "(empty resource)", max_bytes)


def prompt_text(result: GetPromptResult) -> str:
    """A ``prompts/get`` result as one user message.

    Messages all from the user are joined by blank lines; a conversation with assistant turns keeps
    each message under a ``[user]`` / ``[assistant]`` line so the model sees who said what.
    """
    messages = result.messages
    if all(m.role == "user" for m in messages):
        return "\n\n".join(block_text(m.content) for m in messages)
    return "\n\n".join(f"[{m.role}]\n{block_text(m.content)}" for m in messages)
