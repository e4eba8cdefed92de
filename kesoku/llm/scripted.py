"""The scripted backend: replays a scenario of model steps instead of calling a model.

Tests, benchmarks and demos use it, and so does a user replaying a scenario (``[agent] llm =
"scripted"`` with ``[scripted] path = "scenario.yaml"``). It is chosen explicitly, never as a silent
fallback. Each model call (each attempt: a retry is a new call) takes the next step, so a retryable
error step followed by a normal step exercises the base's retries.

The scenario file (YAML)::

    model: demo                 # optional; shown in turn logs
    loop: false                 # optional; true: start again at step 1 when the steps run out
    steps:                      # one entry per model call, in order
      - text: "Hello!"                          # the answer in one chunk
      - thought: "The user wants the date."     # optional, streamed before the text
        signature: "c2lnbmF0dXJl"               # optional, base64: the thought's signature
        text: ["Let me ", "check."]             # or chunks
        tool_calls:
          - {name: shell, arguments: {command: date}, id: call_1}   # id optional: generated, unique
        usage: {input_tokens: 120, output_tokens: 30}
        stop: max_tokens                         # optional: end, max_tokens, malformed, other, none
        delay_s: 0.2                             # sleep before each event of the step
      - error: {message: "overloaded", status: 529, retryable: true, retry_after_s: 1}
      - events:                                  # explicit order (instead of the keys above)
          - {thought: "...", signature: "c2ln"}
          - {sleep_s: 1.0}
          - {text: "..."}
          - {tool_call: {name: x, arguments: {}}}
          - {usage: {input_tokens: 1, output_tokens: 2}}
          - {error: {message: "dropped", retryable: true}}   # mid-stream error

Without ``events`` a step streams, in this order: the thought, the text chunks, the tool calls, the
usage, then the error if any (an error after other events is a mid-stream failure: the base never
retries it, since a retry would repeat what was already streamed). A step that raises no error ends
with its ``stop`` reason (``end`` unless given; ``none`` sends none, like a server that answered
with an empty body). Unknown keys are errors, reported as one line naming the file and key path:
``scenario.yaml: steps[2].tool_calls[0].name: expected str``.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import trio
import yaml

from kesoku.config.explain import unknown_key
from kesoku.llm.base import MAX_RETRIES, STALL_TIMEOUT_S, BaseLLM
from kesoku.vocab.errors import BackendError, ConfigError
from kesoku.vocab.ir import (
    LLMEvent,
    LLMRequest,
    StopEvent,
    StopReason,
    TextDelta,
    ThoughtDelta,
    ToolCallBlock,
    ToolCallEvent,
    UsageEvent,
)
from kesoku.vocab.model import Usage

NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0)]


class _Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Shared options: a misspelt key in a scenario is an error, not a silently ignored line."""


class StepUsage(_Strict, frozen=True, kw_only=True):
    """Token counts a step reports."""

    input_tokens: NonNegativeInt = 0
    output_tokens: NonNegativeInt = 0
    cached_tokens: NonNegativeInt = 0
    thinking_tokens: NonNegativeInt = 0

    def to_usage(self) -> Usage:
        """Return the same counts as the :class:`Usage` every backend reports."""
        return Usage(**msgspec.structs.asdict(self))


class StepToolCall(_Strict, frozen=True, kw_only=True):
    """A tool call the model makes.

    Attributes:
        name: The tool's name.
        arguments: Its arguments.
        id: The call id; None: a generated id, unique across processes.
        signature: Gemini's thought signature on the call part, base64 in YAML.
    """

    name: str
    arguments: dict[str, Any] = {}
    id: str | None = None
    signature: bytes | None = None


class StepError(_Strict, frozen=True, kw_only=True):
    """A failed model call, raised as a :class:`BackendError` with these fields."""

    message: str
    status: int | None = None
    retryable: bool = False
    retry_after_s: NonNegativeSeconds | None = None

    def to_error(self) -> BackendError:
        """The error the backend raises."""
        return BackendError(
            f"scripted: {self.message}",
            retryable=self.retryable,
            status=self.status,
            retry_after_s=self.retry_after_s,
            auth=self.status in (401, 403),
        )


class StepEvent(_Strict, frozen=True, kw_only=True):
    """One event of an explicit ``events`` list: exactly one of its keys is set."""

    text: str | None = None
    thought: str | None = None
    signature: bytes | None = None
    tool_call: StepToolCall | None = None
    usage: StepUsage | None = None
    error: StepError | None = None
    sleep_s: NonNegativeSeconds | None = None

    def __post_init__(self) -> None:
        kinds = [
            k
            for k in ("text", "thought", "tool_call", "usage", "error", "sleep_s")
            if getattr(self, k) is not None
        ]
        if self.signature is not None and "thought" not in kinds:
            kinds.append("thought")
        if len(kinds) != 1:
            raise ValueError(
                "an event has exactly one of text, thought, tool_call, usage, error, sleep_s; "
                f"got {' and '.join(kinds) or 'none'}"
            )


