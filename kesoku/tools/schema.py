"""Tools from typed Python callables: JSON Schema from the signature, text from the docstring.

A tool function is ``async def fn(ctx: ToolContext, *, path: str, limit: int = 100) -> str`` (the
context parameter is optional). :func:`schema_from_function` reads:

- the description: the docstring before its first section (``Args:``, ``Returns:``, ...);
- one JSON Schema property per parameter, from its type hint, through msgspec's schema generator
  (``msgspec.json.schema``), with nested structs inlined so the schema needs no ``$ref``;
  ``Literal[...]`` is an enum, ``Annotated[int, msgspec.Meta(ge=1)]`` a constraint;
- each parameter's description from the Google-style ``Args:`` section (parsed by the
  ``docstring_parser`` package).

A parameter with a default, or typed ``X | None``, is not required. :func:`tool_from_function` wraps
the function as a :class:`~kesoku.tools.base.Tool` whose ``run`` converts the model's arguments with
``msgspec.convert`` against the same types before the call; a mismatch is a
:class:`~kesoku.vocab.errors.ToolError` naming the argument, so the model reads what to fix. A
parameter annotated with a :class:`Check` has its own test and its own message instead. A ``null``
for a parameter that has a default but does not accept None means "not given".

The schema leaves out ``additionalProperties: false``: ``run`` refuses an unknown argument anyway,
naming the known ones, and the keyword would cost every tool 5 tokens on every model call
(bench/overhead_bench.py). The local backend's llama.cpp grammar allows no other keys without it.
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
from docstring_parser import ParseError
from docstring_parser.google import DEFAULT_SECTIONS, GoogleParser, Section, SectionType

from kesoku.tools.base import DEFAULT_TOOL_TIMEOUT_S, Tool, ToolContext
from kesoku.vocab.errors import ToolError

# Google style guide, "3.8.3 Functions and Methods": the section headers a docstring may hold,
# beyond docstring_parser's own (text under an unknown header would be read as description).
_PARSER = GoogleParser(
    [
        *DEFAULT_SECTIONS,
        Section("Keyword Args", "param", SectionType.MULTIPLE),
        Section("Keyword Arguments", "param", SectionType.MULTIPLE),
        Section("Return", "returns", SectionType.SINGULAR_OR_MULTIPLE),
        Section("Yield", "yields", SectionType.SINGULAR_OR_MULTIPLE),
        *(
            Section(title, title.lower(), SectionType.SINGULAR)
            for title in (
                *("Note", "Notes", "Warning", "Warnings", "See Also", "Todo", "References"),
                "Cancellation",  # this project's own: what a cancellation leaves behind
            )
        ),
    ]
)


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and its per-argument descriptions.

    Args:
        doc: The docstring (``fn.__doc__``).

    Returns:
        The text before the first section, and ``{argument: description}`` from ``Args:`` (and
        ``Keyword Args:``), each description's lines joined with spaces, ``*args`` named ``args``.

    Raises:
        ValueError: The docstring's sections cannot be read (an entry without ``name: text``).
    """
    try:
        parsed = _PARSER.parse(doc or "")
    except ParseError as exc:
        raise ValueError(f"the docstring cannot be parsed: {exc}") from None
    args = {
        p.arg_name.lstrip("*"): " ".join((p.description or "").split())
        for p in parsed.params
        if p.args[0] == "param"  # not the Attributes section's entries
    }
    return (parsed.description or "").strip(), args


@dataclass(frozen=True, slots=True)
class Check:
    """``Annotated`` metadata: a tool argument's own test, and its own message when it is refused.

    ``Annotated[str, Check("`{name}` must be a non-empty string", str.strip)]``. The message
    replaces the builder's when the argument is missing (and required), cannot be converted to its
    type, or fails the test; the schema is the type's alone (the test is not shown to the model).

    Attributes:
        message: The :class:`~kesoku.vocab.errors.ToolError`'s text (``str.format``: ``{name}`` is
            the argument's name, ``{value!r}`` what the model sent, None when it sent nothing).
        test: Called with the converted value: a false result refuses it. None: the type only.
    """

    message: str
    test: Callable[[Any], object] | None = None

    def __post_init__(self) -> None:
        self.refusal("name", None)  # a placeholder other than {name} and {value} fails here

    def refusal(self, name: str, value: object) -> ToolError:
        """The error refusing argument ``name``, sent as ``value``."""
        return ToolError(self.message.format(name=name, value=value))


@dataclass(frozen=True, slots=True)
class _Param:
    name: str
    hint: Any
    default: Any  # inspect.Parameter.empty when required
    nullable: bool
    check: Check | None


@dataclass(frozen=True, slots=True)
class _Analysis:
    description: str
    schema: dict[str, Any]
    arguments: type[msgspec.Struct]
    params: tuple[_Param, ...]
    takes_ctx: bool
    null_is_default: frozenset[str]
    """Parameters with a default that do not accept None: null from the model means not given."""


