"""The trajectory page's content: `kesoku trace` on real sessions, turns and steps from the store
and the turn logs, how each turn ended, compaction markers, icons that need no emoji font, escaping,
and the size of a long session."""

from __future__ import annotations

import html
import re
import subprocess
from contextlib import closing
from pathlib import Path

import pytest
from test_cli_chat import SCENARIOS, Terminal, chat, kesoku, setup

from kesoku.observe.trace import render_trace
from kesoku.observe.turnlog import TurnLogEntry, write_turn_log
from kesoku.store import Store
from kesoku.vocab.ir import LLMRequest, LLMResponse, LLMTurn, TextBlock
from kesoku.vocab.model import Kind, Message, Metadata, Outcome, Role, Status, Usage
from kesoku.vocab.view import Archive, ViewState


def trace(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return kesoku(tmp_path, "trace", *args)


def session_ids(tmp_path: Path) -> list[str]:
    store = Store(tmp_path / "kesoku.db")
    try:
        return [s.id for s in store.list_sessions()]
    finally:
        store.close()


def turns_in(page: str) -> list[str]:
    return re.findall(r'<section class="turn" id="turn-(\d+)">', page)


def badges(page: str) -> list[tuple[str, str]]:
    """(state, label) of each turn's badge, in page order."""
    found = re.findall(r'<h2>.*?<span class="badge (\w+)"[^>]*>(.*?)</span>', page)
    return [(state, html.unescape(re.sub(r"<[^>]*>", "", label)).strip()) for state, label in found]


def icon(name: str) -> str:
    """The markup of one of the page's icons."""
    return f'<svg class="ic" aria-hidden="true"><use href="#i-{name}"/></svg>'


# Where the codepoints that render as emoji live in the BMP (Unicode's emoji-data.txt, Emoji=Yes,
# less the digits, # and *, and the (C), (R) and TM signs every text font has).
EMOJI_BMP = (
    (0x203C, 0x203C),
    (0x2049, 0x2049),
    (0x2139, 0x2139),
    (0x2194, 0x2199),
    (0x21A9, 0x21AA),
    (0x2300, 0x23FF),
    (0x24C2, 0x24C2),
    (0x25A0, 0x25FF),
    (0x2600, 0x27BF),
    (0x2934, 0x2935),
    (0x2B00, 0x2BFF),
    (0x3030, 0x3030),
    (0x303D, 0x303D),
    (0x3297, 0x3299),
    (0xFE0F, 0xFE0F),  # emoji presentation selector
)


def emoji(text: str) -> list[str]:
    """The characters of ``text`` that need an emoji font: outside the BMP, or emoji within it."""
    return [
        c
        for c in text
        if ord(c) > 0xFFFF or any(lo <= ord(c) <= hi for lo, hi in EMOJI_BMP) or c == "\u200d"
    ]


def test_the_emoji_check_finds_emoji() -> None:
    assert emoji("⚡ done · 🛑 stopped → 📥 ⚙\ufe0f – … ©") == ["⚡", "🛑", "📥", "⚙", "\ufe0f"]


def without_stored_text(page: str) -> str:
    """The page less the stored text it shows in ``<pre>`` (a user's emoji is theirs to send)."""
    return re.sub(r"<pre[^>]*>.*?</pre>", "", page, flags=re.DOTALL)


REPEATING = "model: loop-demo\nsteps:\n" + 4 * (
    '  - tool_calls: [{name: shell, arguments: {command: "echo same"}}]\n'
)
"""A model that makes the same call again after it was told the call repeats."""

ENDINGS: dict[str, tuple[Path | str, str, str]] = {
    "done": (SCENARIOS / "answer.yaml", "", ""),
    "step_limit": (SCENARIOS / "answer.yaml", "max_steps_per_turn = 1\n", ""),
    "repeating": (REPEATING, "", ""),
    "failed": (SCENARIOS / "fail.yaml", "", ""),
    "budget": (SCENARIOS / "answer.yaml", "", "[budget]\nsession_tokens = 1\n"),
}
"""How to end a turn each way: (the scenario, lines added to [agent], sections added)."""


def session_ending(tmp_path: Path, *endings: str) -> str:
    """One session whose turns end as ``endings`` say, through the real ``kesoku chat``; its id.

    A spend cap ends every later turn too: ``budget`` can only be last.
    """
    sid = ""
    for ending in endings:
        scenario, agent, sections = ENDINGS[ending]
        text = scenario.read_text() if isinstance(scenario, Path) else scenario
        (tmp_path / "scenario.yaml").write_text(text)
        (tmp_path / "kesoku.toml").write_text(
            f'[agent]\nllm = "scripted"\n{agent}[scripted]\npath = "scenario.yaml"\n{sections}'
        )
        ended = chat(tmp_path, *(("--session", sid) if sid else ()), f"end {ending}")
        assert ended.returncode == (0 if ending == "done" else 1), ended.stderr
        sid = sid or session_ids(tmp_path)[0]
    return sid


def test_the_cli_traces_a_session_or_one_of_its_turns(tmp_path: Path) -> None:
    setup(tmp_path, "answer.yaml")
    assert chat(tmp_path, "What is the capital?").returncode == 0
    (sid,) = session_ids(tmp_path)
    assert chat(tmp_path, "--session", sid, "Sure?").returncode == 0  # the scenario's steps again
    whole = trace(tmp_path, sid[:6], "-o", "-")
    assert whole.returncode == 0, whole.stderr
    page = whole.stdout
    assert turns_in(page) == ["1", "2"]
    assert page.count('<div class="step">') == 4
    assert "scripted/capital-demo · model" in page and "llm-turn-1.log.yaml" in page
    # one call's usage, from its log
    assert "in 900 (cached 0) · out 20 (thinking 0) tokens" in page
    assert icon("thought") + " thought" in page
    assert "&quot;command&quot;: &quot;echo hi&quot;" in page
    assert icon("result") + " shell · completed" in page
    assert badges(page) == [("done", "done"), ("done", "done")]
    assert not emoji(page)
    assert 'src="http' not in page and 'href="http' not in page  # nothing to fetch
    last = trace(tmp_path, sid[:6], "--turn", "-1")
    assert last.returncode == 0, last.stderr
    written = tmp_path / f"kesoku-trace-{sid}-turn--1.html"
    assert last.stdout == f"wrote {written.name} ({len(written.read_bytes()) // 1024:,} KiB)\n"
    assert turns_in(written.read_text()) == ["2"]
    missing = trace(tmp_path, sid, "--turn", "3")
    assert missing.returncode == 2
    assert missing.stderr == f"kesoku: trace {sid}: no turn 3 (the session has 2 turns)\n"


def test_a_trace_says_when_the_first_turn_logs_were_deleted(tmp_path: Path) -> None:
    setup(tmp_path, "answer.yaml")
    assert chat(tmp_path, "What is the capital?").returncode == 0
    (sid,) = session_ids(tmp_path)
    with closing(Store(tmp_path / "kesoku.db")) as store:
        assert "deleted" not in render_trace(store, sid)
        workspace = Path(next(s.workspace for s in store.list_sessions()))
        (workspace / "llm-turn-1.log.yaml").unlink()  # as the [turn_logs] cap does, oldest first
        assert "turn logs 1–1 deleted ([turn_logs] max_mb_per_session)" in render_trace(store, sid)


def test_an_output_in_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    setup(tmp_path, "echo.yaml")
    assert chat(tmp_path, "hi").returncode == 0
    (sid,) = session_ids(tmp_path)
    target = tmp_path / "nonexistent" / "x.html"
    result = trace(tmp_path, sid, "-o", str(target))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"kesoku: cannot write {target}: No such file or directory (--output)\n"
    # `kesoku sessions export -o` writes through the same function.
    exported = kesoku(tmp_path, "sessions", "export", sid, "-o", str(target))
    assert (exported.returncode, exported.stderr) == (2, result.stderr)
    assert not target.parent.exists()


def test_an_output_over_the_config_or_the_database_is_refused(tmp_path: Path) -> None:
    config = setup(tmp_path, "echo.yaml")
    assert chat(tmp_path, "hi").returncode == 0
    (sid,) = session_ids(tmp_path)
    before = config.read_bytes(), (tmp_path / "kesoku.db").stat().st_size
    configuration = "holds Kesoku's configuration and credentials (--output)"
    result = trace(tmp_path, sid, "-o", "kesoku.toml")
    assert (result.returncode, result.stdout) == (2, "")
    own = "kesoku: cannot write {0}: Kesoku's own file {0} " + configuration + "\n"
    assert result.stderr == own.format("kesoku.toml")
    exported = kesoku(tmp_path, "sessions", "export", sid, "-o", "kesoku.db-wal")
    assert (exported.returncode, exported.stderr) == (2, own.format("kesoku.db-wal"))
    long = trace(tmp_path, sid, "-o", "x" * 300 + ".html")
    assert long.returncode == 2
    assert long.stderr.endswith(": a name in it is too long (305 bytes; at most 255) (--output)\n")
    assert (config.read_bytes(), (tmp_path / "kesoku.db").stat().st_size) == before


def test_an_interrupted_turn_is_marked_from_a_real_chat(tmp_path: Path) -> None:
    setup(tmp_path, "slow.yaml")
    term = Terminal(tmp_path)
    try:
        term.wait_for("Ctrl-D to exit")
        term.wait_for("›")
        term.type("count for me\r")
        term.wait_for("two")
        term.type("stop counting\r")
        term.wait_for("⚡ turn 2")
        term.type("\x04")
        assert term.wait_exit() == 0
    finally:
        term.kill()
    (sid,) = session_ids(tmp_path)
    page = trace(tmp_path, sid, "-o", "-").stdout
    first, second = page.split('<section class="turn" id="turn-2">')
    # the turn and its partial text
    assert badges(page) == [("interrupted", "interrupted"), ("done", "done")]
    assert f'<span class="badge interrupted">{icon("interrupted")} interrupted</span>' in first
    assert "count for me" in first and "stop counting" in second


def test_each_turn_is_badged_with_how_it_ended(tmp_path: Path) -> None:
    endings = ("done", "step_limit", "repeating", "failed", "budget")
    sid = session_ending(tmp_path, *endings)
    result = trace(tmp_path, sid, "-o", "-")
    assert result.returncode == 0, result.stderr
    page = result.stdout
    assert badges(page) == [
        ("done", "done"),
        ("step_limit", "step limit"),
        ("repeating", "repeating"),
        ("failed", "failed"),
        ("budget", "spend cap"),
    ]
    # each badge with its own icon, drawn in the page
    for state in endings:
        assert f'<span class="badge {state}"' in page
        assert f"{icon(state)} " in page and f'<symbol id="i-{state}" ' in page
    # The failed call's notice holds a "⚠" of its own: what the page adds needs no emoji font.
    assert not emoji(without_stored_text(page))
    # the notice that says why each turn ended is there too
    assert "(agent.max_steps_per_turn = 1)" in page and "Spend cap reached: " in page
    last = trace(tmp_path, sid, "--turn", "-1", "-o", "-").stdout
    assert badges(last) == [("budget", "spend cap")]


def message(
    sid: str,
    role: Role,
    kind: Kind,
    content: str,
    ts: float,
    root: int = 0,
    *,
    sender: str = "",
    **kw: object,
) -> Message:
    sender = sender or {Role.USER: "ann", Role.TOOL: "shell", Role.SYSTEM: "System"}.get(
        role, "Kesoku"
    )
    return Message(
        session_id=sid,
        role=role,
        kind=kind,
        sender=sender,
        content=content,
        ts=ts,
        root_id=root,
        **kw,  # type: ignore[arg-type]
    )


def test_stopped_turns_steps_from_logs_and_compaction_markers(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    try:
        s = store.create_session(
            "terminal", "t", workspace_root=tmp_path / "sessions", title="demo"
        )
        (root,) = store.insert_messages(
            [message(s.id, Role.USER, Kind.TEXT, "run it", 1000.0, status=Status.DONE)]
        )
        r = root.message.id
        call_meta = Metadata(tool_name="shell", tool_arguments={"command": "sleep 9"})
        (call,) = store.insert_messages(
            [
                message(
                    s.id, Role.ASSISTANT, Kind.TOOL_CALL, "shell(…)", 1001.0, r, metadata=call_meta
                )
            ]
        )
        killed = Metadata(tool_name="shell", outcome=Outcome.KILLED)
        store.insert_messages(
            [
                message(
                    s.id,
                    Role.TOOL,
                    Kind.TOOL_RESULT,
                    "[killed]",
                    1004.5,
                    r,
                    parent_id=call.message.id,
                    metadata=killed,
                )
            ]
        )
        (stopped,) = store.insert_messages(
            [message(s.id, Role.USER, Kind.TEXT, "again", 2000.0, status=Status.INTERRUPTED)]
        )
        archive = Archive(first_turn=1, last_turn=1, text="Turn 1: intent=run it")
        view = ViewState(
            archives=(archive,),
            stages=(1, 2),
            reason="/compact",
            tokens_before=9000,
            tokens_after=900,
        )
        store.add_view_state(s.id, view.encode())
        request = LLMRequest(
            system="sys", turns=(LLMTurn("user", (TextBlock("run it"),)),), tools=()
        )
        for started, error in ((1000.5, None), (2000.5, "overloaded (529)")):
            response = (
                LLMResponse(usage=Usage(input_tokens=700, output_tokens=9))
                if error is None
                else None
            )
            write_turn_log(
                TurnLogEntry(
                    folder=s.workspace,
                    session_id=s.id,
                    provider="scripted",
                    model="m",
                    started_at=started,
                    duration_s=0.4,
                    request=request,
                    response=response,
                    error=error,
                )
            )
        page = render_trace(store, s.id)
        assert turns_in(page) == ["1", "2"]
        one, two = page.split('id="turn-2"')
        assert (
            "step 1 · scripted/m · model 0.40 s · tools 3.50 s · "
            "in 700 (cached 0) · out 9 (thinking 0) tokens" in one
        )
        assert (
            f'<details class="result killed" open><summary>{icon("result")} shell · killed · '
            "3.50 s · 1 lines" in one
        )
        assert badges(page) == [("done", "done"), ("stopped", "stopped")]
        assert f"{icon('warn')} the call failed: overloaded (529)" in two
        # The view state was written now, after both turns: its marker closes the page.
        assert f"{icon('compaction')} compaction · view state 1" in two
        assert not emoji(page)
        assert "/compact · stages 1,2 · ~9,000 → ~900 tokens · turns 1–1 archived" in two
        only_first = render_trace(store, s.id, turn=1)
        assert turns_in(only_first) == ["1"] and '<div class="marker">' not in only_first
        with pytest.raises(LookupError, match="no turn 0"):
            render_trace(store, s.id, turn=0)
        assert stopped.message.status is Status.INTERRUPTED
    finally:
        store.close()


PAYLOADS = (
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "</pre></details><script>x()</script>",
)


def test_every_stored_value_is_escaped(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    try:
        evil = " ".join(PAYLOADS)
        s = store.create_session("discord", evil, workspace_root=tmp_path / "sessions", title=evil)
        (root,) = store.insert_messages(
            [message(s.id, Role.USER, Kind.TEXT, evil, 1.0, sender=evil)]
        )
        r = root.message.id
        meta = Metadata(tool_name=evil, tool_arguments={evil: evil})
        (call,) = store.insert_messages(
            [message(s.id, Role.ASSISTANT, Kind.TOOL_CALL, evil, 2.0, r, metadata=meta)]
        )
        store.insert_messages(
            [
                message(s.id, Role.ASSISTANT, Kind.THOUGHT, evil, 2.0, r),
                message(
                    s.id,
                    Role.TOOL,
                    Kind.TOOL_RESULT,
                    "\n".join([evil] * 40),
                    3.0,
                    r,
                    parent_id=call.message.id,
                    metadata=meta,
                ),
                message(s.id, Role.SYSTEM, Kind.TEXT, evil, 4.0, r),
                message(s.id, Role.ASSISTANT, Kind.TEXT, evil, 5.0, r, status=Status.INTERRUPTED),
            ]
        )
        store.add_view_state(s.id, ('{"' + evil.replace('"', "'") + '": 1}').encode())
        page = render_trace(store, s.id)
    finally:
        store.close()
    # the page's own script; no element from data
    assert page.count("<script") == 1 and "<img" not in page
    # the attribute-breaking quote too
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in page
    assert page.count("</pre>") == page.count("<pre")  # no content closed an element early
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not emoji(page)


def test_a_twenty_turn_session_page_stays_small(tmp_path: Path) -> None:
    store = Store(tmp_path / "kesoku.db")
    try:
        s = store.create_session(
            "terminal", "t", workspace_root=tmp_path / "sessions", title="long"
        )
        output = "\n".join(f"line {i}: " + "x" * 60 for i in range(50))  # a 3.5 KB tool result
        for turn in range(20):
            t0 = 100.0 * turn
            (root,) = store.insert_messages(
                [message(s.id, Role.USER, Kind.TEXT, f"question {turn}", t0)]
            )
            r = root.message.id
            usage = Metadata(usage=Usage(input_tokens=1000 * turn, output_tokens=80))
            meta = Metadata(tool_name="shell", tool_arguments={"command": "ls -l"})
            _, call = store.insert_messages(
                [
                    message(
                        s.id,
                        Role.ASSISTANT,
                        Kind.THOUGHT,
                        "thinking " * 40,
                        t0 + 1,
                        r,
                        metadata=usage,
                    ),
                    message(
                        s.id,
                        Role.ASSISTANT,
                        Kind.TOOL_CALL,
                        "shell(command='ls -l')",
                        t0 + 1,
                        r,
                        metadata=meta,
                    ),
                ]
            )
            store.insert_messages(
                [
                    message(
                        s.id,
                        Role.TOOL,
                        Kind.TOOL_RESULT,
                        output,
                        t0 + 2,
                        r,
                        parent_id=call.message.id,
                        metadata=meta,
                    ),
                    message(
                        s.id,
                        Role.ASSISTANT,
                        Kind.TEXT,
                        "The answer. " * 20,
                        t0 + 3,
                        r,
                        metadata=usage,
                    ),
                ]
            )
        page = render_trace(store, s.id)
    finally:
        store.close()
    assert turns_in(page) == [str(n) for n in range(1, 21)]
    assert page.count('<div class="step">') == 40  # no turn logs: one step per post of model output
    size = len(page.encode())
    print(f"20-turn page: {size:,} bytes")
    # about the content itself plus a few hundred bytes of markup per step
    assert size < 20 * 6_000 + 10_000
