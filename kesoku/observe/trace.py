"""The trajectory page: one self-contained, dark, interactive HTML file per session or turn.

:func:`render_trace` reads the session's messages from the store and the model calls from its turn
logs (``sessions/<id>/llm-turn-{idx}.log.yaml``, :mod:`kesoku.observe.turnlog`) and lays them out
turn by turn: the user's messages, each model call as a step (model, duration, token usage) with its
thoughts (collapsed), text, tool calls with their arguments and results (long output cut, with an
expand control), system notices, interrupted and stopped marks, and the compaction view states as
markers.

Safety: nothing from the model, a tool or a user can run script in the page. Every such value goes
through :func:`html.escape` (``_e``) and only into element text or quoted attribute values, never
into ``<script>``, ``<style>`` or a URL; and the page's Content-Security-Policy allows no network at
all and only the page's own script (by its SHA-256), so even a missed escape could not run an
injected ``<script>`` or ``onerror=``. Expanding and collapsing are native ``<details>`` elements,
so the page works with scripts off; the script only adds "expand all" / "collapse all".

Icons are inline SVG symbols drawn in the page itself (:data:`_ICONS`), not emoji: they need no
emoji font (where none is installed an emoji shows as an empty box) and fetch nothing.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
from collections.abc import Sequence
from html import escape as _e
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import yaml

from kesoku.observe.retention import LOG_NAME
from kesoku.vocab.metrics import TurnState
from kesoku.vocab.model import Kind, Message, Outcome, Role, Status, Usage
from kesoku.vocab.view import ViewState

if TYPE_CHECKING:
    from kesoku.store import Store
    from kesoku.store.store import ViewStateRecord

PREVIEW_LINES = 12
"""Lines of a tool result shown before its expand control."""
PREVIEW_CHARS = 1500
"""Characters of a tool result shown before its expand control (for output with very long lines)."""
_LOG_HEAD_BYTES = 4096
"""A turn log's ``metadata`` section is in its first few hundred bytes; this much is read for it."""
_LOG_TAIL_BYTES = 65536
"""Bytes read from a turn log's end to find its ``response`` section before reading it all."""

try:  # libyaml's parser, as for writing
    from yaml import CSafeLoader as _Loader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]


class CallLog(msgspec.Struct, kw_only=True):
    """One model call, from its turn log.

    Attributes:
        path: The log file.
        idx: Its index in the session folder.
        started_at: UNIX seconds.
        duration_s: How long the call took.
        model: ``provider/model``.
        error: Why the call failed, when it did.
        usage: The provider's token counts; None when not read yet or not reported.
    """

    path: Path
    idx: int
    started_at: float
    duration_s: float
    model: str
    error: str | None = None
    usage: Usage | None = None


def read_call_logs(folder: str | os.PathLike[str]) -> list[CallLog]:
    """Read the ``metadata`` of every turn log in a session folder, oldest call first (blocking).

    Only each file's head is read; :func:`load_usage` reads the response of the calls shown. Files
    that are not turn logs, or cannot be parsed, are skipped: a trace shows what it can.
    """
    calls: list[CallLog] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        if not (m := LOG_NAME.fullmatch(name)):
            continue
        path = Path(folder, name)
        try:
            with path.open("rb") as f:
                head = f.read(_LOG_HEAD_BYTES).decode("utf-8", "replace")
            end = head.find("\nrequest:")
            meta = yaml.load(head if end < 0 else head[:end], Loader=_Loader)["metadata"]
            calls.append(
                CallLog(
                    path=path,
                    idx=int(m[1]),
                    started_at=float(meta["time"]),
                    duration_s=float(meta.get("duration_s") or 0.0),
                    model=f"{meta.get('provider', '?')}/{meta.get('model', '?')}",
                    error=meta.get("error"),
                )
            )
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
            continue
    return sorted(calls, key=lambda c: (c.started_at, c.idx))


def load_usage(call: CallLog) -> None:
    """Set ``call.usage`` from the log's ``response`` section, which ends the file (blocking)."""
    try:
        with call.path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
            start = text.rfind("\nresponse:")
            # a long answer: the section starts further back
            if start < 0 and size > _LOG_TAIL_BYTES:
                f.seek(0)
                text = f.read().decode("utf-8", "replace")
                start = text.rfind("\nresponse:")
        if start < 0:
            return
        response = yaml.load(text[start:], Loader=_Loader)["response"]
        if isinstance(response, dict) and isinstance(response.get("usage"), dict):
            call.usage = msgspec.convert(response["usage"], Usage)
    except (OSError, yaml.YAMLError, KeyError, TypeError, msgspec.ValidationError):
        return


