"""`kesoku sessions list | show | clear | fork | export`, run as the real CLI on sessions made by
`kesoku chat`; and the store methods behind them (prefix lookup, fork) on a real SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from test_cli_chat import chat, environ, history, kesoku, setup

from kesoku.store import Store, UnknownSessionError
from kesoku.vocab.errors import AmbiguousSessionError
from kesoku.vocab.model import Kind, Role, Status
from kesoku.vocab.schedule import new_schedule


def two_sessions(tmp_path: Path) -> list[str]:
    setup(tmp_path, "answer.yaml")
    for prompt in ("What is the capital?", "And again?"):
        assert chat(tmp_path, prompt).returncode == 0
    store = Store(tmp_path / "kesoku.db")
    try:
        return [s.id for s in store.list_sessions()]
    finally:
        store.close()


def test_list_show_and_export(tmp_path: Path) -> None:
    first, second = two_sessions(tmp_path)
    listed = kesoku(tmp_path, "sessions", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["ID", "CREATED", "ADAPTER", "TURNS", "TITLE"]
    assert [line.split()[0] for line in lines[1:]] == [first, second]
    shown = kesoku(tmp_path, "sessions", "show", first[:6])
    assert shown.returncode == 0, shown.stderr
    assert f"id:          {first}" in shown.stdout
    assert "turns:       1 turn · 2 model calls · 5 messages" in shown.stdout
    assert (
        "tokens:      input 2,100 tokens (0 read from cache, 0 written to it) · "
        "output 50 tokens (0 thinking)" in shown.stdout
    )
    assert "spend:       $0.00" in shown.stdout
    assert "assistant/tool_call  shell(command='echo hi')" in shown.stdout
    exported = kesoku(tmp_path, "sessions", "export", first[:6])
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert records[0]["type"] == "session" and records[0]["id"] == first
    assert [(r["role"], r["kind"]) for r in records[1:]] == [
        ("user", "text"),
        ("assistant", "thought"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]
    assert records[2]["metadata"]["usage"]["input_tokens"] == 900


def test_fork_copies_history_up_to_a_message_and_chat_continues_the_fork(tmp_path: Path) -> None:
    first, _ = two_sessions(tmp_path)
    store = Store(tmp_path / "kesoku.db")
    try:
        call = next(m for m in store.history(first) if m.kind is Kind.TOOL_CALL)
        result = next(m for m in store.history(first) if m.kind is Kind.TOOL_RESULT)
    finally:
        store.close()
    forked = kesoku(tmp_path, "sessions", "fork", first[:6], "--at", str(result.id))
    assert forked.returncode == 0, forked.stderr
    new_id = forked.stdout.split(" into ", 1)[1].split()[0]
    assert forked.stdout.endswith(f"continue it: kesoku chat --session {new_id}\n")
    store = Store(tmp_path / "kesoku.db")
    try:
        fork = store.get_session(new_id)
        assert fork is not None and fork.parent_id == first and fork.adapter == "terminal"
        copied = store.history(new_id)
        original = store.history(first)
    finally:
        store.close()
    assert [(m.role, m.kind, m.content) for m in copied] == [
        (m.role, m.kind, m.content) for m in original[:4]
    ]
    user, _, copied_call, copied_result = copied
    assert {m.root_id for m in copied} == {user.id} and user.id != original[0].id
    assert copied_result.parent_id == copied_call.id != call.id
    # The fork is a terminal session: kesoku chat continues it (the scenario starts over, from step
    # 1).
    assert chat(tmp_path, "--session", new_id[:6], "Once more?").returncode == 0
    titles = kesoku(tmp_path, "sessions", "list").stdout
    assert f"(fork of {first})" in titles
    unknown = kesoku(tmp_path, "sessions", "fork", first, "--at", "999999")
    assert unknown.returncode == 2
    assert unknown.stderr.startswith("kesoku: fork --at 999999: message 999999 is not in session")


def test_clear_deletes_the_session_and_its_workspace(tmp_path: Path) -> None:
    first, second = two_sessions(tmp_path)
    workspace = tmp_path / "sessions" / first
    assert workspace.is_dir()
    cleared = kesoku(tmp_path, "sessions", "clear", first[:8])
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout.startswith(f"deleted session {first} (5 messages")
    assert cleared.stderr == ""  # no schedule targets it
    assert not workspace.exists()
    assert [
        line.split()[0] for line in kesoku(tmp_path, "sessions", "list").stdout.splitlines()[1:]
    ] == [second]
    store = Store(tmp_path / "kesoku.db")
    store.put_schedule(
        new_schedule("nightly", every="1d", prompt="p", target=f"session:{second}", now=0)
    )
    store.close()
    targeted = kesoku(tmp_path, "sessions", "clear", second)
    assert targeted.returncode == 0, targeted.stderr
    assert targeted.stderr.startswith("schedule(s) nightly still target it and will not run")
    again = kesoku(tmp_path, "sessions", "clear", first)
    assert again.returncode == 2
    assert (
        again.stderr
        == f"kesoku: session {first}: no such session (kesoku sessions list shows them)\n"
    )
    short = kesoku(tmp_path, "sessions", "show", second[:3])
    assert short.returncode == 2
    assert short.stderr == (
        f"kesoku: session {second[:3]}: no such session; give at least 4 characters of the id"
        " (kesoku sessions list shows them)\n"
    )


def test_a_missing_database_is_not_created(tmp_path: Path) -> None:
    setup(tmp_path, "answer.yaml")
    # Before anything was stored, listing is not an error: nothing yet, and how to start.
    for args in (("sessions", "list"), ("sessions", "list", "--adapter", "discord")):
        listed = kesoku(tmp_path, *args)
        assert (listed.returncode, listed.stderr) == (0, ""), args
    assert kesoku(tmp_path, "sessions", "list").stdout == (
        'no sessions yet; start one with: kesoku chat "your question" (or just kesoku chat)\n'
    )
    assert listed.stdout == "no discord sessions yet\n"
    shown = kesoku(tmp_path, "sessions", "show", "3f2a")  # a session named: that one is missing
    assert shown.returncode == 2
    assert "no database at" in shown.stderr
    assert not (tmp_path / "kesoku.db").exists()


def test_counts_agree_with_their_nouns(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")  # one answer per turn: 2 messages
    assert chat(tmp_path, "hello").returncode == 0
    (session,) = {r[0] for r in history(tmp_path)}
    shown = kesoku(tmp_path, "sessions", "show", session, "--limit", "1")
    assert "turns:       1 turn · " in shown.stdout
    assert "… 1 earlier message (--limit 0 shows all)" in shown.stdout
    forked = kesoku(tmp_path, "sessions", "fork", session, "--at", str(first_id(tmp_path)))
    assert "(1 message); continue it" in forked.stdout, forked.stdout
    fork = forked.stdout.split(" into ", 1)[1].split()[0]
    exported = kesoku(tmp_path, "sessions", "export", fork, "-o", "fork.jsonl")
    assert exported.stderr == f"wrote 1 message of session {fork} to fork.jsonl\n"
    cleared = kesoku(tmp_path, "sessions", "clear", fork)
    assert cleared.stdout.startswith(f"deleted session {fork} (1 message and its workspace ")


def first_id(tmp_path: Path) -> int:
    store = Store(tmp_path / "kesoku.db")
    try:
        (session,) = store.list_sessions()
        return store.history(session.id)[0].id
    finally:
        store.close()


def test_a_prefix_names_one_session_or_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = iter(["abcd1111" + "0" * 24, "abcd2222" + "0" * 24, "ffff0000" + "0" * 24])
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(next(ids)))
    store = Store(tmp_path / "kesoku.db")
    try:
        a, b, c = (
            store.create_session("terminal", f"c{i}", workspace_root=tmp_path) for i in range(3)
        )
        assert store.resolve_session("abcd1") == a
        assert store.resolve_session(c.id) == c
        with pytest.raises(AmbiguousSessionError) as ambiguous:
            store.resolve_session("abcd")
        assert ambiguous.value.matches == [a, b]
        assert str(ambiguous.value) == "2 sessions start with it; give more of the id"
        with pytest.raises(
            UnknownSessionError, match=r"^no such session; give at least 4 characters of the id$"
        ):
            store.resolve_session("fff")  # shorter than 4 characters: only a whole id
        with pytest.raises(UnknownSessionError, match=r"^no such session$"):
            store.resolve_session("0123")
    finally:
        store.close()


def test_a_fork_does_not_inherit_a_pending_turn_or_external_ids(tmp_path: Path) -> None:
    from kesoku.vocab.model import Message

    store = Store(tmp_path / "kesoku.db")
    try:
        s = store.create_session("discord", "thread-1", workspace_root=tmp_path)
        (done,) = store.insert_messages(
            [Message(session_id=s.id, role=Role.USER, sender="ann", content="hi", external_id="d1")]
        )
        store.insert_messages(
            [
                Message(
                    session_id=s.id,
                    role=Role.USER,
                    sender="ann",
                    content="more",
                    status=Status.PENDING,
                )
            ]
        )
        fork = store.fork_session(
            s.id, adapter="terminal", channel_id="tty-x", workspace_root=tmp_path
        )
        copied = store.history(fork.id)
        assert [(m.content, m.status, m.external_id) for m in copied] == [
            ("hi", Status.DONE, None),
            ("more", Status.INTERRUPTED, None),
        ]
        assert store.open_user_messages(up_to=store.last_message_id()) == [store.history(s.id)[1]]
        assert done.message.external_id == "d1"
    finally:
        store.close()


def test_a_reader_that_leaves_early_ends_any_command_quietly(tmp_path: Path) -> None:
    """`kesoku sessions show ID | tail -6`, `kesoku config schema | head -c 600`:
    no BrokenPipeError traceback."""
    first, _ = two_sessions(tmp_path)
    for args in (
        ["config", "schema"],
        ["sessions", "show", first],
        ["sessions", "export", first],
        ["trace", first, "-o", "-"],
        ["chat", "-c", "kesoku.toml", "What is the capital?"],
        ["--version"],
    ):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first write: every write meets a closed pipe
        try:
            result = subprocess.run(
                [sys.executable, "-m", "kesoku", *args],
                cwd=tmp_path,
                env=environ(tmp_path),
                stdin=subprocess.DEVNULL,
                stdout=write,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            os.close(write)
        assert result.returncode == 141, (args, result.stderr)
        # chat's activity stays
        assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, args
