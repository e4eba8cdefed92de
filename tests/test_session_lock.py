"""One process at a time runs a session: the lock files, and two runtimes sharing one database.

Two gateways in one test stand for two processes: flock(2) locks belong to the open file, so a
second open of the same lock file conflicts exactly as another process's would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trio
from runtime_harness import serve_runtime

from kesoku.store.locks import SessionLocks
from kesoku.testing import ScriptedLLM
from kesoku.vocab.model import Role, Status


def test_a_lock_is_exclusive_counted_and_dropped_with_its_process(tmp_path: Path) -> None:
    mine, theirs = SessionLocks(tmp_path), SessionLocks(tmp_path)
    assert mine.acquire("s1") and mine.acquire("s1")  # the chat and the worker of one process
    assert not theirs.acquire("s1")
    assert theirs.holder("s1") == os.getpid()
    assert theirs.acquire("s2")  # other sessions are free
    mine.release("s1")
    assert not theirs.acquire("s1")  # one holder left
    mine.release("s1")
    assert theirs.acquire("s1")
    theirs.close()
    # A process that dies (kill -9 included) drops its locks: the kernel closes its descriptors.
    code = (
        "from kesoku.store.locks import SessionLocks; "
        f"assert SessionLocks({str(tmp_path)!r}).acquire('s3')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert mine.acquire("s3")
    mine.close()


def test_the_holders_pid_file_goes_with_its_lock(tmp_path: Path) -> None:
    mine, theirs = SessionLocks(tmp_path), SessionLocks(tmp_path)
    assert mine.acquire("s1") and mine.acquire("s2")
    assert sorted(p.name for p in tmp_path.glob("*.pid")) == ["s1.pid", "s2.pid"]
    mine.release("s1")
    assert not (tmp_path / "s1.pid").exists()  # a session held once leaves nothing behind
    assert theirs.acquire("s1")
    assert mine.holder("s1") == os.getpid()  # the new holder's own file
    theirs.release("s1")
    mine.close()  # every lock it held goes, and their files
    assert list(tmp_path.glob("*.pid")) == []


async def test_only_the_holder_answers_and_a_freed_session_is_taken_over(tmp_path: Path) -> None:
    llm_a = ScriptedLLM([{"text": "from A"}])
    llm_b = ScriptedLLM([{"text": "from B"}])
    async with (
        serve_runtime(tmp_path, llm_a, worker_idle_s=0.5) as a,
        serve_runtime(tmp_path, llm_b) as b,
    ):
        assert a.session.id == b.session.id
        assert a.gateway.locks.acquire(a.session.id)  # process A is running the session (a chat)
        first = await b.say("hello")  # posted by process B
        with trio.fail_after(10):
            await a.turn_end()  # A's dispatcher saw B's post in the database and answered it
        assert first.id in b.rt.dispatcher.busy  # B left it to A
        a.gateway.locks.release(a.session.id)  # the chat is done; A's worker ends once idle
        with trio.fail_after(10):
            while a.rt.dispatcher.workers or b.rt.dispatcher.busy:  # noqa: ASYNC110 -- other processes' state
                await trio.sleep(0.05)
        await b.say("again")
        with trio.fail_after(10):
            await b.turn_end()
        history = b.history()
    answers = [m.content for m in history if m.role is Role.ASSISTANT]
    assert answers == ["from A", "from B"]  # each message answered once, by one process
    assert len(llm_a.requests) == len(llm_b.requests) == 1
    assert "again" in repr(llm_b.requests[0].turns)
    assert {m.status for m in history if m.role is Role.USER} == {Status.DONE}
