"""Pure Discord adapter functions: who is answered, chunking, rendering, labels, the context prompt.

Nothing here imports discord.py or touches the network, so every rule is unit-tested directly.

Discord limits used (Discord API docs):

- a message's ``content`` holds at most 2,000 characters ("Create Message": content, max 2000);
- a button label at most 80 characters, a ``custom_id`` at most 100, five buttons per action row and
  five rows per message ("Message Components": Button, Action Row);
- a string select menu fills an action row and holds 1 to 25 options, each label at most 100
  characters ("Component Reference": String Select, Select Option);
- a thread name at most 100 characters ("Start Thread from Message": name, 1-100 characters).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kesoku.config.settings import DiscordChannel
from kesoku.vocab.model import Message, Outcome, Status

MAX_MESSAGE_CHARS = 2000
MAX_LABEL_CHARS = 80
MAX_OPTION_CHARS = 100
"""A select menu option's label."""
BUTTONS_PER_MESSAGE = 25
"""Five action rows of five buttons."""
MORE_CHOICES = "… more choices:"
"""The text of a message carrying a question's select menus past the first 125 choices."""
MAX_THREAD_NAME_CHARS = 100
MAX_TOOL_RESULT_CHARS = 1500
"""A tool result is shown cut to this many characters: the model saw it whole; the chat needs a
glimpse."""
MAX_THOUGHT_CHARS = 3800
"""Thoughts are shown at most this long (two messages): long reasoning would bury the answer."""
MAX_TRIGGER_CHARS = 100
"""A turn header shows at most this much of a prompt that no Discord message carried."""
SCHEDULED = "schedule:"
"""How the ``external_id`` of a scheduled run's user message starts (``schedule:<name>:<time>``)."""

_FENCE = re.compile(r"^\s*(```|~~~)(\S*)")


# -- who gets answers -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Author:
    """What the answer rules need to know about a message and its author.

    Attributes:
        names: The author's user name, display name and id, as strings (any may be on the
            allowlist).
        is_bot: The author is a bot (this bot included).
        mentions_bot: The message mentions this bot (a user mention or one of its roles).
        mentions_others: The message mentions other users or roles, or @everyone/@here.
        direct: A direct message (DM) to the bot.
    """

    names: tuple[str, ...]
    is_bot: bool
    mentions_bot: bool
    mentions_others: bool
    direct: bool = False


def should_answer(author: Author, allowlist: Sequence[str]) -> bool:
    """Whether the bot answers a message.

    Bots (itself included) are never answered. A message that mentions the bot is answered. A
    message that mentions someone else but not the bot is addressed to them: ignored. Otherwise an
    allowlisted user is answered without a mention (and anyone in a DM, only if allowlisted).

    Args:
        author: The message's facts.
        allowlist: ``discord.user_allowlist``: user names, display names or ids.

    Returns:
        True to answer.
    """
    if author.is_bot:
        return False
    if author.mentions_bot:
        return True
    if author.mentions_others:
        return False
    allowed = {a.casefold() for a in allowlist}
    return any(name.casefold() in allowed for name in author.names if name)


def strip_mention(text: str, bot_id: int) -> str:
    """Remove the bot's own mention (``<@id>`` or ``<@!id>``) from a message's text."""
    return re.sub(rf"<@!?{bot_id}>", "", text).strip()


def channel_override(
    overrides: Sequence[DiscordChannel], channel_id: int, channel_name: str | None
) -> DiscordChannel | None:
    """The first ``[[discord.channels]]`` entry naming this channel by id or name.

    ``#name`` works too.
    """
    wanted = {str(channel_id)}
    if channel_name:
        wanted |= {channel_name.casefold(), f"#{channel_name.casefold()}"}
    for entry in overrides:
        if any(c.casefold() in wanted for c in entry.channels):
            return entry
    return None


# -- chunking -------------------------------------------------------------------------------------


