"""Many live sessions under a low open-file limit: `kesoku start` drains them all and keeps running.

Each live worker used to keep its session's lock file open, so a thousand pending sessions at the
common 1024 limit killed the daemon with EMFILE, and again at every restart (it recovers the same
messages). The daemon runs as the real CLI with the scripted model, its soft *and* hard
``RLIMIT_NOFILE`` set low (so raising the soft limit at start cannot help it).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from runtime_harness import close_store
from test_cli_start import CLEARED, eventually, setup

from kesoku.agent.runtime import Runtime
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.store.locks import SessionLocks
from kesoku.testing import ScriptedLLM
from kesoku.vocab.model import Status, user_text

SESSIONS = 1_100
OPEN_FILES = 256
"""Well below SESSIONS: one descriptor per live session cannot fit."""


def seed(tmp_path: Path, count: int) -> list[int]:
    """``count`` sessions with one pending user message each; returns the message ids."""
    store = Store(tmp_path / "kesoku.db")
    try:
        sessions = [
            store.create_session("test", f"chan-{i}", workspace_root=tmp_path / "sessions")
            for i in range(count)
        ]
        inserted = store.insert_messages(
            [user_text(s.id, f"hello {i}") for i, s in enumerate(sessions)]
        )
        return [i.message.id for i in inserted]
    finally:
        store.close()


def statuses(tmp_path: Path, ids: list[int]) -> dict[Status, int]:
    store = Store(tmp_path / "kesoku.db")
    try:
        counts: dict[Status, int] = {}
        for message_id in ids:
            message = store.get_message(message_id)
            assert message is not None
            counts[message.status] = counts.get(message.status, 0) + 1
        return counts
    finally:
        store.close()


def low_file_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def test_1100_pending_sessions_drain_under_a_low_open_file_limit(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml", "worker_idle_s = 600\n")  # every worker stays live to the end
    ids = seed(tmp_path, SESSIONS)
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    with open(tmp_path / "daemon.log", "w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kesoku", "start", "-c", str(tmp_path / "kesoku.toml")],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            preexec_fn=low_file_limit,
        )
        try:

            def done() -> bool:
                return (
                    statuses(tmp_path, ids).get(Status.DONE) == SESSIONS or proc.poll() is not None
                )

            eventually(done, timeout_s=240)
            assert proc.poll() is None, "the daemon exited"
            # Every worker is still live (worker_idle_s): the daemon holds all the sessions at once.
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
            assert fds < OPEN_FILES // 2
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log.seek(0)
        lines = log.read().splitlines()
    assert statuses(tmp_path, ids) == {Status.DONE: SESSIONS}
    text = "\n".join(lines)
    assert "Too many open files" not in text and "Traceback" not in text, text[-3000:]
    assert "recovering 1100 open user message(s)" in text
    assert lines[-1].endswith("info daemon: stopped")
    # one lock file for all
    assert len(list((tmp_path / "sessions" / ".locks").glob("*.lock"))) == 1


class NoDescriptors:
    """A process's lock table whose first two locks find the process out of descriptors (EMFILE)."""

    def __init__(self, real: SessionLocks) -> None:
        self.real = real
        self.failures = 2

    def acquire(self, session_id: str) -> bool:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files", "sessions.lock")
        return self.real.acquire(session_id)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


async def test_a_lock_that_cannot_be_taken_leaves_the_message_waiting_and_the_dispatcher_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = seed(tmp_path, 2)
    store = Store(tmp_path / "kesoku.db")
    gateway = Gateway(store, tmp_path / "sessions")
    gateway.locks = NoDescriptors(gateway.locks)  # type: ignore[assignment]
    rt = Runtime(gateway, ScriptedLLM([{"text": "ok"}], loop=True))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(rt.serve)
            with trio.fail_after(30):
                while store.open_user_messages(up_to=max(ids)):  # noqa: ASYNC110 -- a retry on a timer
                    await trio.sleep(0.05)
            assert not rt.dispatcher.crashes
            nursery.cancel_scope.cancel()
    finally:
        await close_store(store)
    assert statuses(tmp_path, ids) == {Status.DONE: 2}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2  # one line per session that had to wait
    assert all("cannot take its lock ([Errno 24] Too many open files" in w for w in warnings)
    assert all("retried every 1 s" in w for w in warnings)


def test_the_daemon_raises_its_soft_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    code = (
        "import logging, resource; logging.basicConfig(level=logging.INFO, format='%(message)s');"
        "from kesoku.host.daemon import raise_open_file_limit; print(raise_open_file_limit());"
        "print(resource.getrlimit(resource.RLIMIT_NOFILE))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, 2 * OPEN_FILES)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split("\n")[:2] == ["512", "(512, 512)"]
    assert result.stderr.strip() == "open-file limit raised from 256 to 512 (the hard limit)"