# -- the trajectory -------------------------------------------------------------------------------


class Step(msgspec.Struct, kw_only=True):
    """One model call (when its log is known) and the messages it led to, up to the next call."""

    start: float
    call: CallLog | None = None
    messages: list[Message] = msgspec.field(default_factory=list)


class TurnTrace(msgspec.Struct, kw_only=True):
    """One turn: the user's message(s), then its steps.

    Attributes:
        number: 1-based, in session order.
        roots: The user messages the turn answered.
        notes: Messages before the first step (system notices).
        steps: Model calls with their output and tool results.
        state: How it ended, a :class:`~kesoku.vocab.metrics.TurnState` value, or :data:`RUNNING`.
        end: The last message's time.
    """

    number: int
    roots: list[Message]
    notes: list[Message] = msgspec.field(default_factory=list)
    steps: list[Step] = msgspec.field(default_factory=list)
    state: str = "done"
    end: float = 0.0

    @property
    def start(self) -> float:
        """When the first user message arrived."""
        return self.roots[0].ts


def build_turns(history: Sequence[Message], calls: Sequence[CallLog]) -> list[TurnTrace]:
    """Group a session's history into turns and steps; attach each model call to its turn by time.

    Args:
        history: The session's messages in logical order (:meth:`Store.history`).
        calls: Its model calls, oldest first (:func:`read_call_logs`).

    Returns:
        The turns, oldest first.
    """
    groups: list[list[Message]] = []
    index: dict[int, list[Message]] = {}
    for message in history:
        group = index.get(message.root_id)
        if group is None:
            group = index[message.root_id] = []
            groups.append(group)
        group.append(message)
    # User messages answered together by one turn stand alone in the log (the turn is rooted on the
    # newest): fold a group of user messages only into the group that follows.
    merged: list[list[Message]] = []
    pending: list[Message] = []
    for group in groups:
        if all(m.role is Role.USER for m in group) and group is not groups[-1]:
            pending += group
            continue
        merged.append(pending + group)
        pending = []
    turns = [TurnTrace(number=n, roots=[]) for n in range(1, len(merged) + 1)]
    for turn, group in zip(turns, merged, strict=True):
        turn.roots = [m for m in group if m.role is Role.USER] or group[:1]
        turn.end = max(m.ts for m in group)
    for i, turn in enumerate(turns):
        upper = turns[i + 1].start if i + 1 < len(turns) else float("inf")
        mine = [c for c in calls if turn.start <= c.started_at < upper]
        roots = {m.id for m in turn.roots}
        _fill_steps(turn, [m for m in merged[i] if m.id not in roots], mine)
        turn.state = _state(turn, turns[i + 1] if i + 1 < len(turns) else None, merged[i][-1])
    return turns


def _fill_steps(turn: TurnTrace, rest: list[Message], calls: list[CallLog]) -> None:
    if calls:
        turn.steps = [Step(start=c.started_at, call=c) for c in calls]
        for message in rest:
            owners = [s for s in turn.steps if s.start <= message.ts]
            (owners[-1].messages if owners else turn.notes).append(message)
        return
    # No turn logs (turned off, removed, or a fork): one step per post of model output.
    previous: Message | None = None
    for message in rest:
        opens = message.role is Role.ASSISTANT and not (
            previous is not None and previous.role is Role.ASSISTANT and previous.ts == message.ts
        )
        if opens:
            turn.steps.append(Step(start=message.ts))
        (turn.steps[-1].messages if turn.steps else turn.notes).append(message)
        previous = message


RUNNING = "running"
"""The state of a turn whose user messages are still pending or processing: running now, or cut by
a crash or a shutdown (it resumes at the next start)."""

# The store keeps no TurnState: a turn ended by a step limit, a repeating model or a spend cap
# leaves its roots `done` (kesoku.agent.turn._ROOT_STATUS) and says why in its last message, a
# system notice. These are the notices' fixed parts (kesoku.agent.turn, kesoku.observe.spend);
# tests/test_trace.py ends real turns each way, so a reworded notice fails there.
_NOTICE_STATES = (
    ("(agent.max_steps_per_turn = ", TurnState.STEP_LIMIT),
    ("(agent.max_identical_calls)", TurnState.REPEATING),
    ("Spend cap reached: ", TurnState.BUDGET),
)