def _joins(previous: str, char: str) -> bool:
    """Whether ``char`` continues the grapheme cluster that ``previous`` ends.

    Unicode UAX #29, simplified. Kept together: combining marks, variation selectors, emoji
    skin-tone modifiers, tag characters, anything after a zero-width joiner, the joiner itself,
    CR LF, and a second regional indicator.
    """
    code = ord(char)
    if previous == "\r" and char == "\n":
        return True
    if previous == "\u200d" or char == "\u200d":
        return True
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Mc"):
        return True
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF:  # variation selectors
        return True
    # skin tones, emoji tag sequences
    return 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def grapheme_cut(text: str, limit: int) -> int:
    """The largest index ``<= limit`` where ``text`` may be cut between grapheme clusters.

    Falls back to ``limit`` when a single cluster is longer than ``limit`` (a pathological run of
    combining marks): a message must still fit.
    """
    if len(text) <= limit:
        return len(text)
    cut = limit
    while cut > 0 and _joins(text[cut - 1], text[cut]):
        cut -= 1
    if cut > 0 and _regional(text[cut]) and _regional(text[cut - 1]):
        # Regional indicators pair into flags from the start of the run: cut before an odd one.
        run_start = cut
        while run_start > 0 and _regional(text[run_start - 1]):
            run_start -= 1
        if (cut - run_start) % 2:
            cut -= 1
    return cut if cut > 0 else limit


def _hard_split(line: str, limit: int) -> list[str]:
    """Split one over-long line into pieces of at most ``limit``.

    Cuts prefer spaces and never fall inside a grapheme cluster.
    """
    pieces = []
    while len(line) > limit:
        cut = grapheme_cut(line, limit)
        space = line.rfind(" ", 0, cut)
        if space > limit // 2:
            cut = space + 1
        pieces.append(line[:cut])
        line = line[cut:]
    if line:
        pieces.append(line)
    return pieces


def split_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> list[str]:
    """Split text into Discord messages of at most ``limit`` characters.

    Cuts fall at newline boundaries; a single longer line is cut at a space or, failing that,
    between grapheme clusters. A chunk that ends inside a code fence gets a closing fence, and the
    next chunk reopens it with the same opening line (language tag kept), so each message renders on
    its own. Chunks that are empty or whitespace-only are dropped (Discord refuses an empty message:
    "Cannot send an empty message", JSON error code 50006).

    Args:
        text: The text.
        limit: The most characters per message (at least 200, so a reopened fence always fits).

    Returns:
        The messages, in order; empty when the text is blank.
    """
    chunks: list[str] = []
    fence: str | None = None  # the opening line of the code fence open at the end of ``current``
    current = ""
    fresh = True  # ``current`` holds nothing but a reopened fence line

    def flush() -> None:
        nonlocal current, fresh
        if not fresh:
            body = current.strip("\n")
            if fence is not None:
                body += "\n```"
            if body.strip():
                chunks.append(body)
        current = f"{fence}\n" if fence is not None else ""
        fresh = True

    def add(piece: str) -> None:
        nonlocal current, fresh
        current += piece
        fresh = False

    for line in text.splitlines(keepends=True):
        match = _FENCE.match(line)
        after = fence
        if match is not None and len(line.strip()) <= 100:
            after = None if fence is not None else line.rstrip("\r\n")
        # room for "\n```" should the chunk end inside a fence
        closing = 4 if after is not None else 0
        if len(current) + len(line) + closing <= limit:
            add(line)
            fence = after
            continue
        flush()
        if len(current) + len(line) + closing <= limit:
            add(line)
            fence = after
            continue
        # One line longer than a whole message: cut it; the fence state holds across its pieces.
        reserve = 4 if fence is not None else 0
        width = max(limit - reserve - len(current), 1)
        for piece in _hard_split(line, width):
            if len(current) + len(piece) + reserve > limit:
                flush()
            add(piece)
        fence = after
    flush()
    return chunks


