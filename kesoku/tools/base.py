"""What a tool is to the runtime: a name, a JSON schema, a timeout and an async ``run``.

The runtime (kesoku.turn) runs a model step's tool calls as one concurrent batch in a shielded scope;
each call gets its own ``timeout_s``. A tool reports failure the model should read by raising
:class:`~kesoku.errors.ToolError`; any other exception is a bug, reported to the model as a failed
result and logged with its traceback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kesoku.llm.ir import ToolSpec
from kesoku.model import Session

DEFAULT_TOOL_TIMEOUT_S = 600.0
"""How long one tool call may run before its result is ``timed_out``."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a running tool knows about its call.

    Attributes:
        session: The session the call belongs to.
        cwd: The working directory: the session workspace, or ``agent.project_dir``.
        call_id: The provider's id of the call.
    """

    session: Session
    cwd: Path
    call_id: str


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

    @property
    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(self.name, self.description, self.parameters)

    @property
    def snippet(self) -> str:
        """One line for the system prompt: the name and the first line of the description."""
        first = self.description.strip().splitlines()[0] if self.description.strip() else ""
        return f"{self.name}: {first}"
