r"""Valid text at the boundary: what enters the IR or the store can be encoded as UTF-8.

A Python string may hold code points UTF-8 cannot encode: surrogates (U+D800 to U+DFFF). They come
from JSON, whose ``\ud800`` escape every decoder here accepts (``json``, the provider SDKs, chat
platforms' payloads), from a stream cut between the two halves of an escaped pair, and from OS data
decoded with ``surrogateescape`` (file names, command lines, the environment: an invalid byte 0xFF
becomes U+DCFF). Everything downstream encodes strictly and raises ``UnicodeEncodeError``: SQLite
(apsw), msgspec JSON and msgpack (metadata, the turn-log writer's jobs), the YAML turn log, the
terminal, the providers' request bodies.

So text is made valid once, where it enters (ARCHITECTURE.md, "Valid text"): each backend's
events (:func:`kesoku.vocab.ir.valid_event`, in the one stream loop of
:class:`kesoku.llm.base.BaseLLM`) and the JSON the backends decode themselves
(:func:`decode_json`), each tool result (:func:`kesoku.tools.execute.run_tool`) and tool
description, the system prompt, every message and session the store writes
(:func:`kesoku.vocab.model.valid_message`), provider error messages
(:class:`kesoku.vocab.errors.BackendError`). Bytes are decoded with ``errors="replace"`` where they
are read (tool output, files, piped input). Text that is already valid, nearly all of it, is
returned as the same object after one check.

:func:`plural` is the one way a message puts a count before its noun (``1 turn``, ``2 turns``).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode

REPLACEMENT = "\ufffd"
"""What an unencodable code point or an invalid byte becomes (U+FFFD REPLACEMENT CHARACTER)."""


def valid_text(text: str) -> str:
    r"""``text`` made encodable as UTF-8: the same object when it already is.

    A high surrogate followed by a low one (an escaped pair that arrived as two code points, such as
    ``"\ud83d\ude00"``) becomes the character they encode; every other surrogate becomes U+FFFD.

    Args:
        text: Any string.

    Returns:
        A string that ``str.encode("utf-8")`` accepts.
    """
    if text.isascii():  # a flag of the string, not a scan
        return text
    try:
        text.encode("utf-8")  # the check itself: in C, 4 to 6 times faster than a regex search
    except UnicodeEncodeError:
        # UTF-16 with surrogatepass pairs the halves that belong together; decoding replaces
        # the rest.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def valid_data(value: T) -> T:
    """A JSON-like value (dicts, lists, tuples, strings, numbers) with every string made valid.

    Keys are made valid too. A container without an invalid string is returned as the same object.

    Args:
        value: Decoded JSON (tool arguments, metadata fields), or any value: what is not a string or
            a container is returned as it is.

    Returns:
        The value, with :func:`valid_text` applied to every string in it.
    """
    if isinstance(value, str):
        return valid_text(value)  # type: ignore[return-value]  # a str in, a str out
    if value is None or isinstance(value, bool | int | float):
        return value
    try:
        _encode(value)  # the check, in C: a lone surrogate anywhere in it fails the encoding
    except Exception:  # UnicodeEncodeError, or a value JSON cannot hold: look at each part
        pass
    else:
        return value
    if isinstance(value, dict):
        items = [(valid_data(k), valid_data(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)  # type: ignore[return-value]  # a dict in, a dict out
    if isinstance(value, list | tuple):
        values = [valid_data(v) for v in value]
        if all(v is v0 for v, v0 in zip(values, value, strict=True)):
            return value
        out = list(values) if isinstance(value, list) else tuple(values)
        return out  # type: ignore[return-value]
    return value


def decode_json(data: str | bytes) -> Any:
    r"""Decode JSON from outside (a provider's stream event, a tool call's arguments), text valid.

    msgspec decodes nearly all of it. It refuses two things the standard library's json accepts:
    an escaped lone surrogate (``"\ud800"``, reported as "Input data was truncated") and, in a
    ``str``, a raw one (``UnicodeEncodeError``). Those few go through :func:`json.loads`, and every
    string of the result is made valid (:func:`valid_data`), so the text is kept with U+FFFD where
    the bad code point was instead of the whole value being lost.

    Args:
        data: The JSON text.

    Returns:
        The decoded value.

    Raises:
        msgspec.DecodeError: ``data`` is not JSON (msgspec's message).
    """
    try:
        return msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeEncodeError) as exc:
        error = exc
    try:
        value = json.loads(data)
    # JSONDecodeError; UnicodeDecodeError for invalid UTF-8 bytes
    except (
        ValueError,
        RecursionError,
    ):
        raise msgspec.DecodeError(str(error)) from None
    return valid_data(value)


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """A count and its noun, singular or plural: ``1 turn``, ``0 turns``, ``1,204 model calls``.

    Args:
        count: How many.
        noun: The singular (``turn``, ``model call``).
        nouns: The plural when it is not ``noun + "s"`` (``archives of turns``…).

    Returns:
        The count with thousands separators, a space, then the word that agrees with it.
    """
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


__all__ = ["REPLACEMENT", "decode_json", "plural", "valid_data", "valid_text"]
