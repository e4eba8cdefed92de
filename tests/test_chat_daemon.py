"""`kesoku chat` through a running daemon: the real `kesoku start` and CLI, in subprocesses.

Each one-shot here is also answered by a chat in its own process (``--local``), and the two must
show the same thing: the daemon changes where the turn runs, not what the user sees.
"""

from __future__ import annotations

import functools
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import test_cli_chat
import test_cli_signals
import test_mcp_cli
import test_usage
import yaml
from kesoku_terminal.plain import NOT_ASKED
from test_cli_chat import (
    Terminal,
    chat,
    environ,
    history,
    setup,
    start_chat,
    wait_for_turn,
    wait_until,
)
from test_startup_imports import probe

from kesoku.host.control import (
    FrameError,
    FrameReader,
    encode,
    short_address,
    socket_path,
)
from kesoku.host.control_server import REFUSED_CONFINED, descends_from
from kesoku.host.doctor import daemon_finding
from kesoku.store import Store
from kesoku.vocab.model import Message, Role, Status, user_text

BY_DAEMON = "kesoku: answered by the daemon (pid {pid}) at {socket}"


class Daemon:
    """``kesoku start`` in the background, for the folder's kesoku.toml.

    Args:
        folder: Where its kesoku.toml is.
        max_files: Its limit of open descriptors (RLIMIT_NOFILE), if not the inherited one.
    """

    def __init__(self, folder: Path, max_files: int | None = None) -> None:
        self.folder = folder
        self.log = folder / "daemon.log"
        self.offset = self.log.stat().st_size if self.log.exists() else 0  # an earlier daemon's
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kesoku", "start", "-c", str(folder / "kesoku.toml")],
                cwd=folder,
                env=environ(folder),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                preexec_fn=None if max_files is None else functools.partial(limit_files, max_files),
            )
        self.socket = socket_path(folder / "kesoku.db")
        self.config = b""
        wait_until(self.ready, what="the daemon to be ready")

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        return b"ready:" in self.log.read_bytes()[self.offset :]

    def by(self) -> str:
        return BY_DAEMON.format(pid=self.proc.pid, socket=self.socket)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def limit_files(count: int) -> None:
    """In a child: at most ``count`` open descriptors."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


@pytest.fixture
def daemon_for() -> Iterator[type[Daemon]]:
    started: list[Daemon] = []

    class Tracked(Daemon):
        def __init__(self, folder: Path, max_files: int | None = None) -> None:
            super().__init__(folder, max_files)
            started.append(self)

    yield Tracked
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(timeout=30)


def user_messages(folder: Path) -> list[Message]:
    store = Store(folder / "kesoku.db")
    try:
        return [
            m for s in store.list_sessions() for m in store.history(s.id) if m.role is Role.USER
        ]
    finally:
        store.close()


def without_ids(text: str) -> str:
    """Output with session ids and durations blanked, to compare two runs."""
    import re

    text = re.sub(r"--session [0-9a-f]{16}", "--session ID", text)
    return re.sub(r"\d+\.\d s", "T s", text)


@pytest.mark.parametrize(
    "scenario", ["answer.yaml", "fail.yaml", "write_outside.yaml"], ids=["tool", "fail", "question"]
)
def test_the_daemon_answers_a_one_shot_as_a_chat_of_its_own_does(
    tmp_path: Path, daemon_for: type[Daemon], scenario: str
) -> None:
    setup(tmp_path, scenario)
    here = chat(tmp_path, "--local", "the question")
    daemon = daemon_for(tmp_path)
    there = chat(tmp_path, "-v", "the question")
    by, *err = there.stderr.splitlines(keepends=True)
    assert by == daemon.by() + "\n"
    assert there.returncode == here.returncode, there.stderr
    assert there.stdout == here.stdout
    assert without_ids("".join(err)) == without_ids(here.stderr)
    sessions = {row[0] for row in history(tmp_path)}
    assert len(sessions) == 2  # each one-shot its own session
    if scenario == "write_outside.yaml":  # denied: nobody at a terminal
        assert "denied by nobody (one-shot chat without a terminal)" in there.stderr
        assert not (tmp_path / "outside.txt").exists()


def test_a_session_goes_on_through_the_daemon_and_then_in_a_chat_of_its_own(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon_for(tmp_path)
    first = chat(tmp_path, "-v", "one")
    assert first.returncode == 0, first.stderr
    session = first.stderr.splitlines()[-1].removeprefix("continue with: kesoku chat --session ")
    again = chat(tmp_path, "-v", "--session", session[:8], "two")
    assert again.returncode == 0, again.stderr
    assert again.stderr.startswith("kesoku: answered by the daemon")
    # The daemon let the session go when the chat left: a chat of its own can hold it now.
    mine = chat(tmp_path, "-v", "--local", "--session", session, "three")
    assert mine.returncode == 0, mine.stderr
    assert mine.stderr.startswith("kesoku: running in this process (--local)")
    rows = history(tmp_path)
    assert {r[0] for r in rows} == {session}
    assert [r[3] for r in rows] == ["one", "noted.", "two", "noted.", "three", "noted."]


def test_without_a_daemon_or_with_a_dead_ones_socket_the_chat_runs_here(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    alone = chat(tmp_path, "-v", "hi")
    assert alone.returncode == 0, alone.stderr
    assert alone.stderr.startswith(
        "kesoku: running in this process (no daemon serves the database); config "
        f"{tmp_path / 'kesoku.toml'}, database {tmp_path / 'kesoku.db'}\n"
    )
    daemon = daemon_for(tmp_path)
    daemon.proc.kill()  # no clean-up: its socket stays behind
    daemon.proc.wait(timeout=30)
    assert daemon.socket.is_socket()
    left = chat(tmp_path, "-v", "hi")
    assert left.returncode == 0, left.stderr
    assert "(no daemon serves the database)" in left.stderr
    # A new daemon takes the place of the dead one's socket.
    second = daemon_for(tmp_path)
    served = chat(tmp_path, "-v", "hi")
    assert served.stderr.startswith(second.by())
    assert (daemon.socket.stat().st_mode & 0o777) == 0o600
    second.stop()
    assert not second.socket.exists()  # removed at a clean stop


@pytest.mark.parametrize(
    ("signum", "code"),
    [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_stops_the_daemons_turn_with_the_chats_exit_code(
    tmp_path: Path, daemon_for: type[Daemon], signum: int, code: int
) -> None:
    setup(tmp_path, "slow.yaml")
    daemon_for(tmp_path)
    proc = start_chat(tmp_path, "count")
    wait_for_turn(tmp_path)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err
    assert "six." not in out
    lines = err.splitlines()
    assert lines[-2].startswith("🛑 turn 1 ·") and lines[-2].endswith("(Interrupted)")
    (root,) = user_messages(tmp_path)
    assert lines[-1] == f"continue with: kesoku chat --session {root.session_id}"
    assert root.status is Status.INTERRUPTED  # a stopped turn's root


def test_a_daemon_stopping_mid_turn_ends_the_chat_with_1_and_says_so(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "slow.yaml")
    daemon = daemon_for(tmp_path)
    proc = start_chat(tmp_path, "count")
    wait_for_turn(tmp_path)
    daemon.stop()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    session = history(tmp_path)[0][0]
    assert err.splitlines()[-1] == (
        "kesoku: the daemon stopped before the turn ended; the turn is cut; "
        f"continue with: kesoku chat --session {session}"
    )


def test_a_session_one_chat_is_attached_to_is_refused_to_another(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "slow.yaml")
    daemon_for(tmp_path)
    proc = start_chat(tmp_path, "count")
    try:
        wait_for_turn(tmp_path)
        session = history(tmp_path)[0][0]
        second = chat(tmp_path, "--session", session, "me too")
        assert second.returncode == 2
        assert second.stderr == (
            f"kesoku: --session {session[:8]}: another kesoku chat is running this session\n"
        )
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert "me too" not in [r[3] for r in history(tmp_path)]


def test_garbage_on_the_socket_leaves_the_daemon_serving(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon = daemon_for(tmp_path)
    for junk in (b"\xff" * 64, b"\x00\x00\x00\x05nope!", b"\x7f\xff\xff\xff" + b"x" * 100, b""):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(daemon.socket))
            sock.sendall(junk)
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(30)
            assert sock.recv(100) == b""  # the daemon hangs up
    # A client that sends a question but never attached is hung up on too.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket))
        sock.sendall(encode(user_text("s", "hi")))  # type: ignore[arg-type]
        sock.settimeout(30)
        assert sock.recv(100) == b""
    served = chat(tmp_path, "-v", "still there?")
    assert served.returncode == 0, served.stderr
    assert served.stderr.startswith(daemon.by())
    assert daemon.proc.poll() is None


def test_a_database_path_longer_than_a_socket_address_still_finds_the_daemon(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    setup(deep, "echo.yaml")
    assert len(str(socket_path(deep / "kesoku.db"))) > 107
    daemon = daemon_for(deep)
    served = chat(deep, "-v", "hi")
    assert served.returncode == 0, served.stderr
    assert served.stderr.startswith(daemon.by())


def test_frames_over_the_limit_or_unknown_are_refused() -> None:
    reader = FrameReader(to_client=False)
    with pytest.raises(FrameError, match="a frame of 2,147,483,647 bytes"):
        list(reader.feed(b"\x7f\xff\xff\xff"))
    with pytest.raises(FrameError, match="an unreadable frame"):
        list(FrameReader(to_client=True).feed(b"\x00\x00\x00\x01\xc1"))


def test_a_short_address_names_the_same_file(tmp_path: Path) -> None:
    folder = tmp_path / ("x" * 120)
    folder.mkdir()
    path = folder / "kesoku.db.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        with short_address(path) as address:
            assert len(address) <= 107
            server.bind(address)
        server.listen(1)
        assert path.is_socket()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            with short_address(path) as address:
                client.connect(address)
            conn, _ = server.accept()
            conn.close()
    assert os.path.exists(path)


@pytest.mark.parametrize("options", [True, False], ids=["options", "prompt-only"])
def test_a_chat_the_daemon_answers_loads_no_runtime_store_sdk_or_trio(
    tmp_path: Path, daemon_for: type[Daemon], options: bool
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon_for(tmp_path)
    report = tmp_path / "modules.json"
    # `kesoku chat "question"` alone (./kesoku.toml) is run without cyclopts, as parsed by it
    args = ["chat", "-v", "-c", str(tmp_path / "kesoku.toml"), "hi"] if options else ["chat", "hi"]
    result = subprocess.run(
        probe(args, report),
        cwd=tmp_path,
        env=environ(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if options:
        assert result.stderr.startswith("kesoku: answered by the daemon"), result.stderr
    assert (result.returncode, result.stdout) == (0, "noted.\n"), result.stderr
    modules = set(json.loads(report.read_text()))
    heavy = ("trio", "apsw", "kesoku.store", "kesoku.agent", "kesoku.llm", "anthropic", "yaml")
    assert sorted(m for m in modules if m.split(".")[0] in heavy or m.startswith(heavy)) == []
    assert ("cyclopts" in modules) is options


def test_llm_for_a_new_session_is_built_by_the_daemon_or_refused_as_here(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon = daemon_for(tmp_path)
    here = chat(tmp_path, "--local", "--llm", "claude", "hi")  # no ANTHROPIC_API_KEY anywhere
    there = chat(tmp_path, "--llm", "claude", "hi")
    assert (there.returncode, there.stderr) == (here.returncode, here.stderr) == (2, here.stderr)
    assert "ANTHROPIC_API_KEY" in there.stderr
    assert history(tmp_path) == []  # no session left by either
    served = chat(tmp_path, "-v", "--llm", "scripted", "hi")
    assert served.returncode == 0, served.stderr
    assert served.stderr.startswith(daemon.by())
    assert served.stdout == "noted.\n"


def test_a_one_shot_at_a_terminal_asks_and_y_allows_through_the_daemon(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "write_outside.yaml")
    daemon = daemon_for(tmp_path)
    term = Terminal(tmp_path, "-v", "write outside")
    try:
        term.wait_for(f"kesoku: answered by the daemon (pid {daemon.proc.pid})")
        term.wait_for("wants to write")
        term.wait_for("Allow? [y/N]")
        term.type("y\r")
        term.wait_for("✔ Allow: allowed by")
        term.wait_for("Finished.")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    assert (tmp_path / "outside.txt").read_text() == "written with consent\n"


def test_a_process_the_daemon_started_is_refused_on_its_socket(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    # With no sandbox the socket is in reach of a tool: the daemon refuses its own descendants (a
    # tool attached as a user could answer its own session's questions).
    inner = f"{sys.executable} -m kesoku chat -c {tmp_path / 'kesoku.toml'} inner"
    scenario = tmp_path / "nested.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "steps": [
                    {"tool_calls": [{"name": "shell", "arguments": {"command": inner}}]},
                    {"text": "done."},
                ]
            }
        )
    )
    setup(tmp_path, scenario)
    with (tmp_path / "kesoku.toml").open("a") as toml:
        toml.write('[sandbox]\nmode = "off"\n')
    daemon_for(tmp_path)
    outer = chat(tmp_path, "-v", "outer")
    assert outer.returncode == 0, outer.stderr
    assert outer.stdout == "done.\n"
    assert "(Kesoku's daemon started" not in outer.stderr  # the one line is the tool's result
    (result,) = [r for r in history(tmp_path) if r[1] == Role.TOOL]
    assert REFUSED_CONFINED in result[3]
    assert "inner" not in [r[3] for r in history(tmp_path)]
    assert descends_from(os.getpid(), os.getpid())
    assert not descends_from(os.getppid(), os.getpid())
    assert descends_from(2**22 + 12345, os.getpid())  # no such process: not cleared, refused


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv is not installed")
def test_a_process_under_no_new_privs_is_refused_as_a_landlocked_tool_would_be(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon_for(tmp_path)
    args = ["chat", "-c", str(tmp_path / "kesoku.toml"), "hi"]
    confined = subprocess.run(
        ["setpriv", "--no-new-privs", sys.executable, "-m", "kesoku", *args],
        cwd=tmp_path,
        env=environ(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (confined.returncode, confined.stderr) == (2, f"kesoku: {REFUSED_CONFINED}\n")
    assert history(tmp_path) == []


def test_a_file_where_the_socket_goes_is_kept_and_the_daemon_runs_without_one(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    (tmp_path / "kesoku.db.sock").write_text("precious")
    daemon = daemon_for(tmp_path)
    assert (tmp_path / "kesoku.db.sock").read_text() == "precious"
    assert "exists and is not a socket: move it away" in daemon.log.read_text()
    alone = chat(tmp_path, "-v", "hi")
    assert alone.returncode == 0, alone.stderr
    assert "(no daemon serves the database)" in alone.stderr


def test_a_second_daemon_takes_the_socket_over_once_the_first_is_gone(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    db = tmp_path / "kesoku.db"
    first = daemon_for(tmp_path)
    others = [daemon_for(tmp_path), daemon_for(tmp_path)]  # they share daemon.log
    assert (
        first.log.read_text().count("this daemon answers no kesoku chat until that one stops") == 2
    )
    assert chat(tmp_path, "-v", "hi").stderr.startswith(first.by())
    ready = [ln for ln in first.log.read_text().splitlines() if " ready: " in ln]
    assert [ln.endswith(", and serves kesoku chat") for ln in ready] == [True, False, False]

    def server() -> Daemon | None:
        pids = {d.proc.pid: d for d in others}
        return next((d for pid, d in pids.items() if f"pid {pid} serves" in served(db)), None)

    first.stop()  # it removes its socket
    wait_until(lambda: server() is not None, what="a waiting daemon to take the socket over")
    serving = server()
    assert serving is not None
    assert chat(tmp_path, "-v", "hi").stderr.startswith(serving.by())
    serving.proc.kill()  # its socket stays behind
    serving.proc.wait(timeout=30)
    [last] = [d for d in others if d is not serving]
    wait_until(lambda: server() is last, what="the last daemon to take the socket over")
    done = chat(tmp_path, "-v", "hi")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(last.by())
    assert first.log.read_text().count("this one answers kesoku chat now") == 2


def served(db: Path) -> str:
    return "\n".join(daemon_finding(db).lines())


# -- interactive, through the daemon ---------------------------------------------------------------

INTERACTIVE = [
    test_cli_chat.test_interactive_streams_the_answer_and_exits_on_ctrl_d,
    test_cli_chat.test_a_line_typed_during_a_turn_interrupts_it,
    test_cli_chat.test_ctrl_c_stops_the_turn_then_exits_at_an_empty_prompt,
    test_cli_chat.test_a_running_tool_shows_a_spinner_and_two_ctrl_c_kill_it,
    test_cli_chat.test_clear_asks_first_and_deletes_only_on_yes,
    test_cli_chat.test_compact_during_a_turn_says_it_waits_for_the_turn,
    test_cli_chat.test_a_chat_left_before_its_first_message_leaves_no_session,
    test_cli_chat.test_interactive_asks_and_y_allows,
    test_cli_chat.test_schedules_in_the_interactive_chat_lists_this_sessions_without_a_turn,
    test_usage.test_usage_and_context_in_the_interactive_chat,
    test_mcp_cli.test_a_prompt_becomes_the_message_of_an_interactive_chat,
    test_cli_signals.test_sigterm_or_a_closed_terminal_stops_the_turn_and_kills_its_tool,
]


@pytest.mark.parametrize("test", INTERACTIVE, ids=lambda test: test.__name__.removeprefix("test_"))
def test_an_interactive_chat_through_the_daemon_behaves_as_one_of_its_own(
    tmp_path: Path,
    daemon_for: type[Daemon],
    monkeypatch: pytest.MonkeyPatch,
    test: Callable[[Path], None],
) -> None:
    """The interactive tests of a chat in its own process, each chat answered by a daemon."""
    daemons: list[Daemon] = []
    terminals: list[tuple[Terminal, Daemon]] = []

    def written(folder: Path) -> bytes:
        """When the test last wrote its config and scenario (a scenario is played once)."""
        return b"".join(
            str((folder / name).stat().st_mtime_ns).encode()
            for name in ("kesoku.toml", "scenario.yaml")
        )

    class Served(Terminal):
        """A chat started once a daemon serves the folder with the test's config and scenario."""

        def __init__(self, folder: Path, *args: str) -> None:
            if not daemons or daemons[-1].config != written(folder):  # the test wrote anew
                if daemons:
                    daemons[-1].stop()
                daemons.append(daemon_for(folder))
                daemons[-1].config = written(folder)
            super().__init__(folder, "-v", *args)
            terminals.append((self, daemons[-1]))

    for module in (test_cli_chat, test_usage, test_mcp_cli, test_cli_signals):
        monkeypatch.setattr(module, "Terminal", Served)
    test(tmp_path)
    assert terminals
    for term, daemon in terminals:
        # the daemon answered, not a runtime of its own (the line wraps at the 120th column)
        assert daemon.by() in term.screen.replace("\n", "")


