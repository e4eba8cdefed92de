"""Structs the garbage collector does not track (msgspec ``gc=False``) cannot hold a cycle.

A worker's first request makes a ``Message`` per stored message and an ``LLMTurn`` and blocks per
turn: untracked, the collector never scans them. A cycle through an untracked struct is never
collected, so such a struct must only reach values that cannot lead back to it: scalars, enums,
tuples, frozen structs (their fields are set when they are made, so they can only point to older
objects), and dicts of JSON data (decoded JSON or a model's arguments: no cycle, no Kesoku object).
"""

from __future__ import annotations

import gc
import importlib
import pkgutil

import msgspec
import msgspec.inspect as mi
import pytest

import kesoku.vocab
from kesoku.agent.history import SessionHistory
from kesoku.gateway import Gateway
from kesoku.vocab import model
from kesoku.vocab.model import Kind, Metadata, Role

# Every module of the vocabulary, where the untracked structs live (the walk below finds those of
# every kesoku module imported).
for _info in pkgutil.iter_modules(kesoku.vocab.__path__, "kesoku.vocab."):
    importlib.import_module(_info.name)

JSON_DATA = {"Metadata.tool_arguments", "Metadata.extra", "ToolCallBlock.arguments"}
"""The dict fields of untracked structs: JSON data only (decoded, or a model's arguments)."""

_SCALARS = (
    mi.NoneType,
    mi.BoolType,
    mi.IntType,
    mi.FloatType,
    mi.StrType,
    mi.BytesType,
    mi.EnumType,
    mi.LiteralType,
)


def _untracked_structs() -> list[type[msgspec.Struct]]:
    found: list[type[msgspec.Struct]] = []
    todo = list(msgspec.Struct.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.startswith("kesoku.") and not cls.__struct_config__.gc:
            found.append(cls)
    return found


def cycle_risks(cls: type[msgspec.Struct]) -> list[str]:
    """Where an instance of ``cls`` could reach a mutable value (other than JSON data)."""
    risks: list[str] = []

    def walk(tp: mi.Type, where: str) -> None:
        if isinstance(tp, _SCALARS):
            return
        if isinstance(tp, mi.UnionType):
            for member in tp.types:
                walk(member, where)
        elif isinstance(tp, mi.VarTupleType | mi.FrozenSetType):
            walk(tp.item_type, f"{where}[]")
        elif isinstance(tp, mi.TupleType):
            for item in tp.item_types:
                walk(item, f"{where}[]")
        elif isinstance(tp, mi.StructType):
            if not tp.cls.__struct_config__.frozen:
                risks.append(f"{where}: {tp.cls.__name__} is not frozen")
                return
            for field in tp.fields:
                walk(field.type, f"{tp.cls.__name__}.{field.name}")
        elif not (isinstance(tp, mi.DictType) and where in JSON_DATA):
            risks.append(f"{where}: {type(tp).__name__} is mutable")

    walk(mi.type_info(cls), cls.__name__)
    return risks


def test_the_vocabulary_has_untracked_structs() -> None:
    names = {cls.__name__ for cls in _untracked_structs()}
    assert {"Message", "Metadata", "LLMTurn", "TextBlock", "ToolCallBlock"} <= names


@pytest.mark.parametrize("cls", _untracked_structs(), ids=lambda cls: cls.__name__)
def test_an_untracked_struct_reaches_nothing_that_could_lead_back_to_it(
    cls: type[msgspec.Struct],
) -> None:
    assert cycle_risks(cls) == []


class Node(msgspec.Struct, frozen=True, gc=False):
    """Could hold itself: its list is mutable."""

    children: list[Node]


class Loose(msgspec.Struct, gc=False):
    """Not frozen: a field could be set to what holds it."""

    value: int


class Holder(msgspec.Struct, frozen=True, gc=False):
    loose: Loose
    named: dict[str, model.Message]


def test_a_struct_that_could_hold_itself_is_found() -> None:
    assert cycle_risks(Node) == ["Node.children: ListType is mutable"]
    assert cycle_risks(Holder) == [
        "Holder.loose: Loose is not frozen",
        "Holder.named: DictType is mutable",
    ]


async def test_a_read_session_and_its_turns_are_not_tracked(
    gateway: Gateway, session: model.Session
) -> None:
    root = await gateway.post(model.user_text(session.id, "hi"))
    meta = Metadata(tool_name="sh", tool_arguments={"cmd": ["ls", "-l"]}, extra={"k": {"v": 1}})
    call = await gateway.post(
        model.in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "", metadata=meta)
    )
    done = Metadata(tool_name="sh", outcome=model.Outcome.COMPLETED)
    await gateway.post(
        model.in_turn(root, Role.TOOL, Kind.TOOL_RESULT, "a.txt", parent_id=call.id, metadata=done)
    )
    history = SessionHistory(gateway, session.id)
    history.sync()
    turns = history.turns(root)
    history.close()
    objects = [
        *history.messages,
        *(m.metadata for m in history.messages),
        *turns,
        *(block for turn in turns for block in turn.blocks),
    ]
    assert len(history.messages) == 3 and len(turns) == 3
    assert [type(o).__name__ for o in objects if gc.is_tracked(o)] == []