class Step(_Strict, frozen=True, kw_only=True):
    """One model call of a script.

    Attributes:
        text: The answer, in one chunk or a sequence of chunks.
        thought: Reasoning streamed before the text.
        signature: The thought's signature (base64 in YAML).
        tool_calls: Tool calls streamed after the text.
        usage: Token counts streamed after the tool calls.
        error: The call fails after the events above (at once when there are none).
        events: An explicit order instead of the keys above (not combined with them).
        delay_s: A pause before each event of the step.
        stop: The stop reason sent after the events (:class:`~kesoku.vocab.ir.StopReason` values),
            or ``none`` for none.
    """

    text: str | tuple[str, ...] = ()
    thought: str | None = None
    signature: bytes | None = None
    tool_calls: tuple[StepToolCall, ...] = ()
    usage: StepUsage | None = None
    error: StepError | None = None
    events: tuple[StepEvent, ...] | None = None
    delay_s: NonNegativeSeconds = 0.0
    stop: Literal["end", "max_tokens", "malformed", "other", "none"] = "end"

    def __post_init__(self) -> None:
        if self.events is not None:
            beside = [
                k
                for k in ("text", "thought", "signature", "tool_calls", "usage", "error")
                if getattr(self, k)
            ]
            if beside:
                raise ValueError(
                    f"events: an explicit order: put {', '.join(beside)} inside it, not beside it"
                )

    def to_events(self) -> tuple[StepEvent, ...]:
        """Return the step as an explicit list of events, in the order they stream."""
        if self.events is not None:
            return self.events
        out: list[StepEvent] = []
        if self.thought is not None or self.signature is not None:
            out.append(StepEvent(thought=self.thought or "", signature=self.signature))
        chunks = (self.text,) if isinstance(self.text, str) else self.text
        out += [StepEvent(text=chunk) for chunk in chunks]
        out += [StepEvent(tool_call=call) for call in self.tool_calls]
        if self.usage is not None:
            out.append(StepEvent(usage=self.usage))
        if self.error is not None:
            out.append(StepEvent(error=self.error))
        return tuple(out)


class Script(_Strict, frozen=True, kw_only=True):
    """A scenario file: the steps and how to replay them."""

    model: str | None = None
    loop: bool = False
    steps: tuple[Step, ...]


Responder = Callable[[LLMRequest], Step | Mapping[str, Any]]
"""Decides a step from the request: ``lambda request: Step(text="done")``."""


SCRIPTED_WINDOW = 128_000
"""The context window a scripted model reports unless told otherwise."""