def _accepts_none(hint: Any) -> bool:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    if hint is None or hint is type(None):
        return True
    return typing.get_origin(hint) in (Union, types.UnionType) and type(None) in typing.get_args(
        hint
    )


def _check_of(hint: Any) -> Check | None:
    if typing.get_origin(hint) is not Annotated:
        return None
    return next((m for m in typing.get_args(hint)[1:] if isinstance(m, Check)), None)


def _is_context(hint: Any) -> bool:
    return hint is ToolContext


def _analyse(fn: Callable[..., Any], doc_values: Mapping[str, object] | None) -> _Analysis:
    """Read a function's signature and docstring once.

    Shared by the schema and the argument converter.

    Raises:
        TypeError: A parameter has no type hint, a type JSON Schema cannot express, or a kind a tool
            call cannot fill (``*args``, ``**kwargs``, positional-only); the docstring cannot be
            parsed, or names a field ``doc_values`` lacks.
    """
    where = getattr(fn, "__qualname__", repr(fn))
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve
        raise TypeError(f"{where}: cannot resolve the type hints: {exc}") from None
    try:
        description, arg_docs = parse_docstring(inspect.getdoc(fn))
    except ValueError as exc:
        raise TypeError(f"{where}: {exc}") from None
    if doc_values is not None:
        description = _fill(description, doc_values, where)
        arg_docs = {name: _fill(text, doc_values, where) for name, text in arg_docs.items()}
    parameters = list(inspect.signature(fn).parameters.values())
    takes_ctx = bool(parameters) and _is_context(hints.get(parameters[0].name))
    if takes_ctx:
        parameters = parameters[1:]
    params: list[_Param] = []
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(
                f"{where}: parameter {p.name!r}: a tool's arguments are named; "
                f"{p.kind.description} is not"
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
                f"{where}: parameter {p.name!r}: "
                f"{hint!r} cannot be expressed as JSON Schema ({reason})"
            ) from None
        nullable = _accepts_none(hint)
        params.append(_Param(p.name, hint, p.default, nullable, _check_of(hint)))
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
    null_is_default = frozenset(
        p.name for p in params if p.default is not inspect.Parameter.empty and not p.nullable
    )
    return _Analysis(description, schema, arguments, tuple(params), takes_ctx, null_is_default)


def _fill(text: str, values: Mapping[str, object], where: str) -> str:
    """Fill a docstring text's ``{field}`` placeholders from ``doc_values``."""
    try:
        return text.format_map(values)
    except (KeyError, IndexError, ValueError) as exc:
        raise TypeError(f"{where}: cannot fill {text!r} from doc_values: {exc!r}") from None


def _object_schema(
    arguments: type[msgspec.Struct], params: list[_Param], where: str
) -> dict[str, Any]:
    generated = msgspec.json.schema(arguments)
    defs: dict[str, Any] = generated.get("$defs", {})
    root: dict[str, Any] = _inline(defs[arguments.__name__], defs, (), where)
    root.pop("title", None)
    # Unknown arguments are refused all the same (forbid_unknown_fields: the message names the known
    # ones); the schema goes with every model call, whose model sends what `properties` lists.
    root.pop("additionalProperties", None)
    if not root.get("required"):
        root.pop("required", None)
    properties: dict[str, Any] = root["properties"]
    for param in params:
        if param.default is inspect.Parameter.empty:
            continue
        # a default JSON cannot show stays implicit
        with contextlib.suppress(TypeError, ValueError):
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


def schema_from_function(
    fn: Callable[..., Any], *, doc_values: Mapping[str, object] | None = None
) -> tuple[str, dict[str, Any]]:
    """Derive a tool's description and the JSON Schema of its parameters from a function.

    Args:
        fn: A function with a type hint on every parameter; a first parameter typed
            :class:`~kesoku.tools.base.ToolContext` is not part of the schema.
        doc_values: Values for ``{field}`` placeholders in the docstring's description and argument
            texts (``str.format``), for text that depends on configuration; None: the docstring is
            taken as it is.

    Returns:
        The description (the docstring before its sections) and a JSON Schema object (draft 2020-12,
        as ``msgspec.json.schema`` writes it, ``$ref`` inlined): ``str`` → string, ``int`` →
        integer, ``float`` → number, ``bool`` → boolean, ``list[T]`` → array, ``dict`` → object,
        ``Literal[...]`` → enum, ``X | None`` → anyOf with null, msgspec Structs and TypedDicts →
        objects, ``msgspec.Meta`` constraints as their keywords; parameters with defaults, or
        ``X | None``, are not required, and a default JSON can show is the property's ``default``.
        No ``additionalProperties`` (unknown arguments are refused when the tool runs).

    Raises:
        TypeError: Naming the parameter: a missing hint, a type JSON Schema cannot express (a class
            msgspec does not know, a recursive type), ``*args``, ``**kwargs`` or positional-only;
            or a docstring that cannot be parsed or filled from ``doc_values``.
    """
    analysis = _analyse(fn, doc_values)
    return analysis.description, analysis.schema


