"""Cards v2 JSON for Google Chat messages (pure: dicts in the REST field names, no Google imports).

The field names are those of the Chat API REST reference (``Message.cardsV2[]`` = ``CardWithId``
{``cardId``, ``card``}; ``Card`` {``header``, ``sections[]``}; ``Section`` {``header``,
``collapsible``, ``uncollapsibleWidgetsCount``, ``widgets[]``}; widgets ``textParagraph`` {``text``,
``textSyntax``}, ``buttonList`` {``buttons[]``: ``text``, ``onClick.action`` {``function``,
``parameters[]``: ``key``, ``value``}}, ``divider``). The tests decode every body built here with
the official client's ``Message`` type, which refuses an unknown field name.

Limits: "The maximum message size, including any text or cards, is 32,000 bytes" (Chat API, "Send a
message"); "You can add up to 100 widgets per card. Any widgets beyond this limit are ignored"
(Cards v2 reference, ``Card``); a card's text paragraph is HTML unless ``textSyntax`` is
``MARKDOWN``. A ``[question: … | …]`` is a Markdown list in one text paragraph, so neither a
button count nor a ``selectionInput``'s 100 items limits its choices: all are listed, in full.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

from kesoku.vocab.markup import FilePart, Part, QuestionPart, TextPart
from kesoku.vocab.model import Message, Status
from kesoku_gchat.events import ANSWER_FUNCTION, STOP_FUNCTION

MAX_MESSAGE_BYTES = 32_000
"""Chat's limit on one message, text and cards together (Chat API, "Send a message")."""
TEXT_BUDGET_BYTES = 24_000
"""JSON-escaped answer text per message: the rest of the 32,000 bytes is left for the card's
structure."""
MAX_WIDGETS = 100
"""Widgets per card; Chat ignores any beyond (Cards v2 reference, ``Card``)."""
FALLBACK_CHARS = 200
"""``fallbackText`` (what notifications show of a card message) is the answer's first characters."""
MAX_ENTRIES = 60
"""Lines a turn card keeps in its Thoughts & Tools section; older ones are counted, not shown."""
ENTRY_CHARS = 400
"""A thought or system line is cut to this many characters in the turn card (the log keeps it
whole)."""
ARGS_CHARS = 120
"""A tool call's argument suffix (inside ``<code>``) is cut to this many characters."""
THOUGHTS_TITLE = "Thoughts & Tools"
WORKING = "⏳ Working…"
TRIGGER_CHARS = 100
"""A turn card shows at most this much of a prompt that no Chat message carried."""
SCHEDULED = "schedule:"
"""How the ``external_id`` of a scheduled run's user message starts (``schedule:<name>:<time>``)."""
_ENDED_UNSEEN = {
    Status.DONE: "☑️ Ended",
    Status.INTERRUPTED: "🛑 Interrupted",
    Status.FAILED: "⚠ Failed",
}

Json = dict[str, Any]


# -- widgets --------------------------------------------------------------------------------------


def markdown(text: str) -> Json:
    """A text paragraph in Markdown (``textSyntax: MARKDOWN``, Cards v2 ``TextParagraph``)."""
    return {"textParagraph": {"text": text, "textSyntax": "MARKDOWN"}}


def paragraph(html_text: str) -> Json:
    """A text paragraph in Chat's HTML subset (the default ``textSyntax``).

    Escape user text first.
    """
    return {"textParagraph": {"text": html_text}}


def button(text: str, function: str, **parameters: str) -> Json:
    """A button: a click publishes a ``CARD_CLICKED`` event with ``function`` and ``parameters``."""
    action = {
        "function": function,
        "parameters": [{"key": k, "value": v} for k, v in parameters.items()],
    }
    return {"text": text, "onClick": {"action": action}}


def message_body(card_id: str, sections: Sequence[Json], *, fallback: str = "") -> Json:
    """A ``Message`` body holding one card (``cardsV2[0]``).

    With ``fallback``, also ``fallbackText``, for notifications.
    """
    body: Json = {"cardsV2": [{"cardId": card_id, "card": {"sections": list(sections)}}]}
    if fallback:
        body["fallbackText"] = fallback[:FALLBACK_CHARS]
    return body


def body_bytes(body: Json) -> int:
    """The size of a message body as sent (UTF-8 JSON)."""
    return len(json.dumps(body, ensure_ascii=False).encode())


# -- the turn card --------------------------------------------------------------------------------