def _state(turn: TurnTrace, following: TurnTrace | None, last: Message) -> str:
    statuses = {m.status for m in turn.roots}
    if statuses & {Status.PENDING, Status.PROCESSING}:
        return RUNNING
    if Status.FAILED in statuses:
        return TurnState.FAILED
    if Status.INTERRUPTED in statuses:
        # The store keeps one status for both; a user message that arrived before the turn's last
        # write is the sign of an interruption, otherwise someone stopped it.
        cut = following is not None and following.start < turn.end
        return TurnState.INTERRUPTED if cut else TurnState.STOPPED
    if last.role is Role.SYSTEM:
        for mark, state in _NOTICE_STATES:
            if mark in last.content:
                return state
    return TurnState.DONE


# -- the page -------------------------------------------------------------------------------------


def render_trace(store: Store, session_id: str, *, turn: int | None = None) -> str:
    """Render the trajectory of a session, or of one of its turns, as one HTML page.

    Blocking (it reads the turn logs): an adapter runs it in a worker thread, with a Store of that
    thread (a Store is not thread-safe).

    Args:
        store: The store holding the session.
        session_id: The session's whole id.
        turn: A turn number (1 is the first; -1 the last); None: every turn.

    Returns:
        The page: HTML with its CSS and script inline, no external resources.

    Raises:
        LookupError: No such session, or no such turn.
    """
    session = store.get_session(session_id)
    if session is None:
        raise LookupError(f"no session {session_id!r}")
    calls = read_call_logs(session.workspace)
    turns = build_turns(store.history(session_id), calls)
    shown = turns
    if turn is not None:
        if not turns or not (-len(turns) <= turn <= len(turns)) or turn == 0:
            raise LookupError(f"no turn {turn} (the session has {len(turns)} turns)")
        shown = [turns[turn - 1 if turn > 0 else turn]]
    for t in shown:
        for step in t.steps:
            if step.call is not None:
                load_usage(step.call)
    views = store.view_states(session_id)
    if turn is not None:  # only the markers that fall inside the turn shown
        upper = turns[shown[0].number].start if shown[0].number < len(turns) else float("inf")
        views = [v for v in views if shown[0].start <= v.created_at < upper]
    title = session.title or "untitled"
    scope = f"turn {shown[0].number} of {len(turns)}" if turn is not None else f"{len(turns)} turns"
    facts = [
        f"session {session.id}",
        f"{session.adapter} · {session.channel_id}",
        f"created {_when(session.created_at, full=True)}",
        scope,
        f"{sum(len(t.steps) for t in shown)} model calls",
        _tokens([s.call.usage for t in shown for s in t.steps if s.call and s.call.usage]),
    ]
    if session.parent_id:
        facts.append(f"forked from {session.parent_id}")
    first_log = min((c.idx for c in calls), default=1)
    if first_log > 1:  # indexes start at 1: the lower ones were deleted, by the cap or by hand
        facts.append(
            f"turn logs 1–{first_log - 1} deleted ([turn_logs] max_mb_per_session): "
            "their calls are not shown"
        )
    body: list[str] = []
    marks = sorted(views, key=lambda v: v.created_at)
    for t in shown:
        while marks and marks[0].created_at < t.start:
            body.append(_view_marker(marks.pop(0)))
        body.append(_turn_html(t))
    body.extend(_view_marker(v) for v in marks)
    if not shown:
        body.append('<p class="dim">No messages yet.</p>')
    return _PAGE.format(
        csp=_CSP,
        title=_e(f"{title} · Kesoku trace"),
        h1=_e(title),
        facts="".join(f"<span>{_e(f)}</span>" for f in facts if f),
        css=_CSS,
        body="\n".join(body),
        script=_SCRIPT,
        sprite=_SPRITE,
    )


