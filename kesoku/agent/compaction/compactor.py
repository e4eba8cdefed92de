"""Progressive compaction: each stage runs only if the request is still too big.

The design is in ARCHITECTURE.md, "Windows". The stages, in order:

1. **Evict** the tool results of old turns: a short one becomes a stub (re-running the tool is
   cheap), a long one keeps its head and tail as a retained excerpt.
2. **Archive** old turns as structured lines made from the log, without a model call:
   ``Turn N: intent=…; action=…; conclusion=…; files=…``.
3. **Summarize**: the model merges the archives into a summary by topic. A failure falls back to the
   stage-2 lines (then stage 4) and cools down before the next try.
4. **Truncate**: leave the oldest archives out, with a note saying how many turns are gone. A model
   summary is kept while the request fits the limit with it; it goes only after stage 5.
5. **Shorten** the active turn's tool results (their start, their end and a note saying how much was
   cut), older steps first, the newest step's only when the request is still over the limit: a turn
   that alone outgrows the window (a few big shell outputs on a small local model) has nothing old
   to give.

"Old" means before a cut at a turn boundary that keeps the newest turns up to :data:`KEEP_FRACTION`
of the window, and always the active turn: the latest user request and every unfinished tool pair
stay verbatim. The compaction is atomic: it computes a view and stores it in one insert at the end,
so a cancelled compaction leaves nothing; messages arriving meanwhile wait in the worker's queue.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import trio

from kesoku.agent.compaction.tokens import (
    CHARS_PER_TOKEN,
    DEFAULT_WINDOW,
    Calibration,
    TurnSizes,
    estimate_turns,
    known_window,
    reported_or_default,
)
from kesoku.llm.base import BaseLLM
from kesoku.vocab.errors import BackendError
from kesoku.vocab.ir import LLMTurn, TextBlock
from kesoku.vocab.model import Kind, Message, Role
from kesoku.vocab.spend import BudgetExceeded, Meter
from kesoku.vocab.view import SHORTENED, Archive, Key, ViewState, key, view_turns

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.store import Store

log = logging.getLogger(__name__)

TARGET_FRACTION = 0.75
"""Stages run until the request is under this fraction of the threshold: room for the next turns."""
KEEP_FRACTION = 0.35
"""The newest turns kept verbatim may fill this fraction of the context window."""
LONG_RESULT_CHARS = 2000
"""A result longer than this keeps an excerpt when evicted; a shorter one becomes a stub."""
EXCERPT_HEAD_CHARS, EXCERPT_TAIL_CHARS = 600, 400
SHORTEN_MIN_CHARS = EXCERPT_HEAD_CHARS + EXCERPT_TAIL_CHARS + 200
"""An active-turn result this long or shorter is left whole: shortening it would save little."""
SHORTEN_TIERS = ((EXCERPT_HEAD_CHARS, EXCERPT_TAIL_CHARS), (160, 90))
"""(start, end) characters an active-turn result keeps: the first cut, then the second of a long
turn."""
FIELD_CHARS = 160
"""Longest intent or conclusion in an archive line."""
SUMMARY_COOLDOWN_S = 300.0
"""After a failed summary, stage 3 is skipped for this long."""
SUMMARY_TIMEOUT_S = 120.0
READ_TOOLS = frozenset({"read_file", "list_dir", "glob", "grep"})
WRITE_TOOLS = frozenset({"write_file", "edit_file"})

SUMMARY_SYSTEM = (
    "You condense the history of a conversation between a user and an AI agent, so the agent can\n"
    "go on working with a fraction of the context. "
    "Write a summary grouped by topic (short headings, terse bullets).\n"
    "Keep: the user's own words for any task still open; every identifier, path, URL, command, "
    "number and decision;\n"
    "what was tried and how it ended; open to-dos. Drop pleasantries and repetition. "
    "Never invent anything."
)


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """When and how far to compact, from ``[compaction]``.

    Attributes:
        enabled: Compact automatically (``/compact`` works either way).
        threshold: Fraction of the window above which a request is compacted.
        thresholds: Per-model overrides of ``threshold``.
        windows: Per-model context windows overriding the built-in table.
        local_window: The local model's window (``local.n_ctx``).
        tool_result_share: The most of the window one tool result may fill (a fraction); each
            tool's own ``max_output_bytes`` still bounds it.
    """

    enabled: bool = True
    threshold: float = 0.85
    thresholds: tuple[tuple[str, float], ...] = ()
    windows: tuple[tuple[str, int], ...] = ()
    local_window: int = 8192
    tool_result_share: float = 0.2

    @classmethod
    def from_config(cls, config: Config) -> CompactionPolicy:
        """The policy of a loaded config."""
        section = config.compaction
        return cls(
            enabled=section.enabled,
            threshold=section.threshold,
            thresholds=tuple(section.thresholds.items()),
            windows=tuple(section.context_windows.items()),
            local_window=config.local.n_ctx,
            tool_result_share=section.tool_result_share,
        )

    def window(self, llm: BaseLLM) -> int:
        """The context window of a backend's model, in tokens.

        :func:`~kesoku.agent.compaction.tokens.known_window`, else what the server reported
        (:func:`~kesoku.agent.compaction.tokens.reported_or_default`); a window the server reported
        counts only once :meth:`learn_window` asked for it.
        """
        known = _known_window(self.windows, llm.provider, llm.model, self.local_window)
        return known if known is not None else reported_or_default(llm.reported_window)

    def limit(self, llm: BaseLLM) -> int:
        """Tokens above which a request of this backend's model is compacted."""
        return int(self.window(llm) * dict(self.thresholds).get(llm.model, self.threshold))

    def result_cap(self, llm: BaseLLM, ratio: float = 1.0) -> int:
        """The most bytes of one tool result for this model: ``tool_result_share`` of its window.

        Args:
            llm: The session's backend.
            ratio: The session's calibration (provider tokens per estimated token): a denser
                tokenizer gets fewer bytes.
        """
        return max(1, int(self.window(llm) * self.tool_result_share * CHARS_PER_TOKEN / ratio))

    async def learn_window(self, llm: BaseLLM) -> int:
        """The window of a model the config and the table do not know, asked of its server once.

        When the server does not say, :data:`~kesoku.agent.compaction.tokens.DEFAULT_WINDOW` is used
        and one warning per model names the config key that sets it.

        Returns:
            The window in tokens (as :meth:`window` gives it from now on).
        """
        if _known_window(self.windows, llm.provider, llm.model, self.local_window) is None:
            reported = await llm.context_window()
            if reported is None and (llm.provider, llm.model) not in _WARNED:
                _WARNED.add((llm.provider, llm.model))
                log.warning(
                    "%s model %r: context window unknown (the server did not say); "
                    "assuming %d tokens. "
                    "Set it under [compaction.context_windows], e.g. %s = 32768",
                    llm.provider,
                    llm.model,
                    DEFAULT_WINDOW,
                    msgspec.json.encode(llm.model).decode(),
                )
        return self.window(llm)