def trigger_line(root: Message) -> str:
    """The card line naming what started a turn when no Chat message shows it, else ``""``.

    A user message Kesoku took in from Chat has the Chat message's resource name
    (``spaces/…/messages/…``) as its ``external_id``: it is on screen already. Any other was posted
    by Kesoku itself: a scheduled run (``external_id`` ``schedule:…``) reads ``⏰ Scheduler: <first
    line of the prompt>``, another program's message ``📨 <sender>: <first line>``, cut to
    :data:`TRIGGER_CHARS`.
    """
    external = root.external_id or ""
    if external.startswith("spaces/"):
        return ""
    icon = "⏰" if external.startswith(SCHEDULED) else "📨"
    first = next((line.strip() for line in root.content.splitlines() if line.strip()), "…")
    return f"{icon} {_cut(' '.join(f'{root.sender}: {first}'.split()), TRIGGER_CHARS)}"


def ended_unseen(status: Status) -> str:
    """The status of a turn that had ended when its user message was delivered.

    It ran while the adapter was not following the log (a scheduled run while the adapter was
    starting, a restart): its end event, and so its figures, were not seen.
    """
    return f"{_ENDED_UNSEEN.get(status, '☑️ Ended')} while the adapter was away"


def turn_card(
    *,
    status: str,
    entries: Sequence[str],
    hidden: int = 0,
    session_id: str = "",
    running: bool = True,
    trigger: str = "",
) -> Json:
    """The card of one turn: its status, and a collapsed "Thoughts & Tools" section.

    Args:
        status: ``⏳ Working…`` while it runs; the metrics line (``TurnMetrics.render()``) once it
            ended.
        entries: The section's lines, already in Chat's HTML (see :func:`thought_entry`, ...).
        hidden: Older lines left out (shown as a count).
        session_id: The session, for the stop button.
        running: Show the stop button.
        trigger: A line above the status naming what started the turn (:func:`trigger_line`);
            also the notification's text.

    Returns:
        The message body.
    """
    top: list[Json] = [paragraph(html.escape(status, quote=False))]
    if trigger:
        top.insert(0, paragraph(html.escape(trigger, quote=False)))
    if running and session_id:
        top.append(
            {"buttonList": {"buttons": [button("🛑 Stop", STOP_FUNCTION, session_id=session_id)]}}
        )
    lines = list(entries)
    if hidden:
        lines.insert(0, f"<i>… {hidden} earlier {'line' if hidden == 1 else 'lines'}</i>")
    widgets = [paragraph(line) for line in lines] or [paragraph("<i>nothing yet</i>")]
    count = len(entries) + hidden
    thoughts = {
        "header": f"{THOUGHTS_TITLE} ({count})" if count else THOUGHTS_TITLE,
        "collapsible": True,
        "uncollapsibleWidgetsCount": 0,  # folded: every line sits behind "show more"
        "widgets": widgets,
    }
    return message_body("turn", [{"widgets": top}, thoughts], fallback=trigger or status)


def thought_entry(text: str) -> str:
    """A thought, in italics, cut to :data:`ENTRY_CHARS`."""
    return f"💭 <i>{html.escape(_cut(text.strip(), ENTRY_CHARS), quote=False)}</i>"


def tool_entry(name: str, arguments: dict[str, Any] | None, mark: str = "") -> str:
    """A tool call: its name and its arguments as a ``<code>`` suffix.

    For example ``🛠️ <b>shell</b> <code>ls</code>``.
    """
    suffix = args_suffix(arguments)
    code = f" <code>{html.escape(suffix, quote=False)}</code>" if suffix else ""
    return f"🛠️ <b>{html.escape(name, quote=False)}</b>{code}{f' {mark}' if mark else ''}"


def system_entry(text: str) -> str:
    """A system notice (a failed model call, a step limit, an answer record, a compaction)."""
    return f"ℹ️ {html.escape(_cut(text.strip(), ENTRY_CHARS), quote=False)}"


def args_suffix(arguments: dict[str, Any] | None) -> str:
    """A tool call's arguments in one short line.

    A lone string argument is shown bare, else ``k=v`` pairs.
    """
    if not arguments:
        return ""
    if len(arguments) == 1:
        (value,) = arguments.values()
        if isinstance(value, str):
            return _cut(" ".join(value.split()), ARGS_CHARS)
    pairs = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    return _cut(" ".join(pairs.split()), ARGS_CHARS)


OUTCOME_MARKS = {
    "completed": "✅",
    "failed": "❌",
    "timed_out": "⏱️",
    "skipped": "⏭️",
    "killed": "💀",
    "lost": "❓",
    "repeated": "🔁",
    "truncated": "✂️",
}
"""How a tool call's line ends once its result is in (``kesoku.vocab.model.Outcome`` values)."""


# -- answers --------------------------------------------------------------------------------------


