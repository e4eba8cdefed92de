"""`kesoku start`, the real CLI in a subprocess: messages from other processes, signals, adapters.

Messages are written to the daemon's database by this test process (the gateway delivers another
process's commits within ~50 ms); adapters come from a fake distribution put on PYTHONPATH, found
through the same ``kesoku.adapters`` entry points as the real ones.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kesoku.store import Store
from kesoku.vocab.model import Kind, Outcome, Role, Status, user_text

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = Path(__file__).resolve().parent / "data" / "scenarios"
CLEARED = (
    "KESOKU_CONFIG",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "JOURNAL_STREAM",
)


def setup(tmp_path: Path, scenario: str, extra: str = "") -> Path:
    shutil.copy(SCENARIOS / scenario, tmp_path / "scenario.yaml")
    config = tmp_path / "kesoku.toml"
    config.write_text(f'[agent]\nllm = "scripted"\n{extra}[scripted]\npath = "scenario.yaml"\n')
    return config


def eventually(check: Callable[[], Any], timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        threading.Event().wait(0.05)
    return result


class Daemon:
    """`kesoku start` in a subprocess, its stderr collected line by line."""

    def __init__(self, tmp_path: Path, **env: str) -> None:
        environ = {k: v for k, v in os.environ.items() if k not in CLEARED} | env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kesoku", "start", "-c", str(tmp_path / "kesoku.toml")],
            cwd=tmp_path,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the daemon logs to stderr only
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_line(self, text: str, timeout_s: float = 20) -> str:
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((ln for ln in self.lines if text in ln), None), timeout_s
            )
        assert found, f"no log line with {text!r}:\n" + "\n".join(self.lines)
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """Make sure the process is gone and its pipe closed (every test ends with this)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(10)
        assert self.proc.stderr is not None
        self.proc.stderr.close()


def post(tmp_path: Path, adapter: str, text: str) -> tuple[str, int]:
    """Write a user message as another process would; returns (session id, message id)."""
    store = Store(tmp_path / "kesoku.db")
    try:
        session = store.create_session(
            adapter, f"{adapter}-chan", workspace_root=tmp_path / "sessions"
        )
        (inserted,) = store.insert_messages([user_text(session.id, text)])
        return session.id, inserted.message.id
    finally:
        store.close()


def messages(tmp_path: Path, session_id: str) -> list[Any]:
    store = Store(tmp_path / "kesoku.db")
    try:
        return store.history(session_id)
    finally:
        store.close()