@functools.lru_cache(maxsize=64)
def _known_window(
    windows: tuple[tuple[str, int], ...], provider: str, model: str, local_window: int
) -> int | None:
    """:func:`known_window` of a policy's settings, kept (a pure function of its arguments).

    Asked several times per step: the limit, the window check, each tool result's cap.
    """
    return known_window(dict(windows), provider, model, local_window)


_WARNED: set[tuple[str, str]] = set()
"""Models whose unknown window was warned about (once per process)."""


class Compactor:
    """Compacts one session's view; owned by its worker (it keeps the calibration and the cooldown).

    Args:
        store: Where view states are appended.
        policy: Thresholds and windows.
    """

    def __init__(self, store: Store, policy: CompactionPolicy) -> None:
        self.store = store
        self.policy = policy
        self.calibration = Calibration()
        self.sizes = TurnSizes()
        """The sizes of the turns of this session's last request (reused by identity)."""
        self.last_estimate = 0.0
        """:meth:`estimate`'s last figure, uncalibrated: the request the turn then sends."""
        self.cooldown_until = 0.0
        """Trio clock time before which stage 3 (the model summary) is not tried again."""

    def estimate(self, turns: Sequence[LLMTurn], fixed_tokens: float) -> int:
        """Calibrated tokens of a request of ``turns`` plus its system prompt and tool schemas.

        Meant for the session's growing requests (the turn loop): the turns it measured last time
        are not measured again. :meth:`measure` is the one for candidate views.
        """
        self.last_estimate = self.sizes.estimate(turns) + fixed_tokens
        return self.calibration.tokens(self.last_estimate)

    def learn(self, input_tokens: int) -> None:
        """Calibrate from the call just made: the provider's count of the request last estimated.

        ``input_tokens`` is set against :meth:`estimate`'s last figure, not measured again:
        re-estimating a long turn's every request after each call made the loop slower as the turn
        grew.
        """
        self.calibration.update(self.last_estimate, input_tokens)

    def measure(self, turns: Sequence[LLMTurn], fixed_tokens: float) -> int:
        """Calibrated tokens of any request's turns plus its system prompt and tool schemas."""
        return self.calibration.tokens(estimate_turns(turns) + fixed_tokens)

    async def compact(
        self,
        messages: Sequence[Message],
        active_ts: float,
        llm: BaseLLM,
        *,
        current: ViewState | None,
        fixed_tokens: float,
        reason: str,
        force: bool = False,
        meter: Meter | None = None,
    ) -> ViewState | None:
        """Compute a smaller view of a session, store it, and return it.

        Args:
            messages: The session's history in history order (up to the active turn).
            active_ts: ``root_ts`` of the active turn: it and anything after are kept verbatim.
            llm: The session's backend (stage 3, and its window).
            current: The view in force.
            fixed_tokens: Estimated tokens of the system prompt and tool schemas.
            reason: ``auto``, ``/compact`` or ``context overflow`` (recorded in the view).
            force: Compact even under the threshold (``/compact``, a context-overflow error).
            meter: Meters the summary call (stage 3); a reached cap skips it, as a failed call.

        Returns:
            The new view, or None when nothing could be made smaller (no turn old enough, no
            archive to leave out, no result of the active turn long enough to shorten).

        Cancellation:
            Nothing is stored until the end; a cancelled compaction leaves the current view in
            force.
        """
        window = await self.policy.learn_window(llm)  # /compact may come before any turn asked
        limit = self.policy.limit(llm)
        # Measuring a view builds its whole transcript: CPU work for a worker thread, not the event
        # loop.
        plan = _Plan(self, messages, active_ts, fixed_tokens, target=int(limit * TARGET_FRACTION))
        planned, before, after = await trio.to_thread.run_sync(
            plan.stages_1_2, current, window, reason, force
        )
        # Nothing old enough to evict or archive: the view in force, and what only the active turn
        # can give.
        view: ViewState = planned if planned is not None else _unchanged(current, reason)
        if (
            planned is not None
            and after > plan.target
            and trio.current_time() >= self.cooldown_until
        ):
            summary = await self._summarize(llm, view, meter)  # Stage 3: a model summary.
            if summary is not None:
                view = msgspec.structs.replace(view, archives=(summary,), stages=(*view.stages, 3))
                after = await trio.to_thread.run_sync(plan.measure, view)
        if after > plan.target:
            view, after = await trio.to_thread.run_sync(plan.stage_4, view, after, True)
        goal = min(plan.target, before // 2) if force and planned is None else plan.target
        if after > goal:
            view, after = await trio.to_thread.run_sync(plan.shorten, view, after, goal, limit)
        # the summary (or last archive) goes only when the request cannot fit with it
        if after > limit:
            view, after = await trio.to_thread.run_sync(plan.stage_4, view, after, False)
        if not view.stages:
            return None
        view = msgspec.structs.replace(view, tokens_before=before, tokens_after=after)
        # One insert: the view exists whole or not at all.
        self.store.add_view_state(messages[0].session_id, view.encode())
        log.info(
            "session %s compacted (%s): %d → %d tokens, stages %s",
            messages[0].session_id,
            reason,
            before,
            after,
            ",".join(map(str, view.stages)),
        )
        return view

    async def _summarize(
        self, llm: BaseLLM, view: ViewState, meter: Meter | None
    ) -> Archive | None:
        """Stage 3; None (and a cooldown) when the model call fails."""
        if not view.archives:
            return None
        text = "\n\n".join(a.text for a in view.archives)
        prompt = f"Condense this history of the conversation so far:\n\n{text}"
        try:
            request = await llm.request_from_turns(
                [LLMTurn("user", (TextBlock(prompt),))], system=SUMMARY_SYSTEM
            )
            with trio.fail_after(SUMMARY_TIMEOUT_S):
                response = await llm.generate(request, meter=meter)
        except (BackendError, BudgetExceeded, trio.TooSlowError) as exc:
            self.cooldown_until = trio.current_time() + SUMMARY_COOLDOWN_S
            log.warning("compaction summary failed (%s); the turn archive stands in", exc)
            return None
        summary = response.text.strip()
        if not summary:
            self.cooldown_until = trio.current_time() + SUMMARY_COOLDOWN_S
            return None
        return Archive(view.archives[0].first_turn, view.archives[-1].last_turn, summary, "summary")


class _Plan:
    """Stages 1, 2 and 4 of one compaction.

    Pure CPU work over immutable messages (run in a thread).
    """

    def __init__(
        self,
        owner: Compactor,
        messages: Sequence[Message],
        active_ts: float,
        fixed_tokens: float,
        *,
        target: int,
    ) -> None:
        self.owner = owner
        self.messages = messages
        self.fixed_tokens = fixed_tokens
        self.target = target
        self.groups = _turn_groups(messages)
        self.active = next(
            (i for i, (start, _) in enumerate(self.groups) if messages[start].root_ts >= active_ts),
            len(self.groups),
        )

    def measure(self, view: ViewState | None) -> int:
        """Calibrated tokens of the request under ``view``."""
        return self.owner.measure(view_turns(self.messages, view), self.fixed_tokens)

    def stages_1_2(
        self, current: ViewState | None, window: int, reason: str, force: bool
    ) -> tuple[ViewState | None, int, int]:
        """Pick the cut, evict before it (stage 1), archive before it if still over (stage 2).

        Returns:
            ``(view or None when nothing is old enough, tokens before, tokens after)``.
        """
        before = self.measure(current)
        keep_budget = window * KEEP_FRACTION
        if force:
            keep_budget = min(keep_budget, before * 0.5 / self.owner.calibration.ratio)
        cut_group = _cut(self.messages, self.groups, self.active, keep_budget)
        old_cut = current.archive_before if current is not None else None
        if cut_group == 0 or cut_group >= len(self.groups):
            return None, before, before
        cut_key = key(self.messages[self.groups[cut_group][0]])
        if old_cut is not None and cut_key <= old_cut:
            return None, before, before
        base = current if current is not None else ViewState()
        view = msgspec.structs.replace(
            base,
            evict_before=cut_key,
            retained={**base.retained, **_excerpts(self.messages, self.groups[cut_group][0])},
            stages=(1,),
            reason=reason,
        )
        after = self.measure(view)
        if after > self.target:
            view = self.archive(cut_group, view)
            after = self.measure(view)
        return view, before, after

    def stage_4(self, view: ViewState, after: int, keep_summary: bool) -> tuple[ViewState, int]:
        """Leave the oldest archives out until the request is under the target (or none is left).

        With ``keep_summary`` a model summary stays: it is the one stand-in for every archived turn,
        and the active turn can still give (:meth:`shorten`) before it has to go.
        """
        while after > self.target and view.archives:
            dropped = view.archives[0]
            if keep_summary and dropped.kind == "summary":
                break
            view = msgspec.structs.replace(
                view,
                archives=view.archives[1:],
                dropped_turns=view.dropped_turns + dropped.last_turn - dropped.first_turn + 1,
                stages=tuple(sorted({*view.stages, 4})),
            )
            after = self.measure(view)
        return view, after

    def shorten(self, view: ViewState, after: int, goal: int, limit: int) -> tuple[ViewState, int]:
        """Stage 5: shorten the active turn's tool results to their start and end, oldest first.

        A turn that alone outgrows the window has nothing old to give. Its older results go first,
        until the request is under ``goal``; the newest step's results (what the model is about to
        read) only while it is still over ``limit``.

        Returns:
            ``(view, tokens after)``; the view unchanged when no result is long enough to shorten.
        """
        start = (
            self.groups[self.active][0] if self.active < len(self.groups) else len(self.messages)
        )
        last_step = max(
            (i for i, m in enumerate(self.messages) if m.kind is not Kind.TOOL_RESULT), default=-1
        )
        shortened = dict(view.shortened)
        candidates = [
            (i > last_step, m)
            for i, m in enumerate(self.messages[start:], start)
            if m.kind is Kind.TOOL_RESULT and len(m.content) > SHORTEN_MIN_CHARS
        ]
        candidates.sort(key=lambda c: c[0])  # stable: older steps first, each in history order
        # A long turn shortens its results again, further, once every one of them had its first cut.
        for head, tail in SHORTEN_TIERS:
            for newest, msg in candidates:
                if after <= (limit if newest else goal):
                    break
                text = _shortened(msg.content, head, tail)
                if len(text) >= len(shortened.get(msg.id, msg.content)):
                    continue
                shortened[msg.id] = text
                view = msgspec.structs.replace(
                    view, shortened=dict(shortened), stages=tuple(sorted({*view.stages, 5}))
                )
                after = self.measure(view)
            if after <= goal:
                break
        return view, after

    def archive(self, cut_group: int, view: ViewState) -> ViewState:
        """Stage 2: turns between the previous archive cut and the new cut become archive lines."""
        start_group = 0
        if view.archive_before is not None:
            old: Key = view.archive_before
            start_group = next(
                (i for i, (s, _) in enumerate(self.groups) if key(self.messages[s]) >= old),
                cut_group,
            )
        numbers = _turn_numbers(self.messages, self.groups)
        lines: list[str] = []
        read, modified = list(view.files_read), list(view.files_modified)
        for i in range(start_group, cut_group):
            start, end = self.groups[i]
            line, r, m = _archive_line(numbers[i], self.messages[start:end])
            if line:
                lines.append(line)
            read += [p for p in r if p not in read]
            modified += [p for p in m if p not in modified]
        archives = view.archives
        if lines:
            first, last = numbers[start_group], numbers[cut_group - 1]
            archives = (*archives, Archive(first, last, "\n".join(lines)))
        cut_key = key(self.messages[self.groups[cut_group][0]])
        return msgspec.structs.replace(
            view,
            archive_before=cut_key,
            archives=archives,
            files_read=tuple(read[-50:]),
            files_modified=tuple(modified[-50:]),
            stages=(*view.stages, 2),
        )


def _turn_groups(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """(start, end) index ranges of the turns: runs of messages sharing ``root_ts``."""
    groups: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(messages) + 1):
        if i == len(messages) or messages[i].root_ts != messages[start].root_ts:
            groups.append((start, i))
            start = i
    return groups


def _turn_numbers(messages: Sequence[Message], groups: list[tuple[int, int]]) -> list[int]:
    """The number of each turn.

    User turns count 1, 2, …; a system notice shares the previous number.
    """
    numbers, n = [], 0
    for start, _ in groups:
        n += messages[start].role is Role.USER or n == 0
        numbers.append(n)
    return numbers


def _size(messages: Sequence[Message]) -> float:
    return (
        sum(
            len(m.content) + len(msgspec.json.encode(m.metadata.tool_arguments or {}))
            for m in messages
        )
        / 4
    )


def _cut(
    messages: Sequence[Message], groups: list[tuple[int, int]], active: int, budget: float
) -> int:
    """The first kept turn.

    The newest turns fill ``budget``; the active turn and later are always kept.
    """
    used = sum(_size(messages[s:e]) for s, e in groups[active:])
    cut = active
    while cut > 0:
        start, end = groups[cut - 1]
        size = _size(messages[start:end])
        if used + size > budget:
            break
        used += size
        cut -= 1
    return cut


def _excerpts(messages: Sequence[Message], end: int) -> dict[int, str]:
    """Head-and-tail excerpts of the long tool results among ``messages[:end]``."""
    out: dict[int, str] = {}
    for msg in messages[:end]:
        if msg.kind is Kind.TOOL_RESULT and len(msg.content) > LONG_RESULT_CHARS:
            text = msg.content
            out[msg.id] = f"{text[:EXCERPT_HEAD_CHARS]}\n[…]\n{text[-EXCERPT_TAIL_CHARS:]}"
    return out


def _unchanged(current: ViewState | None, reason: str) -> ViewState:
    """The view in force as the start of a compaction that found nothing old to cut."""
    return msgspec.structs.replace(current or ViewState(), stages=(), reason=reason)


def _shortened(text: str, head_chars: int, tail_chars: int) -> str:
    """A result's start and end around a note saying how much was cut.

    The note is :data:`~kesoku.vocab.view.SHORTENED`.
    """
    head, tail = text[:head_chars], text[-tail_chars:]
    return SHORTENED.format(
        head=head, tail=tail, cut=len(text) - len(head) - len(tail), chars=len(text)
    )


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= FIELD_CHARS else text[: FIELD_CHARS - 1] + "…"


def _archive_line(number: int, turn: Sequence[Message]) -> tuple[str, list[str], list[str]]:
    """``Turn N: intent=…; action=…; conclusion=…; files=…`` and the paths read and modified."""
    intent = " / ".join(_clip(m.content) for m in turn if m.role is Role.USER)
    tools: dict[str, int] = {}
    read: list[str] = []
    modified: list[str] = []
    for m in turn:
        if m.kind is Kind.TOOL_CALL and m.metadata.tool_name:
            name = m.metadata.tool_name
            tools[name] = tools.get(name, 0) + 1
            path = (m.metadata.tool_arguments or {}).get("path")
            if isinstance(path, str):
                (modified if name in WRITE_TOOLS else read if name in READ_TOOLS else []).append(
                    path
                )
    failed = sum(
        1
        for m in turn
        if m.kind is Kind.TOOL_RESULT and m.metadata.outcome not in (None, "completed")
    )
    answers = [
        m.content
        for m in turn
        if m.role is Role.ASSISTANT and m.kind is Kind.TEXT and m.content.strip()
    ]
    notices = [
        m.content for m in turn if m.role is Role.SYSTEM and "question" not in m.metadata.extra
    ]
    action = ", ".join(f"{name}×{count}" for name, count in tools.items()) or "none"
    if failed:
        action += f" ({failed} failed)"
    conclusion = _clip(answers[-1]) if answers else _clip(notices[-1]) if notices else "(no answer)"
    files = ", ".join(dict.fromkeys(modified + read)) or "none"
    line = (
        f"Turn {number}: intent={intent or '(none)'}; action={action}; "
        f"conclusion={conclusion}; files={files}"
    )
    return line, read, modified