# -- rendering ------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line.strip() else ">" for line in text.splitlines())


def render_thought(text: str) -> str:
    """A thought: 💭 and the reasoning as a block quote (cut to :data:`MAX_THOUGHT_CHARS`)."""
    body = text.strip()
    if len(body) > MAX_THOUGHT_CHARS:
        body = body[: grapheme_cut(body, MAX_THOUGHT_CHARS)] + "…"
    return f"💭 {_quote(body).removeprefix('> ')}" if body else ""


def _code(text: str) -> str:
    # A fence inside a tool's output would end the block early: break it with a zero-width space.
    return text.replace("```", "`\u200b``")


def render_tool_call(call: Message) -> str:
    """A tool call: 🛠️ the tool's name and its arguments in a code block (the message's summary)."""
    name = call.metadata.tool_name or "tool"
    args = call.metadata.tool_arguments or {}
    summary = ", ".join(f"{k}={v!r}" for k, v in args.items())
    if len(summary) > MAX_TOOL_RESULT_CHARS:
        summary = summary[: grapheme_cut(summary, MAX_TOOL_RESULT_CHARS)] + "…"
    return f"🛠️ **{name}**" + (f"\n```\n{_code(summary)}\n```" if summary else "")


_OUTCOME_NOTES = {
    Outcome.FAILED: "failed",
    Outcome.TIMED_OUT: "timed out",
    Outcome.SKIPPED: "skipped",
    Outcome.KILLED: "killed",
    Outcome.LOST: "lost (the daemon stopped while it ran)",
    Outcome.REPEATED: "not run: a repeat",
    Outcome.TRUNCATED: "not run: the reply was cut",
}


def render_tool_result(result: Message) -> str:
    """A tool result: 📥 the tool's name, its outcome unless completed, and the output's start."""
    name = result.metadata.tool_name or result.sender
    outcome = result.metadata.outcome
    note = f" ({_OUTCOME_NOTES[outcome]})" if outcome in _OUTCOME_NOTES else ""
    body = result.content.strip()
    if len(body) > MAX_TOOL_RESULT_CHARS:
        rest = len(body) - MAX_TOOL_RESULT_CHARS
        body = body[: grapheme_cut(body, MAX_TOOL_RESULT_CHARS)] + f"\n… ({rest} more characters)"
    return f"📥 **{name}**{note}" + (f"\n```\n{_code(body)}\n```" if body else "")


def button_label(text: str, limit: int = MAX_LABEL_CHARS) -> str:
    """A button label within Discord's limit (cut with …, never empty, never inside a grapheme)."""
    text = " ".join(text.split()) or "…"
    if len(text) <= limit:
        return text
    return text[: grapheme_cut(text, limit - 1)] + "…"


def fit_buttons(choices: Sequence[str]) -> bool:
    """Whether a question's choices all show whole on one message's buttons.

    At most :data:`BUTTONS_PER_MESSAGE`, none cut by :func:`button_label`; otherwise the message
    lists every choice in full (:func:`question_content`) and the components number them.
    """
    return len(choices) <= BUTTONS_PER_MESSAGE and all(
        button_label(c) == " ".join(c.split()) for c in choices
    )


def question_content(text: str, choices: Sequence[str]) -> str:
    """The message of a ``[question: … | …]``: its text, and every choice numbered in full.

    The list is left out when the choices all fit whole on buttons (:func:`fit_buttons`): the
    buttons show them already. Numbered from 1, as the buttons or select options are.
    """
    head = text or "❓"
    if fit_buttons(choices):
        return head
    return head + "\n" + "\n".join(f"{n}. {c}" for n, c in enumerate(choices, 1))


def thread_name(text: str, *, fallback: str = "conversation") -> str:
    """A thread name from a message's first line: 1 to 100 characters."""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    first = re.sub(r"<[@#][!&]?\d+>", "", first).strip() or fallback
    return button_label(first, MAX_THREAD_NAME_CHARS)