# A turn's badge per state: (icon, label, what it means: the badge's tooltip).
_BADGES: dict[str, tuple[str, str, str]] = {
    TurnState.DONE: ("done", "done", "The model answered."),
    TurnState.STEP_LIMIT: (
        "step_limit",
        "step limit",
        "Ended at agent.max_steps_per_turn model calls.",
    ),
    TurnState.BUDGET: ("budget", "spend cap", "Ended by a spend cap ([budget])."),
    TurnState.REPEATING: (
        "repeating",
        "repeating",
        "Ended: the model repeated a call it was told repeats (agent.max_identical_calls).",
    ),
    TurnState.INTERRUPTED: ("interrupted", "interrupted", "Cut by a newer user message."),
    TurnState.STOPPED: ("stopped", "stopped", "Stopped by the user."),
    TurnState.FAILED: ("failed", "failed", "A model call or Kesoku failed; the notice says why."),
    RUNNING: ("running", "running…", "Not finished: running, or cut by a crash or a shutdown."),
}


def _turn_html(turn: TurnTrace) -> str:
    icon, label, meaning = _BADGES[turn.state]
    seconds = max(turn.end - turn.start, 0.0)
    usage = _tokens([s.call.usage for s in turn.steps if s.call and s.call.usage])
    tools = sum(1 for s in turn.steps for m in s.messages if m.kind is Kind.TOOL_CALL)
    head = (
        f'<h2><a href="#turn-{turn.number}">Turn {turn.number}</a>'
        f' <span class="badge {turn.state}" title="{_e(meaning)}">{_icon(icon)} {_e(label)}</span>'
        f' <span class="dim">{_e(_when(turn.start))} · {seconds:.1f} s'
        f" · {len(turn.steps)} model calls"
        f" · {tools} tool calls{' · ' + _e(usage) if usage else ''}</span></h2>"
    )
    parts = [
        head,
        *(_message_html(m, {}) for m in turn.roots),
        *(_message_html(m, {}) for m in turn.notes),
    ]
    for n, step in enumerate(turn.steps, 1):
        parts.append(_step_html(n, step))
    return f'<section class="turn" id="turn-{turn.number}">{"".join(parts)}</section>'


def _step_html(n: int, step: Step) -> str:
    calls = {m.id: m for m in step.messages if m.kind is Kind.TOOL_CALL}
    facts = [f"step {n}"]
    usage = step.call.usage if step.call else None
    if usage is None:  # no log: the usage stored on the step's first message
        usage = next((m.metadata.usage for m in step.messages if m.metadata.usage), None)
    if step.call is not None:
        facts.append(f"{step.call.model} · model {step.call.duration_s:.2f} s")
    results = [m for m in step.messages if m.kind is Kind.TOOL_RESULT and m.parent_id in calls]
    if results:
        tools_s = max(r.ts for r in results) - min(
            calls[r.parent_id].ts for r in results if r.parent_id
        )
        facts.append(f"tools {tools_s:.2f} s")
    if usage is not None:
        facts.append(_tokens([usage]))
    error = ""
    if step.call is not None and step.call.error:
        error = f'<div class="error">{_icon("warn")} the call failed: {_e(step.call.error)}</div>'
    if step.call is not None:
        facts.append(step.call.path.name)
    # Each result right under its call: a step's calls are posted together, then their results
    # together.
    answered = {r.parent_id: r for r in results}
    inner = []
    for m in step.messages:
        if m.kind is Kind.TOOL_RESULT and m.parent_id in calls:
            continue
        inner.append(_message_html(m, calls))
        if m.id in answered:
            inner.append(_result_html(answered[m.id], m))
    return (
        f'<div class="step"><div class="step-head">{_e(" · ".join(facts))}</div>'
        f"{error}{''.join(inner)}</div>"
    )


def _message_html(m: Message, calls: dict[int, Message]) -> str:
    time = f'<span class="dim">{_e(_when(m.ts))}</span>'
    cut = (
        f' <span class="badge interrupted">{_icon("interrupted")} interrupted</span>'
        if m.status is Status.INTERRUPTED
        else ""
    )
    if m.role is Role.USER:
        files = "".join(
            f'<div class="dim">{_icon("attach")} {_e(a.filename)} ({_e(a.mime_type)})</div>'
            for a in m.metadata.attachments
        )
        who = f"{_icon('user')} {_e(m.sender)}"
        return (
            f'<div class="msg user"><div class="who">{who} {time}{cut}</div>'
            f"<pre>{_e(m.content)}</pre>{files}</div>"
        )
    if m.role is Role.SYSTEM:
        return _box("system", f"{_icon('system')} System {time}", f"<pre>{_e(m.content)}</pre>")
    if m.kind is Kind.THOUGHT:
        first = " ".join(m.content.split())[:100]
        return (
            f'<details class="thought"><summary>{_icon("thought")} thought{cut}'
            f' <span class="dim">{_e(first)}</span></summary>'
            f"<pre>{_e(m.content)}</pre></details>"
        )
    if m.kind is Kind.TOOL_CALL:
        args = json.dumps(
            m.metadata.tool_arguments or {}, indent=2, ensure_ascii=False, default=str
        )
        name = m.metadata.tool_name or "?"
        who = f"{_icon('tool')} <b>{_e(name)}</b> {time}"
        return _box("call", who, f'<pre class="args">{_e(args)}</pre>')
    if m.kind is Kind.TOOL_RESULT:
        return _result_html(m, calls.get(m.parent_id or 0))
    who = f"{_icon('assistant')} {_e(m.sender)} {time}{cut}"
    return _box("assistant", who, f"<pre>{_e(m.content)}</pre>")


