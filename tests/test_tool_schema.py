"""Tool schemas and argument conversion from typed Python callables (kesoku.tools.schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypedDict

import msgspec
import pytest

from kesoku.tools.base import DEFAULT_TOOL_TIMEOUT_S, ToolContext
from kesoku.tools.schema import parse_docstring, schema_from_function, tool_from_function
from kesoku.vocab.errors import ToolError
from kesoku.vocab.model import Session


class Point(msgspec.Struct):
    """A point on the grid."""

    x: int
    y: int = 0


class Window(TypedDict):
    start: str
    end: str


async def search(
    ctx: ToolContext,
    query: str,
    *,
    limit: int = 10,
    mode: Literal["fast", "full"] = "fast",
    tags: list[str] | None = None,
    ratio: float = 0.5,
    exact: bool = False,
    counts: dict[str, int] = {},  # noqa: B006 (never mutated; shown as the schema's default)
) -> str:
    """Search the notes.

    Matches words anywhere in a note.

    Args:
        query: The words to find.
        limit (int): At most this many
            results.
        mode: How hard to look.
        tags: Only notes with one of these tags.

    Returns:
        The matching notes.

    Raises:
        ToolError: Never.
    """
    return f"{ctx.call_id}: {query!r} {limit} {mode} {tags} {ratio} {exact} {counts}"


async def place(at: Point, window: Window | None, note: Any = None) -> dict[str, Any]:
    """Place a marker."""
    return {"x": at.x, "y": at.y, "window": window, "note": note}


def test_a_signature_becomes_a_json_schema_with_descriptions() -> None:
    description, schema = schema_from_function(search)
    assert description == "Search the notes.\n\nMatches words anywhere in a note."
    assert schema == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "The words to find."},
            "limit": {
                "type": "integer",
                "description": "At most this many results.",
                "default": 10,
            },
            "mode": {
                "enum": ["fast", "full"],
                "description": "How hard to look.",
                "default": "fast",
            },
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "description": "Only notes with one of these tags.",
                "default": None,
            },
            "ratio": {"type": "number", "default": 0.5},
            "exact": {"type": "boolean", "default": False},
            "counts": {
                "type": "object",
                "additionalProperties": {"type": "integer"},
                "default": {},
            },
        },
        "required": ["query"],
        "additionalProperties": False,
    }


def test_structs_and_typed_dicts_are_inlined_objects_and_optional_means_not_required() -> None:
    description, schema = schema_from_function(place)
    assert description == "Place a marker."
    point = {
        "title": "Point",
        "description": "A point on the grid.",
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
        "required": ["x"],
    }
    window = {
        "title": "Window",
        "type": "object",
        "properties": {"start": {"type": "string"}, "end": {"type": "string"}},
        "required": ["end", "start"],  # msgspec sorts a TypedDict's required keys
    }
    assert schema == {
        "type": "object",
        "properties": {
            "at": point,
            "window": {"anyOf": [window, {"type": "null"}]},
            "note": {"default": None},
        },
        "required": ["at"],
        "additionalProperties": False,
    }


def test_no_parameters_and_no_docstring() -> None:
    async def ping() -> str:
        return "pong"

    assert schema_from_function(ping) == (
        "",
        {"type": "object", "properties": {}, "additionalProperties": False},
    )


def test_docstring_sections() -> None:
    doc = """Summary line.

    Body paragraph
    on two lines.

    Args:
        path (str): Where.
        *rest: Ignored.
        count: How many,
            at most.

    Returns:
        Nothing.
    """
    assert parse_docstring(doc) == (
        "Summary line.\n\nBody paragraph\non two lines.",
        {"path": "Where.", "rest": "Ignored.", "count": "How many, at most."},
    )
    assert parse_docstring(None) == ("", {})


class Tree(msgspec.Struct):
    children: list[Tree]


async def untyped(x) -> str:  # type: ignore[no-untyped-def]
    return str(x)


async def with_path(p: Path) -> str:
    return str(p)


async def recursive(tree: Tree) -> str:
    return ""


async def var_args(*names: str) -> str:
    return ""


async def var_kwargs(**options: str) -> str:
    return ""


async def positional_only(a: int, /) -> str:
    return ""


async def late_context(a: int, ctx: ToolContext) -> str:
    return ""


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (untyped, r"untyped: parameter 'x' has no type hint"),
        (
            with_path,
            r"with_path: parameter 'p': <class 'pathlib.Path'> cannot be expressed as JSON Schema",
        ),
        (recursive, r"recursive: type 'Tree' is recursive"),
        (
            var_args,
            r"var_args: parameter 'names': a tool's arguments are named; variadic positional",
        ),
        (
            var_kwargs,
            r"var_kwargs: parameter 'options': a tool's arguments are named; variadic keyword",
        ),
        (
            positional_only,
            r"positional_only: parameter 'a': a tool's arguments are named; positional-only",
        ),
        (
            late_context,
            r"late_context: parameter 'ctx': the ToolContext must be the first parameter",
        ),
    ],
)
def test_types_a_schema_cannot_express_are_refused_naming_the_parameter(
    fn: Any, message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        schema_from_function(fn)


def test_a_tool_function_must_be_async() -> None:
    def blocking(a: int) -> str:
        return ""

    with pytest.raises(TypeError, match=r"must be 'async def'"):
        tool_from_function(blocking)  # type: ignore[arg-type]


@pytest.fixture
def ctx(session: Session, tmp_path: Path) -> ToolContext:
    """A real session (conftest's gateway over a SQLite file) and its call."""
    return ToolContext(session=session, cwd=tmp_path, call_id="toolu_1")


async def test_a_tool_converts_its_arguments_and_applies_defaults(ctx: ToolContext) -> None:
    tool = tool_from_function(search, name="find", timeout_s=30)
    assert (tool.name, tool.timeout_s, tool.snippet) == ("find", 30, "find: Search the notes.")
    assert tool.spec.parameters == schema_from_function(search)[1]
    # Lax conversion: numbers and booleans sent as strings are accepted.
    result = await tool.run({"query": "x", "limit": "5", "exact": "true", "tags": ["a"]}, ctx)
    assert result == "toolu_1: 'x' 5 fast ['a'] 0.5 True {}"
    assert tool_from_function(search).timeout_s == DEFAULT_TOOL_TIMEOUT_S


async def test_structs_are_built_and_a_non_string_result_is_sent_as_json(ctx: ToolContext) -> None:
    tool = tool_from_function(place)
    result = await tool.run({"at": {"x": 2}}, ctx)
    assert (
        result == '{"x":2,"y":0,"window":null,"note":null}'
    )  # window: X | None without a default → None


UNKNOWN_PAGE = "find: invalid arguments: unknown argument 'page' (arguments: query, limit, mode, tags, ratio, exact, counts)"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"query": 1}, "find: invalid arguments: argument 'query': expected str, got int"),
        ({}, "find: invalid arguments: missing required argument 'query'"),
        ({"query": "x", "page": 2}, UNKNOWN_PAGE),
        (
            {"query": "x", "mode": "slow"},
            "find: invalid arguments: argument 'mode': invalid enum value 'slow'",
        ),
        (
            {"query": "x", "tags": ["a", 2]},
            "find: invalid arguments: argument 'tags[1]': expected str, got int",
        ),
        (
            {"query": "x", "limit": "many"},
            "find: invalid arguments: argument 'limit': expected int, got str",
        ),
    ],
)
async def test_a_mismatch_is_a_tool_error_naming_the_argument(
    arguments: dict[str, Any], message: str, ctx: ToolContext
) -> None:
    tool = tool_from_function(search, name="find")
    with pytest.raises(ToolError) as info:
        await tool.run(arguments, ctx)
    assert str(info.value) == message


async def test_nested_mismatches_name_the_path(ctx: ToolContext) -> None:
    tool = tool_from_function(place)
    with pytest.raises(
        ToolError, match=r"^place: invalid arguments: argument 'at.x': expected int, got str$"
    ):
        await tool.run({"at": {"x": "left"}}, ctx)