def test_an_interactive_chat_whose_daemon_stops_ends_with_1_and_says_how_to_go_on(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "slow.yaml")
    daemon = daemon_for(tmp_path)
    term = Terminal(tmp_path)
    try:
        term.wait_for("›")
        term.type("count\r")
        term.wait_for("two")
        daemon.stop()
        assert term.wait_exit() == 1
        session = history(tmp_path)[0][0]
        term.wait_for(
            "kesoku: the daemon stopped; the turn is cut; "
            f"continue with: kesoku chat --session {session}"
        )
    finally:
        term.kill()


def test_a_session_left_by_an_interactive_chat_is_free_at_once(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon_for(tmp_path)
    term = Terminal(tmp_path)
    try:
        term.wait_for("›")
        term.type("one\r")
        term.wait_for("⚡ turn 1")
        term.type("/new\r")  # the daemon lets the first session go, and holds the new one
        term.wait_for("the previous one is kept: kesoku chat --session ")
        (first,) = {r[0] for r in history(tmp_path)}
        here = chat(tmp_path, "--local", "--session", first, "two")
        assert here.returncode == 0, here.stderr
        term.type("three\r")
        term.wait_for("⚡ turn 1", timeout_s=20)
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    (second,) = {r[0] for r in history(tmp_path)} - {first}
    # The chat exits once the daemon has let its session go: a chat of its own may take it now.
    again = chat(tmp_path, "--local", "--session", second, "four")
    assert again.returncode == 0, again.stderr
    rows = history(tmp_path)
    assert [r[3] for r in rows if r[0] == first] == ["one", "noted.", "two", "noted."]
    assert [r[3] for r in rows if r[0] == second] == ["three", "noted.", "four", "noted."]


def test_doctor_says_which_daemon_serves_the_database(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    db = tmp_path / "kesoku.db"
    assert daemon_finding(db).lines() == [
        "--    daemon: none serves kesoku.db: kesoku chat runs its own runtime"
    ]
    daemon = daemon_for(tmp_path)
    served = daemon_finding(db)
    assert served.lines() == [
        f"ok    daemon: pid {daemon.proc.pid} serves kesoku.db at {daemon.socket}: "
        "kesoku chat goes through it"
    ]
    assert chat(tmp_path, "-v", "hi").stderr.startswith(daemon.by())  # doctor disturbed nothing
    daemon.proc.kill()  # its socket stays behind
    daemon.proc.wait(timeout=30)
    assert daemon_finding(db).lines() == [
        f"--    daemon: none answers at {daemon.socket} (left by a daemon that stopped): kesoku "
        "chat runs its own runtime",
        "      → the next kesoku start replaces it",
    ]


def test_a_one_shot_returns_once_the_daemon_has_let_its_session_go(
    tmp_path: Path,
    daemon_for: type[Daemon],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    from kesoku_terminal.remote import ask_daemon

    from kesoku.config.settings import load_config
    from kesoku.store.locks import SessionLocks

    setup(tmp_path, "echo.yaml")
    daemon_for(tmp_path)
    config = load_config(tmp_path / "kesoku.toml")
    devnull = open(os.devnull)  # noqa: SIM115 (closed when the test ends)
    request.addfinalizer(devnull.close)
    monkeypatch.setattr(sys, "stdin", devnull)  # ask_daemon reads its file descriptor
    assert ask_daemon(config, "one", session_id=None, llm_name=None) == 0
    (session,) = {row[0] for row in history(tmp_path)}
    locks = SessionLocks(tmp_path / "sessions" / ".locks")
    try:
        for n in range(5):
            assert ask_daemon(config, f"again {n}", session_id=session, llm_name=None) == 0
            assert locks.acquire(session)  # at once: the daemon holds it no more
            locks.release(session)
    finally:
        locks.close()
    assert capsys.readouterr().out == "noted.\n" * 6


def test_a_one_shot_whose_terminal_stalls_behind_a_long_stream_still_ends(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    """A reader that does not keep up (stderr piped, not read for a while): the chat blocks, the
    socket fills, the daemon's relay falls a whole buffer behind and events are lost. The turn's
    end is not: the chat ends when it catches up."""
    setup(tmp_path, "echo.yaml")
    thoughts = [{"thought": f"thinking, step {n:05d} " + "." * 60} for n in range(12_000)]
    (tmp_path / "scenario.yaml").write_text(
        yaml.safe_dump({"steps": [{"events": [*thoughts, {"text": "Done."}]}]})
    )
    daemon_for(tmp_path)
    proc = start_chat(tmp_path, "think hard")
    try:
        wait_for_turn(tmp_path)
        threading.Event().wait(3)  # nobody reads the chat's stderr: everything behind it backs up
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # a chat that waits for the lost end forever
        proc.wait()
    assert (proc.returncode, out) == (0, "Done.\n"), err[-2000:]
    assert err.splitlines()[-1].startswith("continue with: kesoku chat --session ")
    # Shown once each, in order: what streamed before the loss, then the rest from the log.
    steps = re.findall(r"thinking, step (\d{5})", err)
    assert steps == [f"{n:05d}" for n in range(12_000)]


def test_a_daemon_out_of_descriptors_keeps_serving_once_they_are_back(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "echo.yaml")
    daemon = daemon_for(tmp_path, max_files=160)
    idle: list[socket.socket] = []
    try:
        for _ in range(200):  # more than it can hold: accept() runs out of descriptors
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(daemon.socket))
            idle.append(sock)
        threading.Event().wait(1)
        assert daemon.proc.poll() is None, daemon.log.read_text()
    finally:
        for sock in idle:
            sock.close()
    served = chat(tmp_path, "-v", "hi")
    assert served.stderr.startswith(daemon.by()), served.stderr
    assert "cannot accept a client now: [Errno 24]" in daemon.log.read_text()


def test_an_unreadable_answer_on_the_socket_is_one_line(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_path(tmp_path / "kesoku.db")))
    server.listen(1)

    def answer_garbage() -> None:
        client, _ = server.accept()
        with client:
            client.recv(65536)
            client.sendall(b"\0\0\0\5hello")  # a frame, but not one of the protocol's

    thread = threading.Thread(target=answer_garbage)
    thread.start()
    try:
        result = chat(tmp_path, "hi")
    finally:
        thread.join(timeout=30)
        server.close()
    assert result.returncode == 2
    assert result.stderr.startswith("kesoku: chat: the daemon's answer cannot be read (")
    assert result.stderr.endswith("); restart it, or add --local\n")
    assert len(result.stderr.splitlines()) == 1


def test_a_chat_whose_daemon_does_not_answer_can_still_be_left(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "slow.yaml")
    daemon = daemon_for(tmp_path)
    daemon.proc.send_signal(signal.SIGSTOP)  # it accepts connections, and answers nothing
    before = start_chat(tmp_path, "count")
    try:
        threading.Event().wait(1)
        before.send_signal(signal.SIGINT)  # while attaching: nothing was asked
        _, err = before.communicate(timeout=30)
        assert (before.returncode, err) == (130, NOT_ASKED + "\n")
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
        before.kill()
    during = start_chat(tmp_path, "count")
    try:
        wait_for_turn(tmp_path)
        daemon.proc.send_signal(signal.SIGSTOP)
        for _ in range(3):  # stop, kill its tools, then leave: nothing answers the first two
            threading.Event().wait(0.5)
            during.send_signal(signal.SIGINT)
        _, err = during.communicate(timeout=30)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
        during.kill()
    session = history(tmp_path)[0][0]
    assert during.returncode == 130, err
    assert err.splitlines()[-1] == (
        "kesoku: the daemon did not end the turn; left it (it may go on there); "
        f"continue with: kesoku chat --session {session}"
    )


def test_a_turn_a_daemon_restart_cut_is_taken_up_when_a_chat_attaches(
    tmp_path: Path, daemon_for: type[Daemon]
) -> None:
    setup(tmp_path, "slow.yaml")
    first = daemon_for(tmp_path)
    proc = start_chat(tmp_path, "count")
    wait_for_turn(tmp_path)
    first.proc.kill()  # the turn is cut: its root stays processing
    first.proc.wait(timeout=30)
    proc.communicate(timeout=30)
    (cut,) = user_messages(tmp_path)
    assert cut.status is Status.PROCESSING
    second = daemon_for(tmp_path)  # it leaves terminal sessions to their chats at its start
    again = chat(tmp_path, "-v", "--session", cut.session_id, "and again")
    assert again.stderr.startswith(second.by()), again.stderr
    assert again.returncode == 0, again.stderr
    statuses = {m.content: m.status for m in user_messages(tmp_path)}
    # Taken up when the chat attached, then interrupted by its message, as a chat of its own does.
    assert statuses == {"count": Status.INTERRUPTED, "and again": Status.DONE}
