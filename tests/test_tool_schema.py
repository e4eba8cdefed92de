"""Tool schemas and argument conversion from typed Python callables (kesoku.tools.schema)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

import msgspec
import pytest

from kesoku.tools.base import DEFAULT_TOOL_TIMEOUT_S, ToolContext
from kesoku.tools.schema import Check, parse_docstring, schema_from_function, tool_from_function
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
        # no additionalProperties: unknown arguments are refused when the tool runs (UNKNOWN_PAGE)
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
    }


def test_no_parameters_and_no_docstring() -> None:
    async def ping() -> str:
        return "pong"

    assert schema_from_function(ping) == (
        "",
        {"type": "object", "properties": {}},
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
    # window: X | None without a default → None
    assert result == '{"x":2,"y":0,"window":null,"note":null}'


UNKNOWN_PAGE = (
    "find: invalid arguments: unknown argument 'page' "
    "(arguments: query, limit, mode, tags, ratio, exact, counts)"
)


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


# -- Check, null for a default, description and doc_values, constraints ----------------------------

Name = Annotated[str, Check("`{name}` must be a non-empty string", str.strip)]
Count = Annotated[int, Check("`{name}` must be a positive integer, got {value!r}", lambda n: n > 0)]


async def checked(name: Name, count: Count = 3, note: str | None = "n") -> str:
    """Greet.

    Args:
        name: Who.
        count: How often, at most {most}.
        note: A note.
    """
    return f"{name} {count} {note}"


def test_a_check_is_not_part_of_the_schema() -> None:
    _, schema = schema_from_function(checked, doc_values={"most": 9})
    assert schema["properties"]["name"] == {"type": "string", "description": "Who."}
    assert schema["properties"]["count"] == {
        "type": "integer",
        "description": "How often, at most 9.",
        "default": 3,
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "`name` must be a non-empty string"),  # missing
        ({"name": 3}, "`name` must be a non-empty string"),  # wrong type
        ({"name": "  "}, "`name` must be a non-empty string"),  # refused by the test
        ({"name": "a", "count": 0}, "`count` must be a positive integer, got 0"),
        ({"name": "a", "count": "many"}, "`count` must be a positive integer, got 'many'"),
        ({"name": "a", "count": True}, "`count` must be a positive integer, got True"),
        # an argument without a Check keeps the builder's message
        (
            {"name": "a", "note": 5},
            "checked: invalid arguments: argument 'note': expected str | null, got int",
        ),
    ],
)
async def test_a_check_gives_its_own_message(
    arguments: dict[str, Any], message: str, ctx: ToolContext
) -> None:
    tool = tool_from_function(checked, doc_values={"most": 9})
    with pytest.raises(ToolError) as info:
        await tool.run(arguments, ctx)
    assert str(info.value) == message


def test_a_check_message_with_an_unknown_placeholder_is_refused_at_once() -> None:
    with pytest.raises(KeyError, match="nmae"):
        Check("`{nmae}` must be a string")


async def test_null_for_a_parameter_with_a_default_means_not_given(ctx: ToolContext) -> None:
    tool = tool_from_function(checked, doc_values={"most": 9})
    # count has a default and does not accept None: null is its default; note accepts None.
    assert await tool.run({"name": "a", "count": None, "note": None}, ctx) == "a 3 None"
    with pytest.raises(ToolError, match="`name` must be a non-empty string"):
        await tool.run({"name": None}, ctx)  # required: null is no value


async def test_a_description_given_replaces_the_docstring(ctx: ToolContext) -> None:
    tool = tool_from_function(
        checked, name="greet", description="Greet someone.\nTwice.", doc_values={"most": 9}
    )
    assert (tool.description, tool.snippet) == ("Greet someone.\nTwice.", "greet: Greet someone.")
    assert tool.parameters == schema_from_function(checked, doc_values={"most": 9})[1]


def test_doc_values_fill_the_description_and_a_missing_one_is_refused() -> None:
    async def templated(limit: int) -> str:
        """Count up to {limit}.

        Args:
            limit: At most {limit}.
        """
        return ""

    description, schema = schema_from_function(templated, doc_values={"limit": 7})
    assert description == "Count up to 7."
    assert schema["properties"]["limit"]["description"] == "At most 7."
    with pytest.raises(TypeError, match=r"templated: cannot fill 'Count up to \{limit\}\.'"):
        schema_from_function(templated, doc_values={})
    assert schema_from_function(templated)[0] == "Count up to {limit}."  # no doc_values: as it is


async def constrained(
    count: Annotated[int, msgspec.Meta(ge=1, le=10)], mode: Literal["a", "b"] = "a"
) -> str:
    """Constrained."""
    return f"{count} {mode}"


async def test_msgspec_constraints_reach_the_schema_and_the_checks(ctx: ToolContext) -> None:
    _, schema = schema_from_function(constrained)
    assert schema["properties"] == {
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "mode": {"enum": ["a", "b"], "default": "a"},
    }
    tool = tool_from_function(constrained)
    with pytest.raises(ToolError) as info:
        await tool.run({"count": 0}, ctx)
    assert str(info.value) == "constrained: invalid arguments: argument 'count': expected int >= 1"


def test_sections_beyond_args_do_not_leak_into_the_description() -> None:
    doc = """Do the thing.

    Note:
        Only on Tuesdays.

    Attributes:
        state: Not an argument.

    Keyword Args:
        level: How much.

    Cancellation:
        Nothing is left behind.

    Warnings:
        None.
    """
    assert parse_docstring(doc) == ("Do the thing.", {"level": "How much."})


def test_a_docstring_that_cannot_be_parsed_is_refused() -> None:
    async def garbled(x: int) -> str:
        """Garbled.

        Args:
            x
        """
        return ""

    with pytest.raises(ValueError, match="the docstring cannot be parsed"):
        parse_docstring(garbled.__doc__)
    with pytest.raises(TypeError, match="garbled: the docstring cannot be parsed"):
        schema_from_function(garbled)