def answer_bodies(parts: Iterable[Part], *, file_note: str = "📎 {name}") -> list[Json]:
    """The messages of one answer: Markdown cards, each within the message limit.

    Text goes in ``textParagraph`` widgets with ``textSyntax: MARKDOWN``; a ``[question: … | …]`` is
    the question in bold with its choices as a Markdown list under it; a ``[file: …]`` becomes a
    note (``file_note`` with ``{name}``). Widgets are packed into one card until the next would pass
    :data:`TEXT_BUDGET_BYTES` or :data:`MAX_WIDGETS`; a text longer than that is split at line
    boundaries first. Every choice of a question is listed, in full: nothing is left out.

    Args:
        parts: The answer, parsed by :func:`kesoku.vocab.markup.parse_reply`.
        file_note: The text shown for a file, with ``{name}``.

    Returns:
        Message bodies, in order (none for an empty answer).
    """
    texts: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            texts.extend(split_text(part.text))
        elif isinstance(part, QuestionPart):
            choices = "\n".join(f"- {c}" for c in part.choices)
            texts.extend(split_text(f"**{part.text or '❓'}**\n{choices}"))
        elif isinstance(part, FilePart):
            texts.append(file_note.format(name=part.path))
    bodies: list[Json] = []
    widgets: list[Json] = []
    used = 0
    for text in texts:
        cost = _json_cost(text)
        if widgets and (used + cost > TEXT_BUDGET_BYTES or len(widgets) >= MAX_WIDGETS):
            bodies.append(_answer_body(len(bodies), widgets))
            widgets, used = [], 0
        widgets.append(markdown(text))
        used += cost
    if widgets:
        bodies.append(_answer_body(len(bodies), widgets))
    return bodies


def _answer_body(index: int, widgets: list[Json]) -> Json:
    first = widgets[0]["textParagraph"]["text"]
    return message_body(f"answer-{index}", [{"widgets": widgets}], fallback=first)


def split_text(text: str, budget_bytes: int = TEXT_BUDGET_BYTES) -> list[str]:
    """Split text into pieces whose JSON-escaped size stays within ``budget_bytes``.

    Pieces end at line boundaries; a single longer line is cut by characters. A piece that ends
    inside a fenced code block closes it, and the next piece opens it again, so each renders on its
    own.
    """
    if _json_cost(text) <= budget_bytes:
        return [text]
    pieces: list[str] = []
    lines: list[str] = []
    used = 0
    fence = ""  # the fence line of the code block the current line is in

    def flush() -> None:
        nonlocal used
        if lines:
            piece = "\n".join(lines)
            pieces.append(piece + ("\n```" if fence else ""))
            lines.clear()
            used = 0
            if fence:
                lines.append(fence)
                used = _json_cost(fence) + 2

    for line in text.split("\n"):
        for chunk in _cut_line(line, budget_bytes // 2):
            cost = _json_cost(chunk) + 2  # + the escaped newline
            if used + cost > budget_bytes - 16:  # room for a closing fence
                flush()
            lines.append(chunk)
            used += cost
        if line.lstrip().startswith("```"):
            fence = "" if fence else line.strip()
    flush()
    return [p for p in pieces if p.strip() and p.strip() not in ("```", fence)]


def _cut_line(line: str, budget_bytes: int) -> list[str]:
    if _json_cost(line) <= budget_bytes:
        return [line]
    out: list[str] = []
    current: list[str] = []
    used = 0
    for char in line:
        cost = _json_cost(char)
        if used + cost > budget_bytes:
            out.append("".join(current))
            current, used = [], 0
        current.append(char)
        used += cost
    out.append("".join(current))
    return out


def _json_cost(text: str) -> int:
    """Bytes of ``text`` inside a JSON string (escapes included, quotes not)."""
    return len(json.dumps(text, ensure_ascii=False).encode()) - 2


# -- questions from tools -------------------------------------------------------------------------


def question_body(question_id: int, text: str, options: Sequence[str]) -> Json:
    """A tool's Allow/Deny question: its text, one button per option, and the typed alternative.

    A click publishes ``CARD_CLICKED`` with ``function`` :data:`ANSWER_FUNCTION` and the parameters
    ``question_id`` and ``choice``; typing ``allow`` or ``deny`` in the thread answers too.
    """
    buttons = [
        button(option, ANSWER_FUNCTION, question_id=str(question_id), choice=option)
        for option in options
    ]
    hint = " / ".join(o.lower() for o in options)
    widgets = [
        markdown(text),
        {"buttonList": {"buttons": buttons}},
        paragraph(f"<i>or reply {html.escape(hint, quote=False)}</i>"),
    ]
    return message_body(f"question-{question_id}", [{"widgets": widgets}], fallback=text)


def answered_body(question_id: int, text: str, choice: str, note: str) -> Json:
    """The question card once answered: the buttons give way to the choice and who made it."""
    mark = "✔" if choice.lower() == "allow" else "✘"
    widgets = [markdown(text), markdown(f"{mark} **{choice}**{f' — {note}' if note else ''}")]
    return message_body(
        f"question-{question_id}", [{"widgets": widgets}], fallback=f"{text} → {choice}"
    )


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
