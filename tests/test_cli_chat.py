"""`kesoku chat`, run as the real CLI in a subprocess with the scripted model.

One-shot runs use pipes; the interactive mode runs on a pseudo-terminal (the standard ``pty``
module), typing keys and reading the screen as a person would.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import kesoku_terminal.view
import msgspec
import pyte
import pytest
import trio
import yaml
from kesoku_terminal.view import Follower, StoreLog
from runtime_harness import echo, serve_runtime
from test_interrupted_label import DONE

from kesoku.store import Store
from kesoku.testing import ScriptedLLM
from kesoku.vocab.events import EventHub, ModelDelta, TurnEnded
from kesoku.vocab.ir import TextDelta
from kesoku.vocab.metrics import TurnMetrics, TurnState
from kesoku.vocab.model import Kind, Message, Role, Status
from kesoku.vocab.schedule import new_schedule

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = Path(__file__).resolve().parent / "data" / "scenarios"
CLEARED = (
    "KESOKU_CONFIG",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
)


def setup(tmp_path: Path, scenario: str | Path, *, agent_llm: bool = True) -> Path:
    """A folder with a kesoku.toml replaying a scenario; the database lands beside it."""
    shutil.copy(
        SCENARIOS / scenario if isinstance(scenario, str) else scenario, tmp_path / "scenario.yaml"
    )
    llm = 'llm = "scripted"\n' if agent_llm else ""
    (tmp_path / "kesoku.toml").write_text(f'[agent]\n{llm}[scripted]\npath = "scenario.yaml"\n')
    return tmp_path / "kesoku.toml"


def environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return env | {"XDG_STATE_HOME": str(tmp_path / "state"), **extra}


def chat(
    tmp_path: Path, *args: str, stdin: str = "", timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kesoku", "chat", "-c", str(tmp_path / "kesoku.toml"), *args],
        cwd=tmp_path,
        env=environ(tmp_path),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def start_chat(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``kesoku chat`` run in the background, its stdout and stderr piped, for a test to signal."""
    return subprocess.Popen(
        [sys.executable, "-m", "kesoku", "chat", "-c", str(tmp_path / "kesoku.toml"), *args],
        cwd=tmp_path,
        env=environ(tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=as_at_a_terminal,
    )


def as_at_a_terminal() -> None:
    """In a child: take SIGINT as a terminal's foreground job does.

    A test run started in the background (CI) has SIGINT ignored, and children inherit that.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kesoku(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Any ``kesoku`` command with the folder's config (``-c`` last, after the command's own)."""
    return subprocess.run(
        [sys.executable, "-m", "kesoku", *args, "-c", str(tmp_path / "kesoku.toml")],
        cwd=tmp_path,
        env=environ(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_until(condition: Callable[[], bool], timeout_s: float = 30, what: str = "") -> None:
    """Poll ``condition`` until it holds; a hang guard, not a speed goal."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        select.select([], [], [], 0.005)  # a short wait without blocking anything but this test


def wait_for_turn(tmp_path: Path, timeout_s: float = 30) -> None:
    """Until a user message is ``processing`` (its turn began); a hang guard, not a speed goal."""

    def began() -> bool:
        if not (tmp_path / "kesoku.db").exists():
            return False
        store = Store(tmp_path / "kesoku.db")
        try:
            return any(
                m.role is Role.USER and m.status is Status.PROCESSING
                for s in store.list_sessions()
                for m in store.history(s.id)
            )
        finally:
            store.close()

    wait_until(began, timeout_s, "a turn to begin")


def history(tmp_path: Path) -> list[tuple[str, str, str, str]]:
    """(session, role, kind, content) of every stored message, oldest first."""
    store = Store(tmp_path / "kesoku.db")
    try:
        sessions = store.list_sessions()
        return [(s.id, m.role, m.kind, m.content) for s in sessions for m in store.history(s.id)]
    finally:
        store.close()


# -- the view, in process -------------------------------------------------------------------------


class Recorder:
    """A sink that writes down what it is asked to show (consecutive chunks joined)."""

    def __init__(self) -> None:
        self.shown: list[tuple[str, str]] = []

    def _add(self, what: str, text: str = "") -> None:
        if self.shown and what in ("answer", "thought") and self.shown[-1][0] == what:
            self.shown[-1] = (what, self.shown[-1][1] + text)
        else:
            self.shown.append((what, text))

    def answer(self, chunk: str) -> None:
        self._add("answer", chunk)

    def answer_end(self) -> None:
        self._add("answer_end")

    def thought(self, chunk: str) -> None:
        self._add("thought", chunk)

    def thought_end(self) -> None:
        self._add("thought_end")

    def tool_call(self, call: Message) -> None:
        self._add("tool_call", call.content)

    def tool_started(self, call: Message) -> None:
        self._add("tool_started", call.content)

    def tool_result(self, result: Message) -> None:
        self._add("tool_result", result.content)

    def system(self, text: str) -> None:
        self._add("system", text)

    def question(self, question: Message) -> None:
        self._add("question", question.content)

    def turn_started(self, root: Message) -> None:
        self._add("turn_started", root.content)

    def turn_ended(self, metrics: TurnMetrics) -> None:
        self._add("turn_ended", metrics.state)


async def test_a_view_that_lags_a_whole_turn_still_shows_each_step_once_in_order(
    tmp_path: Path,
) -> None:
    llm = ScriptedLLM(
        [
            {
                "thought": "plan",
                "text": ["Let me ", "look."],
                "tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}],
            },
            {"text": ["It ", "says ", "hi."]},
        ]
    )
    async with serve_runtime(tmp_path, llm, tools=[echo()]) as h:
        recorder = Recorder()
        follower = Follower(h.rt.hub, StoreLog(h.gateway.store), h.session.id, recorder)
        with h.rt.hub.subscribe() as events:
            await h.say("what does it say?")
            await h.turn_end()  # the turn is over before the view reads its first event
            async for event in events:
                follower.handle(event)
                if isinstance(event, TurnEnded):
                    break
        assert follower.ended_root_id == h.history()[0].id
    assert recorder.shown == [
        ("turn_started", "what does it say?"),
        ("thought", "plan"),
        ("answer", "Let me look."),
        ("thought_end", ""),
        ("answer_end", ""),
        ("tool_call", "echo(text='hi')"),
        ("tool_started", "echo(text='hi')"),
        ("tool_result", "hi"),
        ("answer", "It says hi."),
        ("answer_end", ""),
        ("turn_ended", TurnState.DONE),
    ]


class EmptyLog:
    """A log that holds nothing (the events alone are under test)."""

    def last_message_id(self) -> int:
        return 0

    def messages_after(self, after: int, session_id: str, limit: int) -> list[Message]:
        return []


async def test_a_view_a_whole_buffer_behind_still_sees_the_turn_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hub drops what a full subscriber cannot take, but never a turn's end: a one-shot that
    lost it would wait forever."""
    monkeypatch.setattr(kesoku_terminal.view, "EVENT_BUFFER", 4)
    hub = EventHub()
    recorder = Recorder()
    follower = Follower(hub, EmptyLog(), "s", recorder)
    end = msgspec.structs.replace(DONE, root_id=7)  # a turn of session "s"
    async with trio.open_nursery() as nursery:
        await nursery.start(follower.run)
        for n in range(10):  # in one step: the view cannot read in between
            hub.publish(ModelDelta("s", TextDelta(f"{n} ")))
        hub.publish(TurnEnded("s", end))
        with trio.fail_after(5):
            await follower.wait_ended(7)
        nursery.cancel_scope.cancel()
    assert follower.gaps == 1  # the deltas past the buffer were lost, and a gap said so
    assert recorder.shown == [
        ("answer", "0 "),  # read before the view saw the loss: the rest of the buffer goes
        ("answer_end", ""),
        ("turn_ended", TurnState.DONE),
    ]


# -- one-shot --------------------------------------------------------------------------------------


def test_one_shot_answer_on_stdout_activity_on_stderr(tmp_path: Path) -> None:
    setup(tmp_path, "answer.yaml")
    result = chat(tmp_path, "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "The capital of France is Paris.\n"
    rows = history(tmp_path)
    assert result.stderr.splitlines() == [
        "💭 The user asks about France.",
        "🛠 shell(command='echo hi')",
        "📥 shell · completed · hi (+1 line)",
        f"continue with: kesoku chat --session {rows[0][0]}",
    ]
    assert [(r[1], r[2]) for r in rows] == [
        (Role.USER, Kind.TEXT),
        (Role.ASSISTANT, Kind.THOUGHT),
        (Role.ASSISTANT, Kind.TOOL_CALL),
        (Role.TOOL, Kind.TOOL_RESULT),
        (Role.ASSISTANT, Kind.TEXT),
    ]
    assert rows[-1][3] == "The capital of France is Paris."


def test_a_failed_model_call_exits_1_with_one_line_and_how_to_go_on(tmp_path: Path) -> None:
    setup(tmp_path, "fail.yaml")
    result = chat(tmp_path, "hello")
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        "⚠ The model call failed: scripted: the model is down\n"
        f"continue with: kesoku chat --session {history(tmp_path)[0][0]}\n"
    )


def test_a_one_shot_says_how_to_go_on_and_that_command_goes_on(tmp_path: Path) -> None:
    # A turn stopped at the step limit says "Send a message to let it continue": the next line says
    # how, and the command it gives continues the same session.
    (tmp_path / "scenario.yaml").write_text(
        "loop: true\nsteps:\n  - tool_calls: [{name: shell, arguments: {command: echo again}}]\n"
    )
    (tmp_path / "kesoku.toml").write_text(
        '[agent]\nllm = "scripted"\nmax_steps_per_turn = 2\n[scripted]\npath = "scenario.yaml"\n'
    )
    first = chat(tmp_path, "go on and on")
    assert first.returncode == 1, first.stderr
    *_, notice, how = first.stderr.splitlines()
    assert notice.endswith("(agent.max_steps_per_turn = 2). Send a message to let it continue.")
    (session,) = {r[0] for r in history(tmp_path)}
    assert how == f"continue with: kesoku chat --session {session}"
    command = how.removeprefix("continue with: kesoku chat ").split()
    again = chat(tmp_path, *command, "carry on")
    assert again.returncode == 1, again.stderr
    assert again.stderr.splitlines()[-1] == how
    rows = history(tmp_path)
    assert {r[0] for r in rows} == {session}
    assert [r[3] for r in rows if r[1] == Role.USER] == ["go on and on", "carry on"]


def test_a_chat_leaves_no_lock_file_of_its_session(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    first = chat(tmp_path, "one")
    session = first.stderr.splitlines()[-1].removeprefix("continue with: kesoku chat --session ")
    assert chat(tmp_path, "--session", session, "two").returncode == 0
    assert [p.name for p in (tmp_path / "sessions" / ".locks").iterdir()] == ["sessions.lock"]


def test_piped_stdin_is_appended_to_the_prompt(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    result = chat(tmp_path, "summarize", stdin="line one\nline two\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "noted.\n"
    assert history(tmp_path)[0][3] == "summarize\n\nline one\nline two\n"
    alone = chat(tmp_path, stdin="just stdin\n")  # no PROMPT: stdin is the question
    assert alone.returncode == 0, alone.stderr
    assert [r[3] for r in history(tmp_path) if r[1] == Role.USER][-1] == "just stdin\n"


def test_binary_or_huge_stdin_is_refused_in_one_line(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    binary = chat(tmp_path, "summarize", stdin="text\0more")
    assert (binary.returncode, binary.stdout) == (2, "")
    assert binary.stderr == "kesoku: chat: stdin is binary (it holds NUL bytes); pipe text\n"
    huge = chat(tmp_path, "summarize", stdin="x" * (1024 * 1024 + 1))
    assert huge.returncode == 2
    assert "stdin is larger than 1024 KiB" in huge.stderr


def test_nothing_to_ask_and_unknown_session_are_one_line(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    empty = chat(tmp_path)
    assert (empty.returncode, empty.stdout) == (2, "")
    assert empty.stderr == "kesoku: chat: nothing to ask; give a PROMPT or pipe text on stdin\n"
    unknown = chat(tmp_path, "--session", "nope1234", "hi")
    assert unknown.returncode == 2
    assert (
        unknown.stderr
        == "kesoku: --session nope1234: no such session (/sessions in kesoku chat lists them)\n"
    )
    assert chat(tmp_path, "first").returncode == 0
    (sid, *_) = history(tmp_path)[0]
    # the start of a real id, but too short to try
    short = chat(tmp_path, "--session", sid[:1], "hi")
    assert (short.returncode, short.stdout) == (2, "")
    assert short.stderr == (
        f"kesoku: --session {sid[:1]}: no such session; give at least 4 characters of the id"
        " (/sessions in kesoku chat lists them)\n"
    )


def test_each_one_shot_is_a_new_session_unless_resumed(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    assert chat(tmp_path, "first").returncode == 0
    assert chat(tmp_path, "second").returncode == 0
    sessions = {r[0] for r in history(tmp_path)}
    assert len(sessions) == 2
    first = history(tmp_path)[0][0]
    resumed = chat(tmp_path, "--session", first[:6], "third")  # a unique prefix is enough
    assert resumed.returncode == 0, resumed.stderr
    assert [r[3] for r in history(tmp_path) if r[0] == first] == [
        "first",
        "noted.",
        "third",
        "noted.",
    ]
    # The model saw the earlier exchange: the second turn's log holds the whole history.
    store = Store(tmp_path / "kesoku.db")
    workspace = Path(next(s.workspace for s in store.list_sessions() if s.id == first))
    store.close()
    log = yaml.safe_load((workspace / "llm-turn-2.log.yaml").read_text())
    assert "first" in str(log) and "third" in str(log)


def test_llm_option_overrides_the_config(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml", agent_llm=False)
    result = chat(tmp_path, "--llm", "scripted", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "noted.\n"


def test_the_answer_is_printed_once_even_when_the_view_falls_behind(tmp_path: Path) -> None:
    # 6,000 chunks in one burst overflow the view's event buffer: the lost part comes from the log.
    words = [f"w{i} " for i in range(6000)]
    scenario = tmp_path / "burst.yaml"
    scenario.write_text(yaml.safe_dump({"steps": [{"text": [*words, "end."]}]}))
    setup(tmp_path, scenario)
    result = chat(tmp_path, "go")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(words) + "end.\n"


def test_ctrl_c_stops_a_one_shot_turn_with_130(tmp_path: Path) -> None:
    setup(tmp_path, "slow.yaml")
    proc = start_chat(tmp_path, "count")
    assert proc.stdout is not None
    # A pipe gets the answer once it is stored: wait for the model call to begin instead.
    wait_for_turn(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "six." not in out
    lines = err.splitlines()
    assert lines[0] == "stopping the turn (Ctrl-C again kills running tools)"
    assert lines[-2].startswith("🛑 turn 1 ·") and lines[-2].endswith("(Interrupted)")
    assert lines[-1] == f"continue with: kesoku chat --session {history(tmp_path)[0][0]}"


def test_what_ctrl_c_does_is_a_line_of_its_own_after_a_thought(tmp_path: Path) -> None:
    setup(tmp_path, "slow.yaml")
    (tmp_path / "scenario.yaml").write_text(
        "steps:\n  - events: [{thought: 'slow thinking'}, {sleep_s: 10}, {text: 'late.'}]\n"
    )
    proc = start_chat(tmp_path, "think")
    assert proc.stderr is not None
    wait_for_turn(tmp_path)
    assert proc.stderr.read(len("💭 slow thinking")) == "💭 slow thinking"  # streamed: left open
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err.startswith("\nstopping the turn (Ctrl-C again kills running tools)\n")


# -- interactive, on a pseudo-terminal -------------------------------------------------------------


class Terminal:
    """A child process on a pseudo-terminal, its screen kept by a terminal emulator (pyte).

    The prompt redraws only the cells that change, so the raw byte stream never holds a status line
    whole; the emulated screen shows what a person would see.
    """

    ROWS, COLUMNS = 100, 120  # tall enough that nothing scrolls away during a test

    def __init__(self, tmp_path: Path, *args: str) -> None:
        argv = [sys.executable, "-m", "kesoku", "chat", "-c", str(tmp_path / "kesoku.toml"), *args]
        # No cursor-position requests: nobody answers them here (a real terminal does).
        env = environ(tmp_path, TERM="xterm-256color", PROMPT_TOOLKIT_NO_CPR="1")
        pid, fd = pty.fork()
        if pid == 0:  # the child: the pty is its controlling terminal
            os.chdir(tmp_path)
            as_at_a_terminal()
            os.execve(argv[0], argv, env)
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", self.ROWS, self.COLUMNS, 0, 0))
        self.pid = pid
        self.fd = fd
        self._screen = pyte.Screen(self.COLUMNS, self.ROWS)
        self._stream = pyte.ByteStream(self._screen)

    @property
    def screen(self) -> str:
        return "\n".join(line.rstrip() for line in self._screen.display).rstrip()

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait_for(self, text: str, *, timeout_s: float = 20) -> int:
        """Wait until ``text`` is on the screen; return where it is in :attr:`screen`."""
        deadline = time.monotonic() + timeout_s
        while (found := self.screen.find(text)) < 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                raise AssertionError(f"{text!r} never appeared; the screen:\n{self.screen}")
        return found

    def wait_for_count(self, text: str, count: int, *, timeout_s: float = 20) -> None:
        """Wait until ``text`` is on the screen ``count`` times (a line shown again)."""
        deadline = time.monotonic() + timeout_s
        while self.screen.count(text) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                raise AssertionError(f"{text!r} not {count} times; the screen:\n{self.screen}")

    def wait_exit(self, timeout_s: float = 20) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            self._read(0.05)  # keep draining the screen: a full pty buffer would block the child
        raise AssertionError(f"the chat did not exit; the screen:\n{self.screen}")

    def kill(self) -> None:
        if self.pid:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self._stream.feed(data)
        return bool(data)


def test_interactive_streams_the_answer_and_exits_on_ctrl_d(tmp_path: Path) -> None:
    setup(tmp_path, "answer.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("What is the capital of France?\r")
        term.wait_for("🛠 shell(command='echo hi')")
        term.wait_for("📥 shell · completed · hi")
        term.wait_for("The capital of France is Paris.")
        term.wait_for("⚡ turn 1 · context 2K · 1 tool call · 3K tokens")
        # streamed, then never again
        assert term.screen.count("The capital of France is Paris.") == 1
        term.type("/compact\r")
        term.wait_for("🗜 nothing to compact (/compact)")
        term.type("\x04")  # Ctrl-D on an empty line
        assert term.wait_exit() == 0
    finally:
        term.kill()
    answers = [r for r in history(tmp_path) if r[1] == Role.ASSISTANT and r[2] == Kind.TEXT]
    assert [a[3] for a in answers] == ["The capital of France is Paris."]


def test_a_line_typed_during_a_turn_interrupts_it(tmp_path: Path) -> None:
    setup(tmp_path, "slow.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("count for me\r")
        term.wait_for("two")  # drawn in the live area above the prompt
        term.type("stop counting\r")
        term.wait_for("(Interrupted)")
        term.wait_for("one two three four five six.")
        term.wait_for("⚡ turn 2")
        assert term.screen.count("one two three four five six.") == 1
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    rows = history(tmp_path)
    assert [r[3] for r in rows if r[1] == Role.USER] == ["count for me", "stop counting"]
    partial, full = [r[3] for r in rows if r[1] == Role.ASSISTANT]
    assert "one two " in partial and not partial.endswith("six.")
    assert full == "one two three four five six."


def test_ctrl_c_stops_the_turn_then_exits_at_an_empty_prompt(tmp_path: Path) -> None:
    setup(tmp_path, "slow.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("count\r")
        term.wait_for("two")  # drawn in the live area above the prompt
        term.type("\x03")
        term.wait_for("stopping the turn (Ctrl-C again kills running tools)")
        term.wait_for("(Interrupted)")  # the design's label for a stopped turn too
        term.wait_for("›")
        term.type("\x03")  # idle, nothing typed: leave
        assert term.wait_exit() == 0
    finally:
        term.kill()
    partial = next(r[3] for r in history(tmp_path) if r[1] == Role.ASSISTANT)
    assert "two" in partial and "six." not in partial


def test_a_running_tool_shows_a_spinner_and_two_ctrl_c_kill_it(tmp_path: Path) -> None:
    setup(tmp_path, "tool.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("take your time\r")
        term.wait_for("🛠 shell(command='sleep 4; echo slept')")
        term.wait_for("running shell · 1 s")  # the spinner counts seconds
        term.type("\x03")
        term.wait_for("stopping the turn (Ctrl-C again kills running tools)")
        term.type("\x03")
        term.wait_for("killing running tools")
        term.wait_for("📥 shell · killed")
        term.wait_for("1 tool call · 0 tokens")  # the exact count below 1,000, not "0K"
        term.wait_for("(Interrupted)")
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    assert "The tool is done." not in [r[3] for r in history(tmp_path)]


def test_clear_asks_first_and_deletes_only_on_yes(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("keep this\r")
        term.wait_for("⚡ turn 1")
        (session,) = {r[0] for r in history(tmp_path)}
        question = f"delete session {session} (2 messages and its workspace "
        kept = f"nothing deleted; still in session {session}"
        # Enter alone, "no", a sentence and Ctrl-C all keep it (Ctrl-C does not leave the chat)
        for count, answer in enumerate(("\r", "no\r", "yes please, not\r", "\x03"), start=1):
            term.type("/clear\r")
            term.wait_for_count(question, count)
            term.wait_for_count("It cannot be undone [y/N]", count)
            term.type(answer)
            term.wait_for_count(kept, count)
            assert {r[0] for r in history(tmp_path)} == {session}
        assert [r[3] for r in history(tmp_path) if r[1] == Role.USER] == ["keep this"]
        term.type("/clear\r")
        term.wait_for_count(question, 5)
        term.type("y\r")
        term.wait_for(f"deleted session {session} (2 messages and its workspace); new session ")
        assert history(tmp_path) == []
        assert not (tmp_path / "sessions" / session).exists()
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()


def test_compact_during_a_turn_says_it_waits_for_the_turn(tmp_path: Path) -> None:
    setup(tmp_path, "slow.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("count\r")
        term.wait_for("two")
        term.type("/compact\r")
        said = term.wait_for("a turn is running: the history is compacted when it ends")
        ended = term.wait_for("⚡ turn 1")
        done = term.wait_for("🗜 nothing to compact (/compact)")
        assert said < ended < done  # it ran after the turn, as it said
        assert "compacting the history…" not in term.screen
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()


def test_a_chat_left_before_its_first_message_leaves_no_session(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("/new\r")  # from an empty session: it is dropped, not kept
        term.wait_for("(the previous one was empty: dropped)")
        term.type("/exit\r")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    store = Store(tmp_path / "kesoku.db")
    try:
        assert store.list_sessions() == []
    finally:
        store.close()
    assert [p.name for p in (tmp_path / "sessions").iterdir()] == [".locks"]  # no workspace left
    term = Terminal(tmp_path)  # a session with a message in it is kept, by /new and at exit
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("hello\r")
        term.wait_for("⚡ turn 1")
        term.type("/new\r")
        term.wait_for("the previous one is kept: kesoku chat --session ")
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    assert [r[3] for r in history(tmp_path)] == ["hello", "noted."]
    assert len({r[0] for r in history(tmp_path)}) == 1


# -- questions -------------------------------------------------------------------------------------


def test_a_one_shot_without_a_terminal_denies_questions(tmp_path: Path) -> None:
    setup(tmp_path, "write_outside.yaml")
    result = chat(tmp_path, "write outside")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Finished.\n"
    target = tmp_path / "outside.txt"
    lines = result.stderr.splitlines()
    assert (
        lines[1]
        == f"❓ write_file wants to write {target} ({target} is outside the workspace). Allow?"
    )
    assert lines[2] == "✘ Deny: denied by nobody (one-shot chat without a terminal)"
    assert lines[3].startswith("📥 write_file · failed · writing")
    assert not target.exists()


def test_interactive_asks_and_y_allows(tmp_path: Path) -> None:
    setup(tmp_path, "write_outside.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("write outside\r")
        term.wait_for("wants to write")
        term.wait_for("answer y (Allow) or n (Deny)")
        term.type("y\r")
        term.wait_for("✔ Allow: allowed by")
        term.wait_for("📥 write_file · completed")
        term.wait_for("Finished.")
        term.type("/context\r")
        term.wait_for("not tainted")
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    assert (tmp_path / "outside.txt").read_text() == "written with consent\n"
    # an answer, not a message
    assert "y" not in [r[3] for r in history(tmp_path) if r[1] == Role.USER]


def test_schedules_in_the_interactive_chat_lists_this_sessions_without_a_turn(
    tmp_path: Path,
) -> None:
    setup(tmp_path, "answer.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("/schedules\r")
        term.wait_for("No schedules in this conversation. Make one with: kesoku schedule add NAME")
        store = Store(tmp_path / "kesoku.db")
        try:
            (session,) = store.list_sessions(adapter="terminal")
            now = time.time()
            for name, target in (("standup", f"session:{session.id}"), ("elsewhere", "new")):
                store.put_schedule(
                    new_schedule(
                        name,
                        prompt=f"{name}: sum up",
                        cron="0 9 * * 1-5",
                        tz="Europe/Paris",
                        target=target,
                        now=now,
                    )
                )
        finally:
            store.close()
        term.type("/schedules\r")
        term.wait_for("standup: cron 0 9 * * 1-5 (Europe/Paris) · next ")
        term.wait_for('· "standup: sum up"')
        assert "elsewhere" not in term.screen
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    assert history(tmp_path) == [], "no turn: nothing stored, no model call"
    store = Store(tmp_path / "kesoku.db")
    try:
        assert [s.id for s in store.list_sessions()] == [session.id]  # schedules name it: kept
    finally:
        store.close()


def test_a_setup_error_leaves_no_database_behind(tmp_path: Path) -> None:
    (tmp_path / "kesoku.toml").write_text('[agent]\nllm = "claude"\n')
    result = chat(tmp_path, "hello")
    assert result.returncode == 2
    assert result.stderr.startswith("kesoku: claude.api_key: not set")
    assert not (tmp_path / "kesoku.db").exists()


def test_a_session_folder_that_cannot_be_made_is_one_line_and_leaves_no_session(
    tmp_path: Path,
) -> None:
    config = setup(tmp_path, "echo.yaml")
    assert chat(tmp_path, "first").returncode == 0
    # A parent that is a regular file stops mkdir even for root, where permission bits do not.
    (tmp_path / "blocker").write_text("")
    config.write_text(config.read_text() + '[workspace]\nsessions_dir = "blocker/sessions"\n')
    result = chat(tmp_path, "hi")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(
        f"kesoku: cannot create the session folder {tmp_path / 'blocker' / 'sessions'}/"
    )
    assert result.stderr.endswith(": Not a directory (workspace.sessions_dir)\n")
    assert len(result.stderr.splitlines()) == 1
    store = Store(tmp_path / "kesoku.db")
    try:
        assert len(store.list_sessions()) == 1  # only the first chat's: no empty "untitled" row
    finally:
        store.close()
    # The sessions folder is fine but its lock folder is a file: one line too, and no session left.
    config.write_text(config.read_text().replace('"blocker/sessions"', '"sessions"'))
    shutil.rmtree(tmp_path / "sessions" / ".locks")
    (tmp_path / "sessions" / ".locks").write_text("")
    for args in (("hi",), ("--session", history(tmp_path)[0][0], "hi")):
        locked = chat(tmp_path, *args)
        assert (locked.returncode, locked.stdout) == (2, "")
        assert locked.stderr.startswith("kesoku: cannot lock session ")
        assert (
            locked.stderr.endswith(" (workspace.sessions_dir)\n")
            and len(locked.stderr.splitlines()) == 1
        )
    assert len({r[0] for r in history(tmp_path)}) == 1


@pytest.mark.parametrize("command", [("chat", "hi"), ("start",)])
def test_a_database_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    config = setup(tmp_path, "echo.yaml")
    (tmp_path / "blocker").write_text("")  # a parent that is a file stops mkdir even for root
    config.write_text(config.read_text() + '[workspace]\ndb_path = "blocker/k.db"\n')
    result = kesoku(tmp_path, *command)
    assert (result.returncode, result.stdout) == (2, "")
    folder = tmp_path / "blocker"
    assert result.stderr == (
        f"kesoku: {folder / 'k.db'}: cannot make its folder {folder}: File exists "
        "(workspace.db_path)\n"
    )