def tool_from_function(
    fn: Callable[..., Awaitable[Any]],
    *,
    name: str | None = None,
    description: str | None = None,
    doc_values: Mapping[str, object] | None = None,
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
) -> Tool:
    """Wrap an async function as a :class:`~kesoku.tools.base.Tool`.

    Args:
        fn: ``async def fn(ctx: ToolContext, *, ...) -> str``, or without the context parameter.
        name: The tool's name; None: the function's name.
        description: The tool's description; None: the docstring's (a text that depends on
            configuration, or has line breaks a docstring cannot hold, is given here).
        doc_values: As :func:`schema_from_function`.
        timeout_s: Longest run before the call's outcome is ``timed_out``.

    Returns:
        The tool. Its ``run`` converts the arguments (``msgspec.convert``, lax: ``"5"`` becomes 5
        for an ``int``) before calling ``fn``; arguments not given are left to the function's
        defaults (``None`` for an ``X | None`` parameter without one), and so is a ``null`` for a
        parameter with a default that does not accept None. A parameter's :class:`Check` runs on
        the converted value. A result that is not a string is sent as JSON.

    Raises:
        TypeError: ``fn`` is not an async function, or as :func:`schema_from_function`.
    """
    if not inspect.iscoroutinefunction(fn):
        where = getattr(fn, "__qualname__", repr(fn))
        raise TypeError(
            f"{where}: a tool function must be 'async def' "
            "(a blocking call would stall every session)"
        )
    analysis = _analyse(fn, doc_values)
    tool_name = name or fn.__name__

    async def run(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        kwargs = _convert_arguments(tool_name, analysis, arguments)
        result = await (fn(ctx, **kwargs) if analysis.takes_ctx else fn(**kwargs))
        if isinstance(result, str):
            return result
        return msgspec.json.encode(result).decode()

    text = analysis.description if description is None else description
    return Tool(tool_name, text, run, parameters=analysis.schema, timeout_s=timeout_s)


def _convert_arguments(
    tool_name: str, analysis: _Analysis, arguments: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate and convert a call's arguments to the function's parameter types.

    Raises:
        ToolError: An argument is missing, unknown, of the wrong type or refused by its
            :class:`Check`; the message names it.
    """
    if not isinstance(arguments, Mapping):
        raise ToolError(
            f"{tool_name}: the arguments must be a JSON object, got {type(arguments).__name__}"
        )
    # null for a parameter with a default that does not accept None: not given
    given = {
        key: value
        for key, value in arguments.items()
        if value is not None or key not in analysis.null_is_default
    }
    try:
        converted = msgspec.convert(given, analysis.arguments, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = next((p for p in analysis.params if p.name == _argument_of(message)), None)
        if param is not None and param.check is not None:
            raise param.check.refusal(param.name, arguments.get(param.name)) from None
        raise ToolError(f"{tool_name}: invalid arguments: {_explain(message, analysis)}") from None
    kwargs: dict[str, Any] = {}
    for param in analysis.params:
        value = getattr(converted, param.name)
        if value is not msgspec.UNSET:
            check = param.check
            if check is not None and check.test is not None and not check.test(value):
                raise check.refusal(param.name, arguments.get(param.name))
            kwargs[param.name] = value
        elif param.default is inspect.Parameter.empty:
            # X | None without a default: omitted means None
            kwargs[param.name] = None
    return kwargs


_AT = re.compile(r"^(?P<what>.*?) - at `\$\.(?P<name>[^.`\[]+)(?P<rest>[^`]*)`$")
_MISSING = re.compile(r"Object missing required field `(\w+)`")


def _argument_of(message: str) -> str | None:
    """The argument a msgspec validation message is about, if one."""
    if m := _AT.match(message):
        return m.group("name")
    if m := _MISSING.fullmatch(message):
        return m.group(1)
    return None


def _explain(message: str, analysis: _Analysis) -> str:
    """Reword msgspec's message so it names the argument the way the model wrote it."""
    if m := _AT.match(message):
        what = m.group("what").replace("`", "")
        inner = m.group("rest")
        where = f"{m.group('name')}{inner}" if inner else m.group("name")
        return f"argument {where!r}: {what[0].lower()}{what[1:]}"
    if m := _MISSING.fullmatch(message):
        return f"missing required argument {m.group(1)!r}"
    if m := re.fullmatch(r"Object contains unknown field `(.+)`", message):
        known = ", ".join(p.name for p in analysis.params) or "none"
        return f"unknown argument {m.group(1)!r} (arguments: {known})"
    return message


__all__ = ["Check", "parse_docstring", "schema_from_function", "tool_from_function"]
