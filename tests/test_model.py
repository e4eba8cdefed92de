import msgspec
import pytest

from kesoku.vocab.model import (
    ASSISTANT_SENDER,
    Kind,
    Message,
    MessageError,
    Metadata,
    Outcome,
    Role,
    Status,
    Usage,
    check_message,
    in_turn,
    system_text,
    user_text,
)


def posted(msg: Message, id_: int = 7) -> Message:
    return msgspec.structs.replace(msg, id=id_, root_id=id_)


def test_user_text_opens_a_pending_turn() -> None:
    msg = user_text("s1", "hello", sender="alice", ts=100.0)
    assert (msg.role, msg.kind, msg.status, msg.sender) == (
        Role.USER,
        Kind.TEXT,
        Status.PENDING,
        "alice",
    )
    assert msg.ts == msg.root_ts == 100.0
    check_message(msg)


def test_in_turn_follows_the_root_and_sets_the_sender() -> None:
    root = posted(user_text("s1", "hi", ts=50.0))
    call = in_turn(
        root, Role.ASSISTANT, Kind.TOOL_CALL, "", metadata=Metadata(tool_name="shell"), ts=51.0
    )
    assert (call.sender, call.root_id, call.root_ts, call.session_id) == (
        ASSISTANT_SENDER,
        7,
        50.0,
        "s1",
    )
    check_message(call)
    result = in_turn(
        root,
        Role.TOOL,
        Kind.TOOL_RESULT,
        "ok",
        parent_id=8,
        metadata=Metadata(tool_name="shell", outcome=Outcome.COMPLETED),
    )
    assert result.sender == "shell"
    check_message(result)


def test_in_turn_needs_a_posted_root() -> None:
    with pytest.raises(MessageError, match="must be posted"):
        in_turn(user_text("s1", "hi"), Role.ASSISTANT, Kind.TEXT, "x")
    with pytest.raises(MessageError, match="opens its own turn"):
        in_turn(posted(user_text("s1", "hi")), Role.USER, Kind.TEXT, "x")


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (
            Message(session_id="s", role=Role.USER, kind=Kind.THOUGHT, sender="u"),
            "user message cannot be a thought",
        ),
        (Message(session_id="s", role=Role.USER, sender=""), "needs a sender"),
        (Message(session_id="", role=Role.USER, sender="u"), "needs a session_id"),
        (Message(session_id="s", role=Role.ASSISTANT, sender="bob"), "sent by 'Kesoku'"),
        (
            Message(session_id="s", role=Role.ASSISTANT, kind=Kind.TOOL_CALL, sender="Kesoku"),
            "tool_name",
        ),
        (
            Message(
                session_id="s",
                role=Role.TOOL,
                kind=Kind.TOOL_RESULT,
                sender="x",
                parent_id=1,
                metadata=Metadata(tool_name="shell", outcome=Outcome.FAILED),
            ),
            "sender must equal",
        ),
        (
            Message(
                session_id="s",
                role=Role.TOOL,
                kind=Kind.TOOL_RESULT,
                sender="shell",
                metadata=Metadata(tool_name="shell", outcome=Outcome.FAILED),
            ),
            "needs parent_id",
        ),
        (
            Message(
                session_id="s",
                role=Role.TOOL,
                kind=Kind.TOOL_RESULT,
                sender="shell",
                parent_id=1,
                metadata=Metadata(tool_name="shell"),
            ),
            "needs metadata.outcome",
        ),
        (Message(session_id="s", role=Role.SYSTEM, sender="Kesoku"), "sent by 'System'"),
        (
            Message(session_id="s", role=Role.TOOL, kind=Kind.TEXT, sender="x"),
            "tool message cannot be a text",
        ),
    ],
)
def test_rules_refuse_bad_messages(msg: Message, error: str) -> None:
    with pytest.raises(MessageError, match=error):
        check_message(msg)


def test_system_text_is_valid() -> None:
    check_message(system_text("s", "restarted"))


def test_metadata_round_trips_as_json_with_defaults_omitted() -> None:
    meta = Metadata(
        tool_name="t",
        tool_arguments={"a": [1, 2]},
        thought_signature=b"\x00\xffsig",
        usage=Usage(input_tokens=10, output_tokens=5),
        outcome=Outcome.TIMED_OUT,
    )
    data = msgspec.json.encode(meta)
    assert msgspec.json.decode(data, type=Metadata) == meta
    assert msgspec.json.encode(Metadata()) == b"{}"
    assert meta.usage is not None
    assert meta.usage.total_tokens == 15


def test_metadata_from_a_newer_writer_still_decodes() -> None:
    meta = msgspec.json.decode(b'{"tool_name":"x","added_later":1}', type=Metadata)
    assert meta.tool_name == "x"


def test_every_outcome_of_the_design_exists() -> None:
    assert {o.value for o in Outcome} == {
        "completed",
        "failed",
        "timed_out",
        "skipped",
        "killed",
        "lost",
        "repeated",
        "truncated",
    }