def _icon(name: str) -> str:
    """An icon of :data:`_ICONS`, drawn in the colour of the text around it."""
    return f'<svg class="ic" aria-hidden="true"><use href="#i-{name}"/></svg>'


def _box(kind: str, who: str, inner: str) -> str:
    """A message box; ``who`` and ``inner`` are HTML already escaped by the caller."""
    return f'<div class="msg {kind}"><div class="who">{who}</div>{inner}</div>'


def _result_html(m: Message, call: Message | None) -> str:
    outcome = m.metadata.outcome or Outcome.COMPLETED
    took = f" · {m.ts - call.ts:.2f} s" if call is not None else ""
    content = m.content
    cut = -1  # the end of the first PREVIEW_LINES lines, as a prefix of the content itself
    for _ in range(PREVIEW_LINES):
        cut = content.find("\n", cut + 1)
        if cut < 0:
            cut = len(content)
            break
    cut = min(cut, PREVIEW_CHARS)
    # the break between them shows as the control
    head, rest = content[:cut], content[cut:].removeprefix("\n")
    more = ""
    if rest.strip():
        more = (
            f'<details class="more"><summary>show the rest: {len(rest.splitlines()):,} more lines,'
            f' {len(rest):,} characters</summary><pre class="rest">{_e(rest)}</pre></details>'
        )
    lines = len(content.splitlines())
    summary = f"{m.metadata.tool_name or m.sender} · {outcome.value}{took} · {lines:,} lines"
    return (
        f'<details class="result {outcome.value}" open>'
        f"<summary>{_icon('result')} {_e(summary)}</summary>"
        f'<pre class="head">{_e(head)}</pre>{more}</details>'
    )


def _view_marker(record: ViewStateRecord) -> str:
    facts = [f"view state {record.id}", _when(record.created_at)]
    try:
        view = msgspec.json.decode(record.data, type=ViewState)
    # a newer Kesoku's view: say only that it exists
    except (msgspec.DecodeError, msgspec.ValidationError):
        view = None
    if view is not None:
        facts.append(view.reason or "compacted")
        if view.stages:
            facts.append("stages " + ",".join(map(str, view.stages)))
        if view.tokens_before:
            facts.append(f"~{view.tokens_before:,} → ~{view.tokens_after:,} tokens")
        if view.archives:
            facts.append(
                f"turns {view.archives[0].first_turn}–{view.archives[-1].last_turn} archived"
            )
        if view.dropped_turns:
            facts.append(f"{view.dropped_turns} turns dropped")
    return f'<div class="marker">{_icon("compaction")} compaction · {_e(" · ".join(facts))}</div>'


def _when(ts: float, *, full: bool = False) -> str:
    local = dt.datetime.fromtimestamp(ts).astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S %Z" if full else "%H:%M:%S")


def _tokens(usages: Sequence[Usage]) -> str:
    if not usages:
        return ""
    i = sum(u.input_tokens for u in usages)
    c = sum(u.cached_tokens for u in usages)
    o = sum(u.output_tokens for u in usages)
    t = sum(u.thinking_tokens for u in usages)
    return f"in {i:,} (cached {c:,}) · out {o:,} (thinking {t:,}) tokens"


_SCRIPT = """
for (const b of document.querySelectorAll("button[data-open]")) {
  b.addEventListener("click", () => {
    const open = b.dataset.open === "1";
    for (const d of document.querySelectorAll("details")) d.open = open;
  });
}
"""
# Only this script may run: its hash is the CSP's one script source (no 'unsafe-inline').
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()
_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{_SCRIPT_HASH}'; base-uri 'none'; form-action 'none'"
)

