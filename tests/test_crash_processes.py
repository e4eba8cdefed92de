"""kill -9 of a real runtime process mid-turn, then a restart:
the message is answered exactly once."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import trio

from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.vocab.model import Kind, Outcome, Role, Status, user_text

DAEMON = Path(__file__).parent / "data" / "agent_daemon.py"


async def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll (real processes: no virtual clock) until predicate() is true;
    a hang guard, not a speed goal."""
    with trio.fail_after(timeout_s):
        while not predicate():  # noqa: ASYNC110 - another process writes the store: nothing to wait on here
            await trio.sleep(0.02)
    assert predicate(), what


async def test_kill_9_mid_tool_then_restart_answers_exactly_once(tmp_path: Path) -> None:
    db, sessions = tmp_path / "kesoku.db", tmp_path / "sessions"
    store = Store(db)
    gateway = Gateway(store, sessions)
    session = gateway.open_session("terminal", "crash")
    argv = [sys.executable, str(DAEMON), str(db), str(sessions), "3600"]

    first = await trio.lowlevel.open_process(argv)
    try:
        root = await gateway.post(user_text(session.id, "please run the slow tool"))
        started = sessions / "tool-started"
        await wait_for(started.exists, "the tool started in the first process")
        os.kill(first.pid, signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
    finally:
        if first.returncode is None:
            first.kill()
    history = store.history(session.id)
    assert [(m.role, m.kind) for m in history] == [
        (Role.USER, Kind.TEXT),
        (Role.ASSISTANT, Kind.TOOL_CALL),
    ]
    assert store.get_message(root.id).status is Status.PROCESSING  # type: ignore[union-attr]

    second = await trio.lowlevel.open_process(argv)
    try:

        def answered() -> bool:
            msg = store.get_message(root.id)
            return msg is not None and msg.status is Status.DONE

        await wait_for(answered, "the restarted process finished the turn")
        await trio.sleep(0.5)  # room for a wrong second answer to show up
    finally:
        second.kill()
        await second.wait()
    history = store.history(session.id)
    assert [(m.role, m.kind) for m in history] == [
        (Role.USER, Kind.TEXT),
        (Role.ASSISTANT, Kind.TOOL_CALL),
        (Role.TOOL, Kind.TOOL_RESULT),
        (Role.ASSISTANT, Kind.TEXT),
    ]
    result, answer = history[2], history[3]
    assert result.metadata.outcome is Outcome.LOST
    assert result.parent_id == history[1].id
    assert answer.content == "answered"
    assert answer.root_id == root.id
    store.close()
