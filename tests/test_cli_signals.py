"""`kesoku chat` against other processes and signals: a session another process runs is refused, and
SIGTERM or SIGHUP (``timeout``, a closed terminal) stop the turn and kill its tools, in one-shot and
interactive mode alike, and a `kill -9` leaves no process of a running tool behind. Real CLI
processes with the scripted model."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sandboxing import CONFINED, marker, running
from test_cli_chat import (
    Terminal,
    as_at_a_terminal,
    chat,
    environ,
    history,
    setup,
    start_chat,
    wait_until,
)

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


NOT_ASKED = "kesoku: stopped before the question was stored; nothing was asked"
EARLY_DELAYS_S = (0.0, 0.03, 0.1, 0.3, 0.8)
"""When Ctrl-C comes after the chat made its session's folder: while the session is held, the
runtime starts, the question is stored, the turn runs (where each delay falls varies with the
machine's load; every one is a case the chat must handle)."""


def session_made(folder: Path) -> bool:
    """The chat has made a session's folder (it is in the database from then on)."""
    sessions = folder / "sessions"
    return sessions.is_dir() and any(p.name != ".locks" for p in sessions.iterdir())


def stored_sessions(folder: Path) -> dict[str, int]:
    """Each stored session and how many messages it holds (no database: none)."""
    if not (folder / "kesoku.db").exists():
        return {}
    store = Store(folder / "kesoku.db")
    try:
        return {s.id: len(store.history(s.id)) for s in store.list_sessions()}
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["one-shot", "interactive"])
def test_ctrl_c_while_a_chat_starts_exits_130_in_one_line_and_leaves_no_empty_session(
    tmp_path: Path, mode: str
) -> None:
    for delay_s in EARLY_DELAYS_S:
        folder = tmp_path / f"after-{delay_s}"
        folder.mkdir()
        setup(folder, "slow.yaml")
        if mode == "one-shot":
            proc = start_chat(folder, "count")
            try:
                wait_until(functools.partial(session_made, folder), what="a session")
                threading.Event().wait(delay_s)
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=30)
            finally:
                proc.kill()
            assert proc.returncode == 130, (delay_s, err)
            lines = err.splitlines()
            if lines[:1] == ["stopping the turn (Ctrl-C again kills running tools)"]:
                (session,) = stored_sessions(folder)  # stored in time: the turn was stopped
                assert lines[-1] == f"continue with: kesoku chat --session {session}", delay_s
            else:
                assert lines in ([], [NOT_ASKED]), (delay_s, err)
        else:
            term = Terminal(folder)
            try:
                wait_until(functools.partial(session_made, folder), what="a session")
                threading.Event().wait(delay_s)
                os.kill(term.pid, signal.SIGINT)
                assert term.wait_exit() == 130, (delay_s, term.screen)
            finally:
                term.kill()
            assert "Traceback" not in term.screen, term.screen
            assert "KeyboardInterrupt" not in term.screen, term.screen
        sessions = stored_sessions(folder)
        assert all(sessions.values()), (delay_s, sessions)  # no empty "untitled" session
        if mode == "interactive":
            assert sessions == {}, delay_s  # nothing was said


AT_MAIN = """
import os, sys

class Ready:  # tells the test once main() imports cyclopts: inside main()'s handlers from then on
    def find_spec(self, name, path=None, target=None):
        if name == "cyclopts":
            os.write({fd}, b".")
            sys.meta_path.remove(self)

sys.meta_path.insert(0, Ready())
from kesoku.cli import main
sys.argv[0] = "kesoku"
main()
"""
"""What the ``kesoku`` script runs, and a word to the test (Python's own start-up, before any of
Kesoku's code runs, is Python's to report)."""


def test_ctrl_c_as_soon_as_kesoku_runs_exits_130_without_a_traceback(tmp_path: Path) -> None:
    # While cyclopts loads and parses, the config loads, the database is made and migrated, the
    # runtime is built (where each delay falls varies with the machine's load).
    for delay_s in (0.0, 0.05, 0.1, 0.2, 0.4, 0.7):
        folder = tmp_path / f"after-{delay_s}"
        folder.mkdir()
        setup(folder, "slow.yaml")
        ready, ready_w = os.pipe()
        argv = ["chat", "-c", str(folder / "kesoku.toml"), "count"]
        proc = subprocess.Popen(
            [sys.executable, "-c", AT_MAIN.format(fd=ready_w), *argv],
            cwd=folder,
            env=environ(folder),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(ready_w,),
            preexec_fn=as_at_a_terminal,
        )
        os.close(ready_w)
        try:
            assert os.read(ready, 1) == b"."
            threading.Event().wait(delay_s)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            os.close(ready)
            proc.kill()
        assert proc.returncode == 130, (delay_s, err)
        lines = err.splitlines()
        if lines[:1] != ["stopping the turn (Ctrl-C again kills running tools)"]:
            assert lines in ([], [NOT_ASKED]), (delay_s, err)
        sessions = stored_sessions(folder)
        assert all(sessions.values()), (delay_s, sessions)  # no empty "untitled" session


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


LOST_SIGINT = """
import os, signal, weakref
from kesoku.host import interrupt

class Thing:
    pass

interrupt.install()
thing = Thing()
# A SIGINT whose KeyboardInterrupt is raised inside a weakref callback: Python reports it
# ("Exception ignored") and goes on, as when it lands in the import system's lock callbacks.
ref = weakref.ref(thing, lambda _: os.kill(os.getpid(), signal.SIGINT) or sum(range(1000)))
del thing
print(interrupt.restore(), signal.getsignal(signal.SIGINT) is signal.default_int_handler)
"""


def test_a_ctrl_c_python_could_not_raise_is_not_lost() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOST_SIGINT],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=as_at_a_terminal,
        check=True,
    )
    assert "KeyboardInterrupt" in done.stderr  # Python reported it, and did not raise it
    assert done.stdout == "True True\n"