# Drawn on a 16 x 16 grid with strokes (.ic in the CSS); a shape with fill="currentColor" is solid.
_ICONS = {
    "user": '<circle cx="8" cy="5" r="3"/><path d="M2.5 14.5c0-3 2.5-5 5.5-5s5.5 2 5.5 5"/>',
    "assistant": (
        '<rect x="2.5" y="5" width="11" height="9" rx="2"/><path d="M8 5V2.5"/>'
        '<circle cx="5.7" cy="9.5" r="1.1" fill="currentColor" stroke="none"/>'
        '<circle cx="10.3" cy="9.5" r="1.1" fill="currentColor" stroke="none"/>'
    ),
    "system": (
        '<circle cx="8" cy="8" r="6.5"/><path d="M8 7.2v4.3"/>'
        '<circle cx="8" cy="4.8" r="1" fill="currentColor" stroke="none"/>'
    ),
    "thought": (
        '<ellipse cx="8.7" cy="6.3" rx="5.8" ry="4.3"/><circle cx="4" cy="12.2" r="1.3"/>'
        '<circle cx="1.9" cy="14.6" r=".6"/>'
    ),
    "tool": (
        '<path d="M9.2 6.8 2.8 13.2M13.9 4.6a3.6 3.6 0 0 1-5 3.2 3.6 3.6 0 0 1 3.2-5.6l-2 2 .4 1.9'
        ' 1.9.4z"/>'
    ),
    "result": '<path d="M8 2v7.5M5 6.5l3 3 3-3M2 10.5v3h12v-3"/>',
    "attach": (
        '<path d="M10.5 4.5 5.3 9.7a1.4 1.4 0 0 0 2 2l5.4-5.4a2.8 2.8 0 0 0-4-4L3.3 7.7'
        'a4.2 4.2 0 0 0 6 6l4-4"/>'
    ),
    "compaction": '<path d="M8 1.5v4.2M5.5 3.3 8 5.8l2.5-2.5M8 14.5v-4.2M5.5 12.7 8 10.2l2.5 2.5'
    'M2.5 8h11"/>',
    "warn": (
        '<path d="M8 2 14.5 13.5h-13z"/><path d="M8 6.3v3.6"/>'
        '<circle cx="8" cy="11.7" r=".9" fill="currentColor" stroke="none"/>'
    ),
    "done": '<path d="M3 8.5l3.2 3.2L13 4.8"/>',
    "step_limit": '<path d="M2 8h8.5M7.5 5l3 3-3 3M13.5 2.5v11"/>',
    "budget": (
        '<circle cx="8" cy="8" r="6.5"/><path d="M10.1 5.9c-.3-.7-1.1-1.1-2.1-1.1-1.2 0-2 .6-2 1.5'
        ' 0 2 4.1 1.1 4.1 3.3 0 .9-.8 1.6-2.1 1.6-1 0-1.8-.4-2.2-1.1M8 3.4v9.2"/>'
    ),
    "repeating": (
        '<path d="M2.5 7.5a5.5 5.5 0 0 1 10-3M13.5 8.5a5.5 5.5 0 0 1-10 3M12.8 1.6v3.2H9.6'
        'M3.2 14.4v-3.2h3.2"/>'
    ),
    "interrupted": '<path d="M3 3.5 9 8l-6 4.5zM12.5 3.5v9"/>',
    "stopped": '<rect x="3.5" y="3.5" width="9" height="9" rx="1.5"/>',
    "failed": '<circle cx="8" cy="8" r="6.5"/><path d="M5.7 5.7l4.6 4.6M10.3 5.7l-4.6 4.6"/>',
    "running": '<circle cx="8" cy="8" r="6.5"/><path d="M8 4.5V8l2.3 1.5"/>',
}
_SPRITE = (
    '<svg class="sprite" aria-hidden="true">'
    + "".join(f'<symbol id="i-{k}" viewBox="0 0 16 16">{v}</symbol>' for k, v in _ICONS.items())
    + "</svg>"
)

