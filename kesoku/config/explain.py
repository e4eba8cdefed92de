"""One-line config errors, with the file's line and "did you mean" for unknown keys.

msgspec's "Expected `int`, got `str` - at `$.a.b[0]`" becomes "kesoku.toml:14: a.b[0]: expected int,
got str".
"""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Literal, Union

import msgspec

# --------------------------------------------------------------------------------------------------
# Errors: msgspec's "Expected `int`, got `str` - at `$.a.b[0]`" → "file:line: a.b[0]: expected int,
# got str"

Segment = str | int
_MSGSPEC = re.compile(r"(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.S)
_IDENT = r"[A-Za-z_]\w*(?:\[\d+\])*"
_SUBPATH = re.compile(rf"(?P<sub>{_IDENT}(?:\.{_IDENT})*): (?P<rest>.*)", re.S)


def explain(error: str, data: dict[str, Any], name: str, text: str, root: type) -> str:
    """Turn a msgspec validation error into one line naming the file, line and key.

    Args:
        error: ``str()`` of the msgspec.ValidationError raised converting ``data`` to ``root``.
        data: The parsed TOML.
        name: The file name shown.
        text: The file's text, to find the line of the key.
        root: The Struct ``data`` was converted to (its annotations name the keys and types).

    Returns:
        ``name:line: key.path: what was expected``.
    """
    m = _MSGSPEC.fullmatch(error)
    assert m is not None  # the pattern matches any text
    msg, path = m["msg"], _parse_path(m["path"] or "", data, root)
    if sub := _SUBPATH.fullmatch(msg):
        path += _parse_path("." + sub["sub"], {}, root)
        msg = sub["rest"]
    elif field := re.fullmatch(r"Object contains unknown field `(.*)`", msg):
        known = _known_keys(_type_at(path, data, root))
        path.append(field[1])
        msg = unknown_key(field[1], known)
    elif field := re.fullmatch(r"Object missing required field `(.*)`", msg):
        path.append(field[1])
        choices = _choices(_type_at(path, data, root))
        msg = "required key is missing" + (
            f" (one of {', '.join(map(repr, choices))})" if choices else ""
        )
    elif re.fullmatch(r"Invalid (enum )?value .*", msg):
        choices = _choices(_type_at(path, data, root))
        expected = (
            f"expected one of {', '.join(map(repr, choices))}" if choices else "invalid value"
        )
        msg = f"{expected}, got {_value_at(path, data)!r}"
    elif msg.startswith("Expected "):
        # TOML words: a table, not an object; and no null, so "str | null" is just "str".
        msg = "e" + msg[1:].replace("`object`", "table").replace(" | null", "").replace("`", "")
        if ", got " not in msg:
            msg += f", got {_value_at(path, data)!r}"
    where, key = _locate(text, tuple(path)), _format_path(path)
    head = f"{name}:{where}:" if where else f"{name}:"
    return " ".join(f"{head} {key + ': ' if key else ''}{msg}".split("\n"))


def unknown_key(key: str, known: list[str]) -> str:
    """``unknown key; did you mean 'x'? (known: ...)``; the question only when a known key is close.

    Shared with the scripted backend's scenario files, so both say it the same way.
    """
    import difflib  # only a config with a mistake needs it; every `kesoku` command loads one

    close = " or ".join(map(repr, difflib.get_close_matches(key, known, n=2)))
    hint = f"; did you mean {close}?" if close else ""
    return f"unknown key{hint} (known: {', '.join(known)})"


def _parse_path(path: str, data: Any, root: type) -> list[Segment]:
    """`.a.b[0].c[...]` → ["a", "b", 0, "c", key].

    msgspec hides dict keys as `[...]`, so find the key in ``data``.
    """
    out: list[Segment] = []
    for name, index in re.findall(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]", path):
        if name:
            out.append(name)
        elif index != "...":
            out.append(int(index))
        else:
            out.append(_bad_dict_key(out, data, root))
    return out


def _bad_dict_key(path: list[Segment], data: dict[str, Any], root: type) -> str:
    mapping, tp = _value_at(path, data), _type_at(path, data, root)
    if isinstance(mapping, dict) and typing.get_origin(tp) is dict:
        for key, value in mapping.items():
            try:
                msgspec.convert(value, typing.get_args(tp)[1])
            except msgspec.ValidationError:
                return str(key)
    return "..."


def _type_at(path: list[Segment], data: Any, root: type) -> Any:
    """The declared type at `path`, walking ``root``'s annotations alongside the data."""
    tp: Any = root
    for depth, seg in enumerate(path):
        tp = _unwrap(tp, _value_at(path[:depth], data))
        if typing.get_origin(tp) in (Union, types.UnionType) and seg == "transport":
            return tp  # an unresolved tagged union: its choices are the tags
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct) and isinstance(seg, str):
            tp = typing.get_type_hints(tp, include_extras=True).get(seg)
        elif typing.get_origin(tp) in (tuple, list) and isinstance(seg, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    return _unwrap(tp, _value_at(path, data))


def _unwrap(tp: Any, value: Any) -> Any:
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        tagged = {_tag(m): m for m in members if _tag(m) is not None}
        if tagged and isinstance(value, dict) and value.get("transport") in tagged:
            return _unwrap(tagged[value["transport"]], None)
        if len(members) == 1:
            return _unwrap(members[0], value)
    return tp


def _tag(tp: Any) -> str | None:
    tag = (
        tp.__struct_config__.tag
        if isinstance(tp, type) and issubclass(tp, msgspec.Struct)
        else None
    )
    return tag if isinstance(tag, str) else None


def _value_at(path: list[Segment], data: Any) -> Any:
    for seg in path:
        try:
            data = data[seg]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def _known_keys(tp: Any) -> list[str]:
    if not (isinstance(tp, type) and issubclass(tp, msgspec.Struct)):
        return []
    tag_field = tp.__struct_config__.tag_field
    return ([tag_field] if tag_field else []) + [f.encode_name for f in msgspec.structs.fields(tp)]


def _choices(tp: Any) -> list[object]:
    if typing.get_origin(tp) is Literal:
        return list(typing.get_args(tp))
    if typing.get_origin(tp) is tuple:  # the error is about an element of a tuple of Literals
        return _choices(_unwrap(typing.get_args(tp)[0], None))
    tags = [_tag(m) for m in typing.get_args(tp)]
    return [t for t in tags if t is not None]


def _format_path(path: list[Segment]) -> str:
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            key = (
                seg if re.fullmatch(r"[A-Za-z0-9_-]+", seg) else '"' + seg.replace('"', '\\"') + '"'
            )
            out += f".{key}" if out else key
    return out


# --------------------------------------------------------------------------------------------------
# Locator: the line of a key path in TOML text. Best effort: headers, array tables, dotted keys.

_KEY = r"""(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|'[^']*')"""
_DOTTED = rf"{_KEY}(?:\s*\.\s*{_KEY})*"
_ARRAY_HEADER = re.compile(rf"\s*\[\[\s*({_DOTTED})\s*\]\]")
_HEADER = re.compile(rf"\s*\[\s*({_DOTTED})\s*\]")
_ASSIGN = re.compile(rf"\s*({_DOTTED})\s*=(.*)")


def _keys(dotted: str) -> tuple[str, ...]:
    return tuple(k[1:-1] if k[0] in "\"'" else k for k in re.findall(_KEY, dotted))


def _locate(text: str, target: tuple[Segment, ...]) -> int | None:
    """Return the line defining `target`, else the line of its longest defined prefix, else None."""
    table: tuple[Segment, ...] = ()
    counts: dict[tuple[str, ...], int] = {}  # array-table occurrences seen so far
    best_len, best_line = 0, None
    open_string: str | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if open_string is not None:  # inside a multi-line string: nothing here is a key
            if line.count(open_string) % 2:
                open_string = None
            continue
        if m := _ARRAY_HEADER.match(line):
            keys = _keys(m[1])
            counts[keys] = counts.get(keys, 0) + 1
            table = path = (*_indexed(keys[:-1], counts), keys[-1], counts[keys] - 1)
        elif m := _HEADER.match(line):
            table = path = _indexed(_keys(m[1]), counts)
        elif m := _ASSIGN.match(line):
            path = (*table, *_keys(m[1]))
            open_string = next((q for q in ('"""', "'''") if m[2].count(q) % 2), None)
        else:
            continue
        if path == target:
            return lineno
        if len(path) > best_len and target[: len(path)] == path:
            best_len, best_line = len(path), lineno
    return best_line


def _indexed(keys: tuple[str, ...], counts: dict[tuple[str, ...], int]) -> tuple[Segment, ...]:
    """`[a.b.c]` under `[[a.b]]` means the last a.b element: insert its index."""
    out: list[Segment] = []
    for i, key in enumerate(keys):
        out.append(key)
        if (n := counts.get(keys[: i + 1])) is not None:
            out.append(n - 1)
    return tuple(out)