# -- turn headers ---------------------------------------------------------------------------------

_ENDED_UNSEEN = {
    Status.DONE: "☑️ ended",
    Status.INTERRUPTED: "🛑 interrupted",
    Status.FAILED: "⚠ failed",
}


def trigger_line(root: Message) -> str:
    """The header line naming what started a turn when no Discord message shows it, else ``""``.

    A user message Kesoku took in from Discord (``external_id`` the Discord message's id) or a
    ``[question: …]`` choice (``choice:<interaction>``, announced in the channel) is on screen
    already. Any other was posted by Kesoku itself: a scheduled run (``external_id``
    ``schedule:…``) reads ``⏰ Scheduler: <first line of the prompt>``, another program's message
    ``📨 <sender>: <first line>``, at most :data:`MAX_TRIGGER_CHARS` characters.
    """
    external = root.external_id or ""
    if (external.isascii() and external.isdigit()) or external.startswith("choice:"):
        return ""
    icon = "⏰" if external.startswith(SCHEDULED) else "📨"
    first = next((line.strip() for line in root.content.splitlines() if line.strip()), "…")
    return f"{icon} {button_label(f'{root.sender}: {first}', MAX_TRIGGER_CHARS)}"


def header_text(trigger: str, status: str) -> str:
    """A turn header: the trigger line (when there is one) above the status or the metrics."""
    return f"{trigger}\n{status}" if trigger else status


def ended_unseen(status: Status) -> str:
    """The status of a turn that had ended when its user message was delivered.

    It ran while the adapter was not following the log (a scheduled run while Discord was still
    connecting, an adapter restart): its end event, and so its figures, were not seen.
    """
    return f"{_ENDED_UNSEEN.get(status, '☑️ ended')} while the adapter was away"


def attachment_note(names: Iterable[tuple[str, str]]) -> str:
    """Readable references appended to a user message: ``[attachment: name → /abs/path]`` lines."""
    return "\n".join(f"[attachment: {name} → {path}]" for name, path in names)


# -- the context prompt ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Place:
    """Where a conversation happens, for the system prompt.

    Attributes:
        server: The guild's name (None for a direct message).
        server_id: The guild's id.
        channel: The channel's name.
        channel_id: The channel's id.
        topic: The channel's topic.
        thread: The thread's name, when the conversation is a thread.
        thread_id: The thread's id.
        bot: The bot's user name and id.
        members: Active members as (display name, user name, id), this conversation's author first.
    """

    server: str | None
    server_id: int | None
    channel: str
    channel_id: int
    topic: str | None
    thread: str | None
    thread_id: int | None
    bot: tuple[str, int]
    members: tuple[tuple[str, str, int], ...]


def context_prompt(place: Place) -> str:
    """The section of the system prompt that says where the conversation is and who takes part.

    Mentions in Discord are written ``<@USER_ID>`` (Discord API, "Message Formatting"): the ids let
    the model mention a member deliberately.
    """
    lines = ["## Discord", ""]
    if place.server is not None:
        lines.append(f"- Server: {place.server} (id {place.server_id})")
    else:
        lines.append("- A direct message")
    channel = f"- Channel: #{place.channel} (id {place.channel_id})"
    lines.append(channel + (f"; topic: {place.topic}" if place.topic else ""))
    if place.thread is not None:
        lines.append(f"- Thread: {place.thread} (id {place.thread_id})")
    lines.append(f"- You are {place.bot[0]} (user id {place.bot[1]})")
    if place.members:
        lines.append("- Active members (mention one as <@id>):")
        lines += [f"  - {display} (@{user}, id {uid})" for display, user, uid in place.members]
    lines.append(
        "Messages longer than 2,000 characters are split; "
        "@everyone, @here and role mentions never ping."
    )
    return "\n".join(lines)