_CSS = """
:root { color-scheme: dark; --bg: #0d1117; --panel: #161b22; --line: #30363d; --text: #e6edf3;
  --dim: #8b949e; --user: #1f6feb; --ok: #3fb950; --warn: #d29922; --bad: #f85149;
  --think: #a371f7; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--text);
  font: 14px/1.45 system-ui, sans-serif; }
header { position: sticky; top: 0; background: var(--panel); border-bottom: 1px solid var(--line);
  padding: 10px 20px; z-index: 1; }
header h1 { margin: 0 0 4px; font-size: 18px; }
.facts span { display: inline-block; color: var(--dim); margin-right: 14px; }
button { background: #21262d; color: var(--text); border: 1px solid var(--line); border-radius: 6px;
  padding: 2px 10px; cursor: pointer; }
main { max-width: 1100px; margin: 0 auto; padding: 10px 20px 60px; }
.turn { border: 1px solid var(--line); border-radius: 8px; margin: 16px 0; padding: 8px 14px;
  background: var(--panel); }
h2 { font-size: 15px; margin: 4px 0 10px; } h2 a { color: var(--text); text-decoration: none; }
.dim { color: var(--dim); font-weight: normal; }
.badge { border-radius: 10px; padding: 0 8px; font-size: 12px; border: 1px solid var(--line);
  white-space: nowrap; }
.badge.done { color: var(--ok); } .badge.failed { color: var(--bad); }
.badge.interrupted, .badge.stopped, .badge.step_limit, .badge.budget, .badge.repeating {
  color: var(--warn); }
.badge.running { color: var(--user); }
.ic { width: 1.15em; height: 1.15em; vertical-align: -0.2em; fill: none; stroke: currentColor;
  stroke-width: 1.5; stroke-linecap: round; stroke-linejoin: round; }
.sprite { position: absolute; width: 0; height: 0; overflow: hidden; }
pre { white-space: pre-wrap; overflow-wrap: anywhere; margin: 4px 0;
  font: 13px/1.4 ui-monospace, monospace; }
.msg, .call, details, .step-head, .marker, .error { margin: 6px 0; }
.msg { padding: 6px 10px; border-radius: 6px; background: #0d1117; }
.msg.user { border-left: 3px solid var(--user); } .msg.system { border-left: 3px solid var(--dim); }
.msg.assistant { border-left: 3px solid var(--ok); }
.who { font-size: 12px; color: var(--dim); }
.step { border-left: 2px solid var(--line); padding-left: 12px; margin: 10px 0; }
.step-head { font-size: 12px; color: var(--dim); }
.thought summary { color: var(--think); } .thought pre { color: #c9b8f0; }
.msg.call { border-left: 3px solid var(--warn); }
.call .args { background: #0d1117; padding: 4px 8px; border-radius: 6px; }
details { background: #0d1117; border-radius: 6px; padding: 4px 8px; }
summary { cursor: pointer; }
.result summary { color: var(--ok); }
.result.failed summary, .result.killed summary, .result.lost summary { color: var(--bad); }
.result.timed_out summary, .result.skipped summary { color: var(--warn); }
details.more { border: 1px dashed var(--line); } details.more summary { color: var(--dim); }
.marker { color: var(--warn); border: 1px dashed var(--warn); border-radius: 6px;
  padding: 4px 10px; }
.error { color: var(--bad); }
"""

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
{sprite}
<header><h1>{h1}</h1><div class="facts">{facts}</div>
<div class="tools"><button type="button" data-open="1">Expand all</button>
<button type="button" data-open="0">Collapse all</button></div></header>
<main>
{body}
</main>
<script>{script}</script>
</body>
</html>
"""


def render_turn_page(db_path: str, session_id: str, root_id: int) -> tuple[str, str] | None:
    """Render the turn opened by user message ``root_id`` (blocking: call it in a worker thread).

    A Store is not thread-safe, so this opens its own on the same database file.

    Args:
        db_path: The database file.
        session_id: The session.
        root_id: The turn's user message.

    Returns:
        ``(html, file name)``, or None when the session is gone. A turn not found (answered together
        with a later message) shows the whole session.
    """
    from kesoku.store import Store

    store = Store(db_path)
    try:
        if store.get_session(session_id) is None:
            return None
        turns = build_turns(store.history(session_id), [])
        number = next((t.number for t in turns if any(r.id == root_id for r in t.roots)), None)
        html = render_trace(store, session_id, turn=number)
        suffix = f"turn-{number}" if number is not None else "session"
        return html, f"kesoku-{session_id}-{suffix}.html"
    finally:
        store.close()