def test_the_daemon_answers_other_processes_and_logs_one_plain_line_per_event(
    tmp_path: Path,
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon = Daemon(tmp_path)
    try:
        ready = daemon.wait_line("ready: backend scripted")
        # Nothing enabled: it says so, and what it still does (answering the posts below).
        assert "no chat adapter is enabled ([discord] or [gchat] enabled = true)" in ready
        assert "it still runs schedules and the heartbeat" in ready
        sandbox = daemon.wait_line("daemon: sandbox")  # one line saying what confines the tools
        assert (
            sandbox.endswith("tools write only their workspace, no network")
            or "none works" in sandbox
        )
        terminal, _ = post(tmp_path, "terminal", "for the chat process")
        other, _ = post(tmp_path, "test", "hello")
        line = daemon.wait_line(f"session {other} (test): ⚡ turn 1")
        assert line.endswith("0 tool calls · 0 tokens · " + line.rsplit("tokens · ", 1)[1])
        assert [m.content for m in messages(tmp_path, other)] == ["hello", "noted."]
        # Terminal sessions belong to their `kesoku chat`: the daemon leaves them untouched.
        (left,) = messages(tmp_path, terminal)
        assert left.status is Status.PENDING
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    assert daemon.lines[-1].endswith("info daemon: stopped")
    assert "daemon: SIGTERM: stopping" in "\n".join(daemon.lines)
    for (
        line
    ) in daemon.lines:  # a pipe, not a terminal: ISO time, level, source; no colour, no traceback
        assert "\x1b" not in line and "Traceback" not in line
        assert line[:4].isdigit() and line[10] == "T" and " info " in line


def test_under_journald_each_line_carries_its_syslog_priority(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    daemon = Daemon(tmp_path, JOURNAL_STREAM="8:12345")
    try:
        daemon.wait_line("ready")
        assert daemon.stop(signal.SIGINT) == 0
    finally:
        daemon.kill()
    assert daemon.lines[0].startswith("<6>info daemon: kesoku ")
    assert daemon.lines[-1] == "<6>info daemon: stopped"


def test_sighup_applies_live_keys_names_the_others_and_survives_a_broken_file(
    tmp_path: Path,
) -> None:
    config = setup(tmp_path, "echo.yaml")
    daemon = Daemon(tmp_path)
    try:
        daemon.wait_line("ready")
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_line("SIGHUP: ")
        assert daemon.lines[-1].endswith("reloaded, nothing changed")
        config.write_text(
            config.read_text().replace(
                "[agent]\n", '[agent]\npersona = "You are new."\nmax_retries = 1\n'
            )
        )
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_line("applied agent.persona; restart to apply agent.max_retries")
        config.write_text(config.read_text() + "[agent\n")
        daemon.proc.send_signal(signal.SIGHUP)
        broken = daemon.wait_line("the running config stays")
        assert " error daemon: SIGHUP: " in broken and "invalid TOML" in broken
        session, _ = post(tmp_path, "test", "still there?")
        daemon.wait_line(f"session {session} (test): ⚡ turn 1")
        assert daemon.stop() == 0
    finally:
        daemon.kill()


def test_stop_lets_a_running_tool_finish_and_the_turn_resumes_at_the_next_start(
    tmp_path: Path,
) -> None:
    setup(tmp_path, "tool.yaml")
    daemon = Daemon(tmp_path)
    try:
        daemon.wait_line("ready")
        session, _ = post(tmp_path, "test", "take your time")
        eventually(lambda: any(m.kind is Kind.TOOL_CALL for m in messages(tmp_path, session)))
        started = time.monotonic()
        assert daemon.stop() == 0
        assert time.monotonic() - started > 1.0  # it waited for `sleep 4` rather than cutting it
        daemon.wait_line("running turn(s) get up to 180 s for their tools")
    finally:
        daemon.kill()
    history = messages(tmp_path, session)
    assert history[-1].metadata.outcome is Outcome.COMPLETED
    assert history[-1].content.splitlines()[1] == "slept"
    # cut while thinking: it resumes at the next start
    assert history[0].status is Status.PROCESSING
    again = Daemon(tmp_path)
    try:
        again.wait_line(f"session {session} (test): ⚡ turn 1", timeout_s=30)
        assert again.stop() == 0
    finally:
        again.kill()
    assert messages(tmp_path, session)[-1].content == "The tool is done."


def test_tools_still_running_after_the_grace_period_are_killed(tmp_path: Path) -> None:
    setup(tmp_path, "tool.yaml", extra="shutdown_grace_s = 0.5\n")
    daemon = Daemon(tmp_path)
    try:
        daemon.wait_line("ready")
        session, _ = post(tmp_path, "test", "take your time")
        eventually(lambda: any(m.kind is Kind.TOOL_CALL for m in messages(tmp_path, session)))
        assert daemon.stop() == 0
        daemon.wait_line("tools still running after 0.5 s (agent.shutdown_grace_s): killing them")
    finally:
        daemon.kill()
    assert messages(tmp_path, session)[-1].metadata.outcome is Outcome.KILLED


FAKE_ADAPTERS = '''
"""Adapters of a third-party distribution, for the daemon test."""
import trio
from kesoku.vocab.model import user_text


class Good:
    def enabled(self, config):
        return True

    async def serve(self, rt, config, *, task_status=trio.TASK_STATUS_IGNORED):
        session = rt.gateway.open_session("fake", "room-1")
        task_status.started()
        await rt.gateway.post(user_text(session.id, "from the adapter"))
        await trio.sleep_forever()


class Broken(Good):
    async def serve(self, rt, config, *, task_status=trio.TASK_STATUS_IGNORED):
        raise RuntimeError("no token configured")


class Off(Good):
    def enabled(self, config):
        return False


class NoServe:
    def enabled(self, config):
        return True


class Raising(Good):
    def enabled(self, config):
        raise RuntimeError("cannot read its settings")


good, broken, off, noserve, raising = Good(), Broken(), Off(), NoServe(), Raising()
'''


def fake_distribution(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    info = site / "fake_adapters-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-adapters\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[kesoku.adapters]\n"
        "good = kesoku_fake_adapters:good\n"
        "broken = kesoku_fake_adapters:broken\n"
        "off = kesoku_fake_adapters:off\n"
        "noserve = kesoku_fake_adapters:noserve\n"
        "raising = kesoku_fake_adapters:raising\n"
        "missing = kesoku_fake_missing\n"
    )
    (site / "kesoku_fake_adapters.py").write_text(FAKE_ADAPTERS)
    (site / "kesoku_fake_missing.py").write_text("import kesoku_nonexistent_sdk\n")
    return site


def test_each_adapter_failure_is_one_line_and_the_others_keep_running(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    site = fake_distribution(tmp_path)
    daemon = Daemon(
        tmp_path,
        PYTHONPATH=os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
    )
    try:
        daemon.wait_line("ready")
        daemon.wait_line("adapter good: started")
        daemon.wait_line("(fake): ⚡ turn 1")  # the good adapter's message was answered
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    adapter_lines = sorted(
        ln.split(" daemon: ", 1)[1] for ln in daemon.lines if " daemon: adapter " in ln
    )
    # The broken adapter is restarted with backoff; each failure is one line, traceback folded in.
    broken = [ln for ln in adapter_lines if ln.startswith("adapter broken ")]
    assert broken and broken[0].startswith(
        "adapter broken failed: RuntimeError: no token configured; restart 1 in 1 s | Traceback"
    )
    assert all(" | RuntimeError: no token configured" in ln for ln in broken)
    # off, terminal and the disabled discord and gchat adapters say nothing
    assert adapter_lines == [
        *broken,
        "adapter good: started",
        "adapter missing: cannot load kesoku_fake_missing: ModuleNotFoundError: No module named "
        "'kesoku_nonexistent_sdk'",
        "adapter noserve: enabled, but kesoku_fake_adapters:noserve has no serve() (not built "
        "yet); skipped",
        "adapter raising: its enabled() failed: RuntimeError: cannot read its settings; not "
        "started",
    ]


def test_doctor_names_the_adapter_whose_enabled_failed(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    site = fake_distribution(tmp_path)
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    }
    done = subprocess.run(
        [sys.executable, "-m", "kesoku", "doctor", "--no-call", "-c", "kesoku.toml"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if "adapter raising:" in ln)
    assert lines[at] == (
        "FAIL  adapter raising: its enabled() failed: RuntimeError: cannot read its settings"
    )
    assert "fix or remove the package that registers this adapter" in lines[at + 1]
    assert "the check itself broke" not in done.stdout


KESOKU_CHAT = (sys.executable, "-m", "kesoku", "chat")


def test_a_chat_and_a_daemon_on_one_database_answer_once(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    daemon = Daemon(tmp_path)
    try:
        daemon.wait_line("ready")
        chat = subprocess.run(
            # --local: a chat running its own runtime (through the daemon: test_chat_daemon.py)
            [*KESOKU_CHAT, "--local", "-c", str(tmp_path / "kesoku.toml"), "hi"],
            cwd=tmp_path,
            env={k: v for k, v in os.environ.items() if k not in CLEARED},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert chat.returncode == 0, chat.stderr
        assert chat.stdout == "noted.\n"
        other, _ = post(tmp_path, "test", "and you?")  # the daemon still answers everyone else
        daemon.wait_line(f"session {other} (test): ⚡ turn 1")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    store = Store(tmp_path / "kesoku.db")
    try:
        (terminal,) = store.list_sessions(adapter="terminal")
        answers = [m for m in store.history(terminal.id) if m.role is Role.ASSISTANT]
    finally:
        store.close()
    assert [m.content for m in answers] == ["noted."]
    assert not any("(terminal)" in line for line in daemon.lines)


def test_mode_off_is_a_warning_at_every_start(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    config = tmp_path / "kesoku.toml"
    config.write_text(config.read_text() + '[sandbox]\nmode = "off"\n')
    daemon = Daemon(tmp_path)
    try:
        line = daemon.wait_line("daemon: sandbox off")
        assert " warning " in line
        assert line.endswith(
            'sandbox off ([sandbox] mode = "off"): tools run with Kesoku\'s own access; '
            'set [sandbox] mode = "auto" to confine them'
        )
        daemon.wait_line("ready: backend scripted")  # signals are watched from here on
        assert daemon.stop() == 0
    finally:
        daemon.kill()


SLOW_TOOL = """steps:
  - tool_calls:
      - {name: shell, arguments: {command: "sleep 60; echo slept"}}
"""
AFTER_RESTART = """steps:
  - text: "answered after the restart"
"""


def test_a_turn_whose_tool_a_shutdown_killed_is_answered_after_the_restart(tmp_path: Path) -> None:
    (tmp_path / "scenario.yaml").write_text(SLOW_TOOL)
    (tmp_path / "kesoku.toml").write_text(
        '[agent]\nllm = "scripted"\nshutdown_grace_s = 0.5\n[scripted]\npath = "scenario.yaml"\n'
        '[sandbox]\nmode = "off"\n'
    )
    daemon = Daemon(tmp_path)
    try:
        daemon.wait_line("ready")
        session, root = post(tmp_path, "test", "run the slow one")
        # the call is posted: the tool runs
        eventually(lambda: len(messages(tmp_path, session)) == 2)
        assert daemon.stop() == 0  # the grace (0.5 s) runs out: the tool is killed
    finally:
        daemon.kill()
    assert any("killing them" in line for line in daemon.lines)
    _, _, result = messages(tmp_path, session)
    assert result.metadata.outcome is Outcome.KILLED
    assert result.content == (
        "[killed] shell was killed: Kesoku shut down (agent.shutdown_grace_s = 0.5 s ran out); "
        "the turn resumes after the restart."
    )
    # left to resume, not interrupted
    assert messages(tmp_path, session)[0].status is Status.PROCESSING
    (tmp_path / "scenario.yaml").write_text(AFTER_RESTART)
    again = Daemon(tmp_path)
    try:
        again.wait_line(f"session {session} (test): ")
        assert again.stop() == 0
    finally:
        again.kill()
    history = messages(tmp_path, session)
    assert [m.content for m in history[3:]] == ["answered after the restart"]
    assert history[0].status is Status.DONE and history[0].id == root
    assert "recovering 1 open user message(s)" in "\n".join(again.lines)
