"""`kesoku chat` against other processes and signals: a session another process runs is refused, and
SIGTERM or SIGHUP (``timeout``, a closed terminal) stop the turn and kill its tools, in one-shot and
interactive mode alike, and a `kill -9` leaves no process of a running tool behind. Real CLI
processes with the scripted model."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from sandboxing import CONFINED, marker, running
from test_cli_chat import Terminal, chat, history, setup, start_chat

from kesoku.store import Store
from kesoku.vocab.model import Kind, Role, Status


def test_a_session_another_process_is_running_is_refused_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    setup(tmp_path, "tool.yaml")  # a shell call that runs 4 s, then an answer
    first = start_chat(tmp_path, "run it")
    try:
        assert first.stderr is not None
        assert first.stderr.readline().startswith("🛠 shell(")  # the tool is running (4 s)
        session = history(tmp_path)[0][0]
        second = chat(tmp_path, "--session", session[:8], "me too")
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"kesoku: --session {session[:8]}: another Kesoku process (pid {first.pid}) is running "
            "this session; try again when it is done, or start a new session"
        ]
        out, _ = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0
    assert out == "The tool is done.\n"
    rows = [r for r in history(tmp_path) if r[0] == session]
    assert "me too" not in [r[3] for r in rows]  # refused before it was posted
    results = [r[3] for r in rows if r[2] == Kind.TOOL_RESULT]
    assert len(results) == 1 and "slept" in results[0]  # the running call was not marked lost
    again = chat(tmp_path, "--session", session[:8], "now")  # free once the first process is done
    assert again.returncode == 0, again.stderr


def test_sigterm_stops_a_one_shot_turn_and_kills_its_tool(tmp_path: Path) -> None:
    setup(tmp_path, "tool.yaml")  # a shell call that runs 4 s
    marker = tmp_path / "marker"
    scenario = (
        (tmp_path / "scenario.yaml").read_text().replace("echo slept", f"echo slept > {marker}")
    )
    (tmp_path / "scenario.yaml").write_text(scenario)
    proc = start_chat(tmp_path, "run it")
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("🛠 shell(")  # the tool is running
    proc.send_signal(signal.SIGTERM)  # what `timeout` and service managers send
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopping the turn and killing its tools" in err
    rows = history(tmp_path)
    results = [r[3] for r in rows if r[2] == Kind.TOOL_RESULT]
    assert len(results) == 1 and "killed" in results[0]
    store = Store(tmp_path / "kesoku.db")
    try:
        statuses = {m.status for m in store.history(rows[0][0]) if m.role is Role.USER}
    finally:
        store.close()
    assert Status.PROCESSING not in statuses  # not left half-run for a later start to resume
    # past the tool's 4 s: a surviving shell would have written the marker
    threading.Event().wait(5)
    assert not marker.exists()


def test_sigterm_or_a_closed_terminal_stops_the_turn_and_kills_its_tool(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    for signum in (signal.SIGTERM, signal.SIGHUP):
        setup(tmp_path, "tool.yaml")
        scenario = (
            (tmp_path / "scenario.yaml")
            .read_text()
            .replace("echo slept", f"echo slept >> {marker}")
        )
        (tmp_path / "scenario.yaml").write_text(scenario)
        term = Terminal(tmp_path)
        try:
            term.wait_for("›")
            term.type(f"take your time {signum.name}\r")
            term.wait_for("running shell · 1 s")
            os.kill(term.pid, signum)
            assert term.wait_exit() == 128 + signum
        finally:
            term.kill()
    rows = history(tmp_path)
    results = [r[3] for r in rows if r[2] == Kind.TOOL_RESULT]
    assert len(results) == 2 and all("killed" in r for r in results)
    store = Store(tmp_path / "kesoku.db")
    try:
        statuses = {
            m.status
            for s in store.list_sessions()
            for m in store.history(s.id)
            if m.role is Role.USER
        }
    finally:
        store.close()
    assert Status.PROCESSING not in statuses  # not left half-run for a later start to resume
    # past the tools' 4 s: a surviving shell would have written the marker
    threading.Event().wait(5)
    assert not marker.exists()


@pytest.mark.parametrize("mode", CONFINED)
def test_kill_9_of_a_chat_leaves_no_process_of_its_tool(tmp_path: Path, mode: str) -> None:
    # SIGKILL cannot be caught: the sandbox itself must take the tool's processes down with the chat
    # (bubblewrap's --die-with-parent and pid namespace; the Landlock launcher's parent-death
    # signal).
    mark = marker()
    (tmp_path / "scenario.yaml").write_text(
        "steps:\n"
        "  - tool_calls: [{name: shell, arguments: "
        f"{{command: \"sh -c 'sleep {mark} & sleep {mark}'\"}}}}]\n"
        "  - text: done\n"
    )
    (tmp_path / "kesoku.toml").write_text(
        '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n'
        f'[sandbox]\nmode = "{mode}"\n'
    )
    proc = start_chat(tmp_path, "run it")
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("🛠 shell(")
        deadline = time.monotonic() + 10
        while len(running(mark, exact=True)) < 2 and time.monotonic() < deadline:
            threading.Event().wait(0.02)
        # the sleep in the background and the one in front
        assert len(running(mark, exact=True)) >= 2
        proc.kill()
        proc.communicate(timeout=10)
        deadline = time.monotonic() + 5
        while running(mark) and time.monotonic() < deadline:
            threading.Event().wait(0.02)
        assert running(mark) == []
    finally:
        proc.kill()
        proc.communicate(timeout=10)
        for pid in running(mark):  # never leave one behind for the next test, whatever failed
            os.kill(pid, signal.SIGKILL)
