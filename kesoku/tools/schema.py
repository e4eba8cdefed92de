"""Tools from typed Python callables: the JSON Schema from the signature, the text from the docstring.

A tool function is ``async def fn(ctx: ToolContext, *, path: str, limit: int = 100) -> str`` (the
context parameter is optional). :func:`schema_from_function` reads:

- the description: the docstring before its first section (``Args:``, ``Returns:``, ...);
- one JSON Schema property per parameter, from its type hint, through msgspec's schema generator
  (``msgspec.json.schema``), with nested structs inlined so the schema needs no ``$ref``;
- each parameter's description from the Google-style ``Args:`` section.

A parameter with a default, or typed ``X | None``, is not required. :func:`tool_from_function` wraps
the function as a :class:`~kesoku.tools.base.Tool` whose ``run`` converts the model's arguments with
``msgspec.convert`` against the same types before the call; a mismatch is a
:class:`~kesoku.vocab.errors.ToolError` naming the argument, so the model reads what to fix.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from kesoku.tools.base import DEFAULT_TOOL_TIMEOUT_S, Tool, ToolContext
from kesoku.vocab.errors import ToolError

# Google style guide, "3.8.3 Functions and Methods": the section headers a docstring may hold.
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns|Return|Yields|Yield|Raises|"
    r"Examples?|Notes?|Attributes|Cancellation|See Also|Warnings?|Todo|References)\s*:\s*$"
)
_ARG_SECTIONS = frozenset(
    {"Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments"}
)
_ARG_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its per-argument descriptions.

    Args:
        doc: The docstring (``fn.__doc__``).

    Returns:
        The text before the first section, and ``{argument: description}`` from ``Args:``
        (continuation lines joined with spaces).
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent = -1
    for line in lines:
        header = _SECTION.match(line)
        if header:
            section, current, entry_indent = header.group(1), None, -1
            continue
        if section is None:
            description.append(line)
            continue
        if section not in _ARG_SECTIONS or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        entry = _ARG_ENTRY.match(line.strip())
        if entry and (entry_indent < 0 or indent <= entry_indent):
            entry_indent = indent
            current = entry.group(1)
            args[current] = entry.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(description).strip(), args


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    hint: Any
    default: Any  # inspect.Parameter.empty when required
    nullable: bool


@dataclass(frozen=True, slots=True)
class _Analysis:
    description: str
    schema: dict[str, Any]
    arguments: type[msgspec.Struct]
    params: tuple[_Param, ...]
    takes_ctx: bool


def _accepts_none(hint: Any) -> bool:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if hint is None or hint is type(None):
        return True
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(
        hint
    )


def _is_context(hint: Any) -> bool:
    return hint is ToolContext


def _analyse(fn: Callable[..., Any]) -> _Analysis:
    """Read a function's signature and docstring once (shared by the schema and the argument converter).

    Raises:
        TypeError: A parameter has no type hint, a type JSON Schema cannot express, or a kind a tool
            call cannot fill (``*args``, ``**kwargs``, positional-only).
    """
    where = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve
        raise TypeError(f"{where}: cannot resolve the type hints: {exc}") from None
    description, arg_docs = parse_docstring(inspect.getdoc(fn))
    parameters = list(inspect.signature(fn).parameters.values())
    takes_ctx = bool(parameters) and _is_context(hints.get(parameters[0].name))
    if takes_ctx:
        parameters = parameters[1:]
    params: list[_Param] = []
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"{where}: parameter {p.name!r}: a tool's arguments are named; {p.kind.description} is not"
            )
        if p.name not in hints:
            raise TypeError(f"{where}: parameter {p.name!r} has no type hint")
        hint = hints[p.name]
        if _is_context(hint):
            raise TypeError(
                f"{where}: parameter {p.name!r}: the ToolContext must be the first parameter"
            )
        try:
            msgspec.json.schema(hint)
        except (TypeError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[-1]
            raise TypeError(
                f"{where}: parameter {p.name!r}: {hint!r} cannot be expressed as JSON Schema ({reason})"
            ) from None
        nullable = _accepts_none(hint)
        params.append(_Param(p.name, hint, p.default, nullable))
        optional = p.default is not p.empty or nullable
        field_type: Any = hint
        if optional:
            # UNSET marks "not given": the function's own default applies, so any default works.
            field_type = Union[hint, msgspec.UnsetType]  # noqa: UP007 (hint is a runtime object)
        if arg_docs.get(p.name):
            field_type = Annotated[field_type, msgspec.Meta(description=arg_docs[p.name])]
        fields.append((p.name, field_type, msgspec.UNSET) if optional else (p.name, field_type))
    arguments = msgspec.defstruct(
        f"{getattr(fn, '__name__', 'tool')}_arguments",
        fields,
        kw_only=True,
        forbid_unknown_fields=True,
    )
    schema = _object_schema(arguments, params, where)
    return _Analysis(description, schema, arguments, tuple(params), takes_ctx)


def _object_schema(
    arguments: type[msgspec.Struct], params: list[_Param], where: str
) -> dict[str, Any]:
    generated = msgspec.json.schema(arguments)
    defs: dict[str, Any] = generated.get("$defs", {})
    root: dict[str, Any] = _inline(defs[arguments.__name__], defs, (), where)
    root.pop("title", None)
    if not root.get("required"):
        root.pop("required", None)
    properties: dict[str, Any] = root["properties"]
    for param in params:
        if param.default is inspect.Parameter.empty:
            continue
        with contextlib.suppress(
            TypeError, ValueError
        ):  # a default JSON cannot show stays implicit
            properties[param.name]["default"] = msgspec.to_builtins(param.default)
    return root


def _inline(node: Any, defs: Mapping[str, Any], seen: tuple[str, ...], where: str) -> Any:
    """Replace every ``$ref`` by a copy of its definition; recursive types cannot be inlined."""
    if isinstance(node, list):
        return [_inline(item, defs, seen, where) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name in seen:
            raise TypeError(f"{where}: type {name!r} is recursive; a tool schema cannot express it")
        target = _inline(copy.deepcopy(defs[name]), defs, (*seen, name), where)
        return {
            **target,
            **{k: _inline(v, defs, seen, where) for k, v in node.items() if k != "$ref"},
        }
    return {k: _inline(v, defs, seen, where) for k, v in node.items()}


def schema_from_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """Derive a tool's description and the JSON Schema of its parameters from a function.

    Args:
        fn: A function with a type hint on every parameter; a first parameter typed
            :class:`~kesoku.tools.base.ToolContext` is not part of the schema.

    Returns:
        The description (the docstring before its sections) and a JSON Schema object (draft 2020-12,
        as ``msgspec.json.schema`` writes it, ``$ref`` inlined): ``str`` → string, ``int`` →
        integer, ``float`` → number, ``bool`` → boolean, ``list[T]`` → array, ``dict`` → object,
        ``Literal[...]`` → enum, ``X | None`` → anyOf with null, msgspec Structs and TypedDicts →
        objects; parameters with defaults, or ``X | None``, are not required.

    Raises:
        TypeError: Naming the parameter: a missing hint, a type JSON Schema cannot express (a class
            msgspec does not know, a recursive type), ``*args``, ``**kwargs`` or positional-only.
    """
    analysis = _analyse(fn)
    return analysis.description, analysis.schema


def tool_from_function(
    fn: Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
) -> Tool:
    """Wrap an async function as a :class:`~kesoku.tools.base.Tool`.

    Args:
        fn: ``async def fn(ctx: ToolContext, *, ...) -> str``, or without the context parameter.
        name: The tool's name; None: the function's name.
        timeout_s: Longest run before the call's outcome is ``timed_out``.

    Returns:
        The tool. Its ``run`` converts the arguments (``msgspec.convert``, lax: ``"5"`` becomes 5
        for an ``int``) before calling ``fn``; arguments not given are left to the function's
        defaults (``None`` for an ``X | None`` parameter without one). A result that is not a string
        is sent as JSON.

    Raises:
        TypeError: ``fn`` is not an async function, or as :func:`schema_from_function`.
    """
    if not inspect.iscoroutinefunction(fn):
        where = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"{where}: a tool function must be 'async def' (a blocking call would stall every session)"
        )
    analysis = _analyse(fn)
    tool_name = name or fn.__name__

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        kwargs = _convert_arguments(tool_name, analysis, arguments)
        result = await (fn(ctx, **kwargs) if analysis.takes_ctx else fn(**kwargs))
        if isinstance(result, str):
            return result
        return msgspec.json.encode(result).decode()

    return Tool(
        tool_name, analysis.description, run, parameters=analysis.schema, timeout_s=timeout_s
    )


def _convert_arguments(
    tool_name: str, analysis: _Analysis, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate and convert a call's arguments to the function's parameter types.

    Raises:
        ToolError: An argument is missing, unknown or of the wrong type; the message names it.
    """
    if not isinstance(arguments, Mapping):
        raise ToolError(
            f"{tool_name}: the arguments must be a JSON object, got {type(arguments).__name__}"
        )
    try:
        converted = msgspec.convert(dict(arguments), analysis.arguments, strict=False)
    except msgspec.ValidationError as exc:
        raise ToolError(f"{tool_name}: invalid arguments: {_explain(str(exc), analysis)}") from None
    kwargs: dict[str, Any] = {}
    for param in analysis.params:
        value = getattr(converted, param.name)
        if value is not msgspec.UNSET:
            kwargs[param.name] = value
        elif (
            param.default is inspect.Parameter.empty
        ):  # X | None without a default: omitted means None
            kwargs[param.name] = None
    return kwargs


_AT = re.compile(r"^(?P<what>.*?) - at `\$\.(?P<name>[^.`\[]+)(?P<rest>[^`]*)`$")


def _explain(message: str, analysis: _Analysis) -> str:
    """Reword msgspec's message so it names the argument the way the model wrote it."""
    if m := _AT.match(message):
        what = m.group("what").replace("`", "")
        inner = m.group("rest")
        where = f"{m.group('name')}{inner}" if inner else m.group("name")
        return f"argument {where!r}: {what[0].lower()}{what[1:]}"
    if m := re.fullmatch(r"Object missing required field `(\w+)`", message):
        return f"missing required argument {m.group(1)!r}"
    if m := re.fullmatch(r"Object contains unknown field `(.+)`", message):
        known = ", ".join(p.name for p in analysis.params) or "none"
        return f"unknown argument {m.group(1)!r} (arguments: {known})"
    return message


__all__ = ["parse_docstring", "schema_from_function", "tool_from_function"]
