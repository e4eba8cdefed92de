"""What a tool is to the runtime: a name, a JSON schema, a timeout and an async ``run``.

The runtime (kesoku.agent.turn) runs a model step's tool calls as one concurrent batch in a shielded
scope; each call gets its own ``timeout_s``. A tool reports failure the model should read by raising
:class:`~kesoku.vocab.errors.ToolError`; any other exception is a bug, reported to the model as a
failed result and logged with its traceback.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from kesoku.vocab.ir import ToolSpec
from kesoku.vocab.model import Session, TaintSource
from kesoku.vocab.text import valid_data, valid_text

_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s")
"""Where a description's first sentence ends (a line break inside it is not an end)."""
DEFAULT_TOOL_TIMEOUT_S = 600.0
"""How long one tool call may run before its result is ``timed_out``."""


@dataclass(frozen=True, slots=True)
class Approval:
    """The user's answer to a question a tool asked.

    Attributes:
        allowed: True only when the user chose Allow.
        note: How the answer came: ``allowed by Ana``, ``denied by Ana``, ``no answer within 300
            s``, ``the turn was stopped``, ``no one can be asked here``.
    """

    allowed: bool
    note: str


class Guard(Protocol):
    """A session's trust state as tools see it: its taint sources, and a way to ask the user.

    The runtime's implementation is :class:`kesoku.agent.guard.SessionGuard`.
    """

    @property
    def tainted(self) -> bool:
        """True once content from outside the workspace's trust entered the session."""
        ...

    def taint_sources(self) -> tuple[TaintSource, ...]:
        """The session's taint sources, oldest first."""
        ...

    def add_taint(self, kind: str, label: str) -> None:
        """Record a taint source (deduplicated by kind and label).

        Safe to call from a worker thread.
        """
        ...

    async def confirm(self, question: str) -> Approval:
        """Ask the user to Allow or Deny ``question`` and wait for the answer.

        Cancellation:
            The question is withdrawn (recorded as dismissed) and Cancelled propagates.
        """
        ...


class TaintSources:
    """A session's taint sources: ordered and deduplicated by (kind, label).

    Safe to add to from threads. The taint half of every :class:`Guard`; a subclass hears of each
    new source through :meth:`_added`.

    Args:
        sources: Sources recorded before (read back from the store).
    """

    def __init__(self, sources: Sequence[TaintSource] = ()) -> None:
        self._sources = list(sources)
        self._lock = threading.Lock()

    @property
    def tainted(self) -> bool:
        """True once a taint source was recorded."""
        return bool(self._sources)

    def taint_sources(self) -> tuple[TaintSource, ...]:
        """The taint sources recorded, oldest first."""
        with self._lock:
            return tuple(self._sources)

    def add_taint(self, kind: str, label: str) -> None:
        """Record a taint source unless it is already known."""
        source = TaintSource(kind, label)
        with self._lock:
            if source not in self._sources:
                self._sources.append(source)
                self._added(source)

    def _added(self, source: TaintSource) -> None:
        """A new source was recorded (called under the lock)."""


class StaticGuard(TaintSources):
    """A guard for tools run outside a session (tests, ``kesoku`` commands).

    It answers every question alike.

    Args:
        allow: The answer to every question; None: nobody can be asked, so every question is
            denied.
        sources: Taint sources to start with.
    """

    def __init__(self, allow: bool | None = None, sources: tuple[TaintSource, ...] = ()) -> None:
        super().__init__(sources)
        self.allow = allow
        self.questions: list[str] = []
        """Every question asked, in order."""

    async def confirm(self, question: str) -> Approval:
        """Record the question and give the fixed answer."""
        self.questions.append(question)
        if self.allow is None:
            return Approval(False, "no one can be asked here")
        return Approval(self.allow, "allowed" if self.allow else "denied")


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a running tool knows about its call.

    Attributes:
        session: The session the call belongs to.
        cwd: The working directory: the session workspace, or ``agent.project_dir``.
        call_id: The provider's id of the call.
        guard: The session's taint sources and the way to ask its user (a :class:`StaticGuard` that
            denies every question when the tool runs outside a session).
        deadline: The scope holding the call's ``timeout_s`` (set by the runtime), moved on by the
            time :meth:`confirm` waits for the user.
        max_output_bytes: The most bytes of text the result may hold for the session's model (a
            share of its context window); None: only the tool's own cap.
    """

    session: Session
    cwd: Path
    call_id: str
    guard: Guard = field(default_factory=StaticGuard)
    deadline: trio.CancelScope | None = None
    max_output_bytes: int | None = None

    def output_cap(self, own_bytes: int) -> int:
        """The cap of this call's output.

        The smaller of the tool's own ``own_bytes`` and the model's share.
        """
        return own_bytes if self.max_output_bytes is None else min(own_bytes, self.max_output_bytes)

    async def confirm(self, question: str) -> Approval:
        """Ask the user (through :attr:`guard`).

        The wait does not count against the tool's ``timeout_s``.

        Args:
            question: What will happen and why it needs consent, ending with "Allow?".

        Returns:
            The answer.

        Cancellation:
            The question is withdrawn and Cancelled propagates.
        """
        scope = self.deadline
        if scope is None:
            return await self.guard.confirm(question)
        # The call's deadline is lifted while the user thinks (the question has its own timeout) and
        # put back afterwards, moved on by the time the answer took.
        started, saved = trio.current_time(), scope.deadline
        scope.deadline = math.inf
        try:
            return await self.guard.confirm(question)
        finally:
            scope.deadline = saved + (trio.current_time() - started)


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model can call.

    Attributes:
        name: Its name as the model sees it.
        description: What it does and when to use it; the first line is the system prompt snippet.
        parameters: A JSON Schema object for its arguments.
        run: ``async (arguments, ctx) -> str``: the result text the model reads.
        timeout_s: Longest run before the call's outcome is ``timed_out``.

    Cancellation:
        ``run`` is cancelled only by its timeout or by a forced stop (the outcome is then
        ``timed_out`` or ``killed``); a tool that starts processes must kill them when cancelled.
    """

    name: str
    description: str
    run: Callable[[Mapping[str, Any], ToolContext], Awaitable[str]]
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S
    # Built once: requests carry the same ToolSpec objects from one model call to the next, so the
    # turn log and the backends can tell by identity that the tools did not change.
    _spec: ToolSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # An MCP server's description and schema are JSON from outside: made valid UTF-8 here, once,
        # since they go into every request, the system prompt and the turn log (kesoku.vocab.text).
        object.__setattr__(self, "description", valid_text(self.description))
        object.__setattr__(self, "parameters", valid_data(self.parameters))
        object.__setattr__(self, "_spec", ToolSpec(self.name, self.description, self.parameters))

    @property
    def spec(self) -> ToolSpec:
        """The tool as the model sees it (the same object on every call)."""
        return self._spec

    @property
    def snippet(self) -> str:
        """One line for the system prompt: the name and the first sentence of the description."""
        paragraph = " ".join(self.description.strip().split("\n\n")[0].split())
        return f"{self.name}: {_FIRST_SENTENCE.split(paragraph, maxsplit=1)[0]}"
