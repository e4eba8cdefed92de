"""A database another process keeps locked: a visible wait, then one line; never a raw traceback.

The lock is held by a real second process in a write transaction (``BEGIN IMMEDIATE``), so the
message can name its pid (read from /proc/locks).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from runtime_harness import close_store
from test_cli_chat import chat, history, setup, start_chat

from kesoku import gateway as gateway_module
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.vocab.errors import StoreError
from kesoku.vocab.model import user_text

LOCKER = """
import sys, apsw
conn = apsw.Connection(sys.argv[1])
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
sys.stdin.read()  # held until the test closes stdin
conn.execute("ROLLBACK")
"""


def hold_write_lock(db: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.wait(30)
    proc.stdout.close()


def chat_on_a_locked_database(
    tmp_path: Path,
) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """A session with one answered turn, its database's write lock held by another process, and a
    ``kesoku chat --session`` started to ask "second" in it: (the chat, the lock holder)."""
    setup(tmp_path, "echo.yaml")
    first = chat(tmp_path, "first")
    assert first.returncode == 0, first.stderr
    session = history(tmp_path)[0][0]
    locker = hold_write_lock(tmp_path / "kesoku.db")
    return start_chat(tmp_path, "--session", session[:8], "second"), locker


def test_a_chat_waits_visibly_for_a_locked_database_and_its_answer_is_stored(
    tmp_path: Path,
) -> None:
    proc, locker = chat_on_a_locked_database(tmp_path)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith(f"kesoku: database busy (held by pid {locker.pid}?), waiting… ("), (
            line
        )
        assert line.rstrip().endswith("kesoku.db)")
    finally:
        release(locker)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out == "noted.\n"
    assert "Traceback" not in err
    assert [row[3] for row in history(tmp_path)] == ["first", "noted.", "second", "noted."]


async def test_a_database_locked_for_too_long_fails_with_one_line_naming_it_and_its_holder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_module, "BUSY_RETRY_S", 0.1)
    monkeypatch.setattr(gateway_module, "BUSY_GIVE_UP_S", 0.3)
    db = tmp_path / "kesoku.db"
    store = Store(db, busy_timeout_ms=10)
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("test", "room")
    locker = await trio.to_thread.run_sync(hold_write_lock, db)
    try:
        with pytest.raises(StoreError) as caught:
            await gateway.post(user_text(session.id, "hello"))
    finally:
        await trio.to_thread.run_sync(release, locker)
    assert str(caught.value) == (
        f"{db}: the database stayed locked for 0.3 s (held by pid {locker.pid}?); the message was "
        "not stored"
    )
    assert store.history(session.id) == []
    await close_store(store)


async def test_an_answer_that_cannot_be_stored_ends_a_one_shot_chat_with_one_line_and_exit_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The lock is taken while the model answers: the answer cannot be stored; the chat says so."""
    from kesoku_terminal.oneshot import run_oneshot

    from kesoku.agent.runtime import Runtime
    from kesoku.testing import ScriptedLLM, Step
    from kesoku.vocab.ir import LLMRequest

    monkeypatch.setattr(gateway_module, "BUSY_RETRY_S", 0.1)
    monkeypatch.setattr(gateway_module, "BUSY_GIVE_UP_S", 0.3)
    db = tmp_path / "kesoku.db"
    store = Store(db, busy_timeout_ms=10)
    gateway = Gateway(store, tmp_path / "sessions")
    session = gateway.open_session("terminal", "tty")
    lockers: list[subprocess.Popen[str]] = []

    def respond(request: LLMRequest) -> Step:
        lockers.append(hold_write_lock(db))  # another process starts a long write transaction
        return Step(text="an answer nobody will have")

    rt = Runtime(gateway, ScriptedLLM(responder=respond))
    try:
        code = await run_oneshot(rt, session, "hello")
    finally:
        for locker in lockers:
            await trio.to_thread.run_sync(release, locker)
    out, err = capsys.readouterr()
    assert out == ""  # stdout is no terminal: the answer is written once stored, so never here
    assert code == 1  # failed: a script sees the answer was not delivered
    assert "Traceback" not in err
    (pid,) = [p.pid for p in lockers]
    # What `kesoku chat` prints on stderr (one line each: its log shows warnings and errors).
    assert [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")][:2] == [
        f"database busy (held by pid {pid}?), waiting… ({db})",
        f"session {session.id}: {db}: the database stayed locked for 0.3 s (held by pid {pid}?); "
        "the message was not stored",
    ]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback anywhere
    assert [m.content for m in store.history(session.id)] == ["hello"]  # the answer was not stored
    await close_store(store)


def test_a_new_chat_on_a_database_locked_past_the_busy_timeout_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    """Any write, not only a message's post: here the new session's row,
    after the 5 s busy timeout."""
    setup(tmp_path, "echo.yaml")
    assert chat(tmp_path, "first").returncode == 0  # the database and its schema exist
    db = tmp_path / "kesoku.db"
    locker = hold_write_lock(db)
    try:
        result = chat(tmp_path, "a new session")
    finally:
        release(locker)
    assert result.returncode == 2  # an operator's error, as an unreadable database is
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"kesoku: {db}: database is locked (held by pid {locker.pid}?)"
    ]
    assert [row[3] for row in history(tmp_path)] == ["first", "noted."]  # nothing half-written


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_question_waits_for_the_database_ends_the_chat_at_once(
    tmp_path: Path, signum: signal.Signals
) -> None:
    proc, locker = chat_on_a_locked_database(tmp_path)
    try:
        assert proc.stderr is not None
        assert "database busy" in proc.stderr.readline()  # the question is waiting to be stored
        proc.send_signal(signum)
        # The lock is still held: a chat that waited for it would still be waiting here.
        out, err = proc.communicate(timeout=20)
    finally:
        release(locker)
    assert proc.returncode == 128 + signum, err
    assert out == ""
    assert err == "kesoku: stopped before the question was stored; nothing was asked\n"
    assert [row[3] for row in history(tmp_path)] == ["first", "noted."]
