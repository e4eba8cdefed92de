"""The compacted view of a session: what the model sees instead of the whole log.

The message log is never rewritten. A compaction appends a :class:`ViewState` to the store (table
``view_states``; the newest one wins) saying, in history order ``(root_ts, ts, id)``:

- ``archive_before``: messages before this key are not sent; the archives (structured turn lines, or
  a model-written summary) stand in for them, at the head of the first user turn;
- ``evict_before``: tool results before this key are sent as a one-line stub, or, for a long result,
  as the excerpt kept in ``retained``;
- ``shortened``: tool results of a turn that alone outgrew the window, sent as their start and end
  with a note saying how much was cut (they are after ``evict_before``, usually in the active turn);
- which files the archived turns read and modified.

Cuts always fall on turn boundaries (where ``root_ts`` changes), so a tool call and its result are
never separated: every message of a turn shares its ``root_ts``.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Callable, Sequence
from typing import Literal

import msgspec

from kesoku.vocab.ir import LLMTurn, TextBlock
from kesoku.vocab.model import Kind, Message
from kesoku.vocab.transcript import Transcript

Key = tuple[float, float, int]
"""A message's place in history order: ``(root_ts, ts, id)``."""

EVICTED = "[evicted to save context; run the tool again if you need this output]"
RETAINED = "[evicted to save context: {chars} characters; the start and end are kept]\n{excerpt}"
SHORTENED = (
    "{head}\n[… {cut:,} of {chars:,} characters cut here to fit the context window …]\n{tail}"
)

HEAD_INTRO = (
    "[Compacted context: earlier turns of this session, condensed. "
    "Their messages are no longer shown; "
    "treat this as your memory of them.]"
)


key: Callable[[Message], Key] = operator.attrgetter("root_ts", "ts", "id")
"""A message's history-order key, ``(root_ts, ts, id)`` (C-level: no Python call)."""


class Archive(msgspec.Struct, frozen=True):
    """Stand-in text for a range of turns.

    Attributes:
        first_turn: Number of the first turn covered (1 = the session's first user turn).
        last_turn: Number of the last turn covered.
        text: ``Turn N: intent=…; action=…; conclusion=…; files=…`` lines, or a summary by topic.
        kind: ``turns`` (made from the log, no model call) or ``summary`` (model-written).
    """

    first_turn: int
    last_turn: int
    text: str
    kind: Literal["turns", "summary"] = "turns"


class ViewState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One compaction's view (see the module docstring); stored as msgspec JSON.

    Attributes:
        archive_before: Messages before this key are replaced by ``archives``.
        evict_before: Tool results before this key are stubs or ``retained`` excerpts.
        retained: Excerpts of long evicted results, by result message id.
        shortened: The shown text of results shortened in place (stage 5), by result message id.
        archives: Oldest first.
        dropped_turns: Archived turns left out entirely to fit the window (stage 4).
        files_read: Paths the archived turns read (read_file, list_dir, glob, grep).
        files_modified: Paths they wrote (write_file, edit_file).
        stages: The stages that ran (1 evict, 2 archive, 3 summary, 4 truncate, 5 shorten the
            active turn's tool results).
        reason: ``auto``, ``/compact`` or ``context overflow``.
        tokens_before: Estimated request tokens before.
        tokens_after: Estimated request tokens after.
    """

    archive_before: Key | None = None
    evict_before: Key | None = None
    retained: dict[int, str] = {}
    shortened: dict[int, str] = {}
    archives: tuple[Archive, ...] = ()
    dropped_turns: int = 0
    files_read: tuple[str, ...] = ()
    files_modified: tuple[str, ...] = ()
    stages: tuple[int, ...] = ()
    reason: str = ""
    tokens_before: int = 0
    tokens_after: int = 0

    def encode(self) -> bytes:
        """The view as stored: msgspec JSON."""
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ViewState:
        """Read a stored view; an unreadable one (a newer Kesoku's) counts as no view."""
        try:
            return msgspec.json.decode(data, type=cls)
        except msgspec.ValidationError:
            return cls()

    def head_text(self) -> str | None:
        """The text that stands in for the archived turns, or None when nothing is archived."""
        if (
            not self.archives
            and not self.dropped_turns
            and not self.files_read
            and not self.files_modified
        ):
            return None
        parts = [HEAD_INTRO]
        if self.dropped_turns:
            parts.append(
                f"[{self.dropped_turns} earlier turn(s) were left out entirely "
                "to fit the context window.]"
            )
        for archive in self.archives:
            if archive.kind == "summary":
                parts.append(
                    f"Summary of turns {archive.first_turn}-{archive.last_turn}:\n{archive.text}"
                )
            else:
                parts.append(archive.text)
        if self.files_read:
            parts.append("Files read earlier: " + ", ".join(self.files_read))
        if self.files_modified:
            parts.append("Files modified earlier: " + ", ".join(self.files_modified))
        return "\n\n".join(parts)

    def shown(self, msg: Message) -> Message:
        """The message as the model sees it.

        An evicted result as its stub or excerpt, a shortened one as its ends.
        """
        if msg.kind is not Kind.TOOL_RESULT:
            return msg
        if self.evict_before is None or key(msg) >= self.evict_before:
            short = self.shortened.get(msg.id)
            return msg if short is None else msgspec.structs.replace(msg, content=short)
        excerpt = self.retained.get(msg.id)
        text = (
            EVICTED if excerpt is None else RETAINED.format(chars=len(msg.content), excerpt=excerpt)
        )
        return msgspec.structs.replace(msg, content=text)


def archive_start(messages: Sequence[Message], view: ViewState | None) -> int:
    """Index of the first message the view still sends (0 without a view).

    Args:
        messages: Messages in history order (searched by :func:`key`).
        view: The view.
    """
    if view is None or view.archive_before is None:
        return 0
    return bisect.bisect_left(messages, view.archive_before, key=key)


def with_head(turns: list[LLMTurn], head: str | None) -> list[LLMTurn]:
    """Put the archives' text first in the first (user) turn."""
    if head is None or not turns:
        return turns
    first = turns[0]
    return [LLMTurn("user", (TextBlock(head), *first.blocks)), *turns[1:]]


def view_turns(messages: Sequence[Message], view: ViewState | None) -> list[LLMTurn]:
    """The request turns of ``messages`` (history order) under a view, built from scratch.

    :class:`kesoku.agent.history.SessionHistory` does the same incrementally; this is for measuring
    a candidate view during compaction.
    """
    start = archive_start(messages, view)
    shown = messages[start:] if view is None else [view.shown(m) for m in messages[start:]]
    return with_head(Transcript(shown).turns(), view.head_text() if view is not None else None)