class ScriptedLLM(BaseLLM):
    """A backend that replays steps (or asks a responder) instead of calling a model.

    Args:
        steps: The steps, as :class:`Step` or as mappings in the YAML form; ignored with a
            responder.
        responder: Called with each request to decide the step (tests whose answer depends on the
            request, e.g. "call the tool unless the last turn holds its result").
        model: The model name shown in turn logs.
        loop: Start again at the first step when the steps run out.
        record_requests: Keep every request in :attr:`requests`.
        max_retries: As for :class:`BaseLLM`.
        stall_timeout_s: As for :class:`BaseLLM`.
        output_limit: As :attr:`BaseLLM.output_limit` (what a real backend would send as
            max_tokens).
        max_output_limit: As :attr:`BaseLLM.max_output_limit`.
        context_window: The window this "server" reports, in tokens (None: it reports none, like
            a server Kesoku cannot ask). Large by default, so a script is never compacted unasked.

    Attributes:
        requests: The requests received, one per model call attempt.
        source: The scenario file, or ``script`` for steps given in Python.

    Raises:
        ConfigError: A step given as a mapping is invalid (``script: steps[1].text: ...``).
        ValueError: Both steps and a responder are given.
    """

    provider: ClassVar[str] = "scripted"

    def __init__(
        self,
        steps: Sequence[Step | Mapping[str, Any]] | None = None,
        *,
        responder: Responder | None = None,
        model: str = "scripted",
        loop: bool = False,
        record_requests: bool = True,
        max_retries: int = MAX_RETRIES,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        output_limit: int | None = None,
        max_output_limit: int | None = None,
        context_window: int | None = SCRIPTED_WINDOW,
    ) -> None:
        super().__init__(model, max_retries=max_retries, stall_timeout_s=stall_timeout_s)
        self.output_limit = output_limit
        self.max_output_limit = max_output_limit
        # Known from the start, as a configured window is: asking costs no checkpoint.
        self.reported_window, self._window_asked = context_window, True
        if steps is not None and responder is not None:
            raise ValueError("give steps or a responder, not both")
        self.source = "script"
        self.steps: tuple[Step, ...] = _convert_steps(steps or (), self.source)
        self.responder = responder
        self.loop = loop
        self.record_requests = record_requests
        self.requests: list[LLMRequest] = []
        self._next_step = 0
        self._call_counter = 0
        # Generated ids carry a per-instance prefix: a restarted process replaying the same script
        # must not reuse the ids of calls already in the history.
        self._id_prefix = uuid.uuid4().hex[:8]

    @classmethod
    def from_yaml(
        cls, path: str | os.PathLike[str], *, record_requests: bool = True
    ) -> ScriptedLLM:
        """Load a scenario file (blocking file I/O: call it at startup, not from the event loop).

        Raises:
            ConfigError: The file is missing, is not YAML, or a key is wrong (one line, file and key
                path).
        """
        script = load_script(path)
        llm = cls(
            script.steps,
            model=script.model or "scripted",
            loop=script.loop,
            record_requests=record_requests,
        )
        llm.source = os.fspath(path)
        return llm

    def _build_native_input(self, request: LLMRequest) -> LLMRequest:
        return request

    def _call(self, native: LLMRequest) -> AsyncIterator[LLMEvent]:
        step = self._take_step(native)
        return self._play(step)

    def _parse(self, raw: LLMEvent) -> Iterable[LLMEvent]:
        return (raw,)

    def _take_step(self, request: LLMRequest) -> Step:
        if self.record_requests:
            self.requests.append(request)
        if self.responder is not None:
            return _convert_steps([self.responder(request)], "responder")[0]
        if self._next_step >= len(self.steps):
            if not self.loop or not self.steps:
                n = len(self.steps)
                raise BackendError(
                    f"scripted: {self.source} has {n} step{'' if n == 1 else 's'} and all were used"
                )
            self._next_step = 0
        step = self.steps[self._next_step]
        self._next_step += 1
        return step

    async def _play(self, step: Step) -> AsyncIterator[LLMEvent]:
        for event in step.to_events():
            if step.delay_s:
                await trio.sleep(step.delay_s)
            else:
                await trio.lowlevel.checkpoint()
            if event.sleep_s is not None:
                await trio.sleep(event.sleep_s)
            elif event.error is not None:
                raise event.error.to_error()
            elif event.text is not None:
                yield TextDelta(event.text)
            elif event.thought is not None or event.signature is not None:
                yield ThoughtDelta(event.thought or "", event.signature)
            elif event.tool_call is not None:
                yield ToolCallEvent(self._tool_call(event.tool_call))
            elif event.usage is not None:
                yield UsageEvent(event.usage.to_usage())
        if step.stop != "none":
            yield StopEvent(StopReason(step.stop), step.stop)

    def _tool_call(self, call: StepToolCall) -> ToolCallBlock:
        if call.id is not None:
            call_id = call.id
        else:
            self._call_counter += 1
            call_id = f"call_{self._id_prefix}_{self._call_counter}"
        return ToolCallBlock(call_id, call.name, dict(call.arguments), call.signature)


def load_script(path: str | os.PathLike[str]) -> Script:
    """Read and validate a scenario file.

    Raises:
        ConfigError: One line naming the file and what is wrong.
    """
    name = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the scenario: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        raise ConfigError(
            f"{where}: invalid YAML: {getattr(exc, 'problem', None) or exc}"
        ) from None
    script: Script = _convert(data, Script, name)
    if not script.steps:
        raise ConfigError(f"{name}: steps: empty; a scenario needs at least one step")
    return script


def _convert_steps(steps: Iterable[Step | Mapping[str, Any]], name: str) -> tuple[Step, ...]:
    return tuple(
        s if isinstance(s, Step) else _convert(s, Step, name, prefix=f"steps[{i}]")
        for i, s in enumerate(steps)
    )


def _convert(data: Any, kind: type[Any], name: str, prefix: str = "") -> Any:
    try:
        return msgspec.convert(data, kind)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{name}: {_explain(str(exc), prefix)}") from None


def _known_keys(path: str) -> list[str]:
    """The keys allowed at ``path`` (``steps[2].tool_calls[0]``), from its last named part."""
    parent = re.sub(r"\[\d+\]", "", path).rpartition(".")[2]
    kinds: dict[str, Any] = {
        "": Script,
        "steps": Step,
        "tool_calls": StepToolCall,
        "tool_call": StepToolCall,
        "usage": StepUsage,
        "error": StepError,
        "events": StepEvent,
    }
    return [f.encode_name for f in msgspec.structs.fields(kinds.get(parent, Step))]


def _explain(message: str, prefix: str) -> str:
    """Rewrite a msgspec error message as a key path and the problem.

    ``Expected `str`, got `int` - at `$.steps[2].name``` becomes ``steps[2].name: ...``.
    """
    m = re.match(r"(?s)(.*?)(?: - at `\$(.*)`)?$", message)
    text, path = (m.group(1), m.group(2) or "") if m else (message, "")
    path = path.lstrip(".")
    if prefix:
        path = prefix + ("" if not path or path.startswith("[") else ".") + path
    text = text.replace("`", "")
    text = text[:1].lower() + text[1:]
    unknown = re.match(r"object contains unknown field (\S+)", text)
    if unknown:
        field = unknown.group(1)
        known = _known_keys(path)
        return f"{path + '.' if path else ''}{field}: {unknown_key(field, known)}"
    return f"{path}: {text}" if path else text
