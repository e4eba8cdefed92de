"""The repeat guard: a turn's identical tool calls that keep returning the same are not run again.

Small models loop: asked a simple question, a 135M model made 28 identical ``list_skills()`` calls
until its context overflowed, and 50 identical failing ``grep`` calls until the step cap. A call is
identified by its tool name and its arguments as canonical JSON (keys sorted). Once one call has run
``max_identical`` times in a turn and every run returned the same text with the same outcome, the
next identical call is not run: its result says so and repeats, briefly, what the earlier runs
returned. A call whose result changed (a poll) runs again, and so does every call after a new call
or a changed result (an edit, then the tests again: the edit may have changed what the tests
return); a loop of calls that all keep returning the same is refused all the same. When the model
makes a refused call once more, it is stuck: the turn (or the subagent) ends as ``repeating``.

Used by the turn loop (kesoku.agent.turn) and by subagents (kesoku.agent.subagent), so both refuse
the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import msgspec

from kesoku.tools.output import MARKER, MARKER_PATTERN
from kesoku.vocab.model import Outcome

MAX_IDENTICAL_CALLS = 2
"""``agent.max_identical_calls``: runs of one identical call, returning the same each time, in a
turn."""
EXCERPT_CHARS = 200
"""How much of the earlier result a refusal quotes."""
_ANY_CUT = MARKER.format(cut="N")
_MARKER_TAIL = MARKER.format(cut="").split("bytes", 1)[1]
"""What every :data:`MARKER` holds, whatever the number (a plain search rules most results out)."""


class _Seen:
    __slots__ = ("digest", "epoch", "excerpt", "outcome", "refused", "runs", "told")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch  # the guard's epoch these counts belong to (older: they count as reset)
        self.runs = 0  # runs in a row that returned the same text and outcome
        self.digest = b""
        self.outcome = Outcome.COMPLETED
        self.excerpt = ""
        self.refused = False
        self.told = False  # the model has read a refusal of this call


class RepeatGuard:
    """One turn's record of the tool calls it ran.

    Args:
        max_identical: Runs allowed of one identical call that returns the same each time; the next
            identical call is refused. 0 turns the guard off.

    Attributes:
        stuck: The name of a call the model made again after it was refused (the turn should end),
            else None.
    """

    def __init__(self, max_identical: int = MAX_IDENTICAL_CALLS) -> None:
        self.max_identical = max_identical
        self.stuck: str | None = None
        self._seen: dict[bytes, _Seen] = {}
        # Something new resets every call's counts: a new epoch does it in O(1), not by a walk over
        # every call of the turn (which made a long turn's steps slower and slower).
        self._epoch = 0

    def refusals(self, calls: Sequence[tuple[str, Mapping[str, object]]]) -> list[str | None]:
        """The refusals of one step's calls (name, arguments).

        For each call, the result text if it must not run, else None.

        A refusal is remembered: the same call made again in a later step sets :attr:`stuck` (two
        identical calls in one step are both refused, but the model had not been told yet).
        """
        refused: list[_Seen] = []
        out = [self._refusal(name, arguments, refused) for name, arguments in calls]
        for seen in refused:
            seen.told = True
        return out

    def _current(self, key: bytes) -> _Seen | None:
        seen = self._seen.get(key)
        if seen is not None and seen.epoch != self._epoch:
            seen.epoch, seen.runs, seen.refused, seen.told = self._epoch, 0, False, False
        return seen

    def _refusal(
        self, name: str, arguments: Mapping[str, object], refused: list[_Seen]
    ) -> str | None:
        if self.max_identical <= 0:
            return None
        seen = self._current(call_key(name, arguments))
        if seen is None or seen.runs < self.max_identical:
            return None
        if seen.told:
            self.stuck = name
        seen.refused = True
        refused.append(seen)
        failed = "failed" if seen.outcome is not Outcome.COMPLETED else "returned"
        return (
            f"[repeated] Not run: this call ({name} with the same arguments) already ran "
            f"{_times(seen.runs)} in this turn and {failed} the same each time: {seen.excerpt} — "
            "running it again would give the same result. "
            "Use what it returned, try something different, or answer."
        )

    def record(
        self, name: str, arguments: Mapping[str, object], content: str, outcome: Outcome
    ) -> None:
        """Note a call that ran and what it returned."""
        if self.max_identical <= 0:
            return
        key = call_key(name, arguments)
        seen = self._current(key) or self._seen.setdefault(key, _Seen(self._epoch))
        # Two capped outputs that differ only in how much was cut (a listing that grew by a line)
        # are the same to the model: it reads the same head and tail.
        kept = MARKER_PATTERN.sub(_ANY_CUT, content) if _MARKER_TAIL in content else content
        hasher = hashlib.blake2b(f"{outcome}\0".encode(), digest_size=16)
        hasher.update(kept.encode(errors="replace"))  # a large output is not copied once more
        digest = hasher.digest()
        if digest == seen.digest:  # what it returned last time: a repeat, even after a reset
            seen.runs += 1
            return
        # Something new happened (a call not made before, or one whose result changed): it may have
        # changed what every other call returns (an edit, then the tests again), so they may run
        # again: a new epoch resets them all (their digests are kept).
        self._epoch += 1
        seen.epoch, seen.refused, seen.told = self._epoch, False, False
        seen.runs, seen.digest, seen.outcome = 1, digest, outcome
        seen.excerpt = _excerpt(content)


def call_key(name: str, arguments: Mapping[str, object]) -> bytes:
    """A call's identity: its tool name and its arguments as canonical JSON (keys sorted)."""
    try:
        canonical = msgspec.json.encode(arguments, order="sorted")
    except (TypeError, ValueError, OverflowError):  # arguments JSON cannot hold: fall back to repr
        canonical = repr(sorted(arguments.items(), key=lambda kv: str(kv[0]))).encode(
            errors="replace"
        )
    return name.encode(errors="replace") + b"\0" + canonical


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _excerpt(content: str) -> str:
    # The head first: flattening a large output whole cost more than the rest of a round trip. The
    # head's flattened words begin the whole's (its last word maybe cut short), so when they are
    # longer than the excerpt, the excerpt is theirs.
    head = content[: 4 * EXCERPT_CHARS]
    flat = " ".join(head.split())
    if len(flat) <= EXCERPT_CHARS and len(head) < len(content):
        flat = " ".join(content.split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1] + "…"
