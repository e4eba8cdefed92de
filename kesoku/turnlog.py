"""Every model call written as YAML: ``sessions/<session_id>/llm-turn-{idx}.log.yaml`` (DESIGN §11).

A turn log holds what was sent and what came back, so a bad answer can be read exactly as the model
saw it::

    metadata:     time (unix s), iso_time, session_id, idx, provider, model, duration_s, error
    request:      system prompt, turns with every block (bytes as base64; large attachments as
                  "<N bytes>": the file is at the block's path)
    tools:        name, description, parameters (JSON Schema with the types)
    response:     text, thoughts, thought_signature, tool_calls, usage (null when the call failed
                  before any event)

Indexes come from the files in the folder, so they continue across restarts: the first call in an
empty folder is 1, then the highest index + 1. A file is reserved with ``O_CREAT | O_EXCL`` before
it is written, so two writers (threads or processes) never share an index; a per-folder cache of the
next index keeps a long session from rescanning its folder on every call.

:func:`write_turn_log` is synchronous (dumping a long history takes milliseconds);
:class:`TurnLogWriter` runs it in a worker thread so the event loop never waits for a dump, and its
:class:`TurnLogRenderer` reuses the YAML of turns it already wrote, so a log costs about its new turns.
"""

from __future__ import annotations

import datetime
import logging
import operator
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec
import trio
import yaml

from kesoku.llm.ir import DocumentBlock, ImageBlock, LLMRequest, LLMResponse, LLMTurn, ToolSpec
from kesoku.transcript import shared_prefix

logger = logging.getLogger(__name__)

INLINE_ATTACHMENT_MAX_BYTES = 1024
"""Attachment data up to this size is written as base64; larger data as ``<N bytes>``."""
DRAIN_TIMEOUT_S = 5.0
"""Longest a cancelled :meth:`TurnLogWriter.serve` spends writing what was already queued."""
WRITER_BUFFER = 64
"""Entries queued before :meth:`TurnLogWriter.submit` waits: a burst from many sessions fits, and each
entry holds a whole request, so the bound keeps memory small."""
_IDX_CACHE_FOLDERS = 1024
"""Folders whose next index is remembered (least recently used dropped first)."""
_RENDER_CACHE_SESSIONS = 64
"""Sessions whose rendered turns a :class:`TurnLogRenderer` keeps."""
_RESERVE_ATTEMPTS = 1000
"""Indexes tried before giving up; only reached if something keeps creating files in the folder."""

_NAME = re.compile(r"llm-turn-([0-9]+)\.log\.yaml")

try:  # libyaml's emitter: several times faster than the pure-Python one
    from yaml import CSafeDumper as _BaseDumper
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeDumper as _BaseDumper  # type: ignore[assignment]


class _Dumper(_BaseDumper):
    """Block style, with multi-line strings as ``|`` literal blocks, and no ``&id001`` anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        # A value that appears twice is written twice: a reader should not have to chase anchors.
        return True


def _represent_str(dumper: _Dumper, value: str) -> yaml.ScalarNode:
    # PyYAML falls back to a quoted scalar by itself when a literal block cannot hold the text.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _represent_str)


class TurnLogEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One model call to log.

    Attributes:
        folder: The session's folder (``sessions/<session_id>``); created when missing.
        session_id: The session.
        provider: The backend (``gemini``, ``scripted``, ...).
        model: The model id.
        started_at: When the call started, UNIX seconds.
        duration_s: How long it took.
        request: Exactly what was sent.
        response: What came back (what was assembled before a failure), or None.
        error: Why the call failed, when it did.
    """

    folder: str
    session_id: str
    provider: str
    model: str
    started_at: float
    duration_s: float
    request: LLMRequest
    response: LLMResponse | None
    error: str | None = None


def write_turn_log(entry: TurnLogEntry, renderer: TurnLogRenderer | None = None) -> Path:
    """Write one turn log under the next free index of its folder (blocking: a worker thread's job).

    Args:
        entry: The call to log.
        renderer: Keeps the YAML of turns already written for a session, so the next log of a growing
            turn renders only its new turns; None renders everything.

    Returns:
        The file written.

    Raises:
        OSError: The folder or file cannot be created or written (no partial file is left behind).
    """
    # The large part first: reserving an index only once there is something to write.
    body = (renderer or TurnLogRenderer()).body(entry)
    folder = Path(entry.folder)
    folder.mkdir(parents=True, exist_ok=True)
    idx, fd = _reserve(folder)
    path = folder / f"llm-turn-{idx}.log.yaml"
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_dump({"metadata": _metadata_doc(entry, idx)}))
            f.write(body)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


class TurnLogWriter:
    """Writes turn logs in a worker thread, one at a time, in the order they were submitted.

    Args:
        buffer: Entries queued before :meth:`submit` waits (:data:`WRITER_BUFFER`).

    Attributes:
        written: Logs written.
        failed: Logs that could not be written (logged with ``logging``; never raised).
        dropped: Entries submitted after :meth:`serve` stopped, or left unwritten when its drain
            timed out.
    """

    def __init__(self, *, buffer: int = WRITER_BUFFER) -> None:
        self._send, self._receive = trio.open_memory_channel[TurnLogEntry](buffer)
        self._state = "new"
        self._renderer = TurnLogRenderer()  # used by one write at a time: writes are sequential
        self.written = 0
        self.failed = 0
        self.dropped = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write submitted entries until cancelled.

        Raises:
            RuntimeError: ``serve`` already ran on this writer.

        Cancellation:
            Entries already queued are written first (shielded, at most :data:`DRAIN_TIMEOUT_S`), then
            ``Cancelled`` propagates. Later submissions are dropped and counted.
        """
        if self._state != "new":
            raise RuntimeError("TurnLogWriter.serve runs once per writer")
        self._state = "serving"
        task_status.started()
        taken: TurnLogEntry | None = None  # received but not yet handed to a thread
        try:
            async for entry in self._receive:
                taken = entry
                # Not abandoned on cancel: once a thread runs the write, we wait for it and count it.
                await self._write(entry, abandon_on_cancel=False)
                taken = None
        finally:
            self._state = "stopped"
            self._send.close()  # submitters blocked on a full buffer get ClosedResourceError: a drop
            # Shielded: queued entries are calls that happened, and their logs explain the last turns
            # before a shutdown. Bounded, abandoning a stuck write, so a hung disk cannot hold shutdown.
            with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_TIMEOUT_S):
                if taken is not None:
                    await self._write(taken, abandon_on_cancel=True)
                async for entry in self._receive:
                    await self._write(entry, abandon_on_cancel=True)
            self.dropped += self._discard_queued()

    async def submit(self, entry: TurnLogEntry) -> None:
        """Queue an entry for writing; waits only while the buffer is full (backpressure).

        Raises:
            RuntimeError: :meth:`serve` has not started: nothing would ever write the entry.

        Cancellation:
            With room in the buffer the entry is queued without a checkpoint, so a turn whose scope
            was just cancelled (an interruption) still logs the call it cut. Cancelled while waiting
            for room, the entry is not queued.
        """
        if self._state == "new":
            raise RuntimeError("TurnLogWriter.submit before serve: start serve in the daemon's nursery first")
        try:
            try:
                self._send.send_nowait(entry)
            except trio.WouldBlock:
                await self._send.send(entry)
        except trio.ClosedResourceError:  # serve has stopped (perhaps while we waited for room)
            self.dropped += 1
            logger.warning("turn log of session %s dropped: the turn log writer has stopped", entry.session_id)

    async def _write(self, entry: TurnLogEntry, *, abandon_on_cancel: bool) -> None:
        try:
            await trio.to_thread.run_sync(write_turn_log, entry, self._renderer, abandon_on_cancel=abandon_on_cancel)
        except Exception as exc:  # disk full, a folder that is a file, an argument YAML cannot hold
            self.failed += 1
            logger.error("turn log of session %s not written: %s: %s", entry.session_id, type(exc).__name__, exc)
        else:
            self.written += 1

    def _discard_queued(self) -> int:
        count = 0
        while True:
            try:
                self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                return count
            count += 1


# -- the index ----------------------------------------------------------------------------------------

_next_idx: OrderedDict[str, int] = OrderedDict()
_next_idx_lock = threading.Lock()


def _reserve(folder: Path) -> tuple[int, int]:
    """Create the next free ``llm-turn-{idx}.log.yaml`` exclusively; return its index and descriptor."""
    key = os.path.abspath(folder)
    with _next_idx_lock:
        idx = _next_idx.pop(key, None)
    if idx is None:
        idx = _scan(folder)
    for _ in range(_RESERVE_ATTEMPTS):
        try:
            fd = os.open(folder / f"llm-turn-{idx}.log.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            # Another writer (thread or process) got there first: it may be far ahead, so look again.
            idx = max(idx + 1, _scan(folder))
            continue
        with _next_idx_lock:
            _next_idx[key] = max(idx + 1, _next_idx.get(key, 0))
            _next_idx.move_to_end(key)
            while len(_next_idx) > _IDX_CACHE_FOLDERS:
                _next_idx.popitem(last=False)
        return idx, fd
    raise FileExistsError(f"{folder}: no free turn log index after {_RESERVE_ATTEMPTS} attempts")


def _scan(folder: Path) -> int:
    """The highest index in the folder + 1 (1 for a folder without turn logs)."""
    highest = 0
    with os.scandir(folder) as entries:
        for item in entries:
            if m := _NAME.fullmatch(item.name):
                highest = max(highest, int(m[1]))
    return highest + 1


# -- the document -------------------------------------------------------------------------------------


def _dump(doc: Any) -> str:
    text: str = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)
    return text


def _metadata_doc(entry: TurnLogEntry, idx: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "time": entry.started_at,
        "iso_time": datetime.datetime.fromtimestamp(entry.started_at, tz=datetime.UTC).isoformat(),
        "session_id": entry.session_id,
        "idx": idx,
        "provider": entry.provider,
        "model": entry.model,
        "duration_s": round(entry.duration_s, 6),
    }
    if entry.error is not None:
        doc["error"] = entry.error
    return doc


def _turn_doc(turn: LLMTurn) -> dict[str, Any]:
    sizes = [len(b.data) if isinstance(b, ImageBlock | DocumentBlock) else 0 for b in turn.blocks]
    if max(sizes, default=0) <= INLINE_ATTACHMENT_MAX_BYTES:
        blocks: Any = msgspec.to_builtins(turn.blocks)  # bytes → base64, enums → their values
    else:
        # Large data is left out before encoding: base64 of a photo would cost more than the whole log.
        kept = [
            msgspec.structs.replace(b, data=b"") if size > INLINE_ATTACHMENT_MAX_BYTES else b
            for b, size in zip(turn.blocks, sizes, strict=True)
        ]
        blocks = msgspec.to_builtins(kept)
        for doc, size in zip(blocks, sizes, strict=True):
            if size > INLINE_ATTACHMENT_MAX_BYTES:
                doc["data"] = f"<{size} bytes>"
    return {"role": turn.role, "blocks": blocks}


def _indent(text: str) -> str:
    """Indent every line by two spaces (a standalone YAML node placed under a key keeps its meaning)."""
    return "".join("  " + line if line.strip() else line for line in text.splitlines(keepends=True))


class _SessionCache:
    """What the last log of one session rendered: its turns (by identity), their YAML, the system prompt."""

    __slots__ = ("system", "system_text", "texts", "tools", "tools_text", "turns")

    def __init__(self) -> None:
        self.turns: tuple[LLMTurn, ...] = ()
        self.texts: list[str] = []
        self.system: str | None = None
        self.system_text = ""
        self.tools: tuple[ToolSpec, ...] | None = None
        self.tools_text = ""


class TurnLogRenderer:
    """Renders turn log bodies, reusing the YAML of what the previous log of the session already held.

    A turn of many model calls sends a history that grows by a step each call; the runtime keeps the
    earlier turns as the same objects (kesoku.transcript.Transcript), so the longest common prefix of
    turns (by identity), the system prompt and the tools are reused as text and only the new turns are
    dumped. The most recent :data:`_RENDER_CACHE_SESSIONS` sessions are kept. Not thread-safe:
    :class:`TurnLogWriter` uses it from one write at a time.
    """

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _SessionCache] = OrderedDict()

    def body(self, entry: TurnLogEntry) -> str:
        """The YAML of ``request``, ``tools`` and ``response`` of one log."""
        request = entry.request
        cache = self._sessions.pop(entry.session_id, None) or _SessionCache()
        self._sessions[entry.session_id] = cache
        while len(self._sessions) > _RENDER_CACHE_SESSIONS:
            self._sessions.popitem(last=False)
        if request.system is not cache.system:
            cache.system, cache.system_text = request.system, _indent(_dump({"system": request.system}))
        shared = shared_prefix(cache.turns, request.turns)
        texts = cache.texts[:shared]
        texts += [_indent(_dump([_turn_doc(turn)])) for turn in request.turns[shared:]]
        cache.turns, cache.texts = request.turns, texts
        tools = request.tools
        if cache.tools is None or len(cache.tools) != len(tools) or not all(map(operator.is_, cache.tools, tools)):
            cache.tools, cache.tools_text = tools, _dump({"tools": msgspec.to_builtins(tools)})
        turns_head = "  turns:\n" if texts else "  turns: []\n"
        response = _dump({"response": _response_doc(entry.response)})
        return "".join(["request:\n", cache.system_text, turns_head, *texts, cache.tools_text, response])


def _response_doc(response: LLMResponse | None) -> dict[str, Any] | None:
    if response is None:
        return None
    doc: dict[str, Any] = msgspec.to_builtins(response)
    if response.thought_signature is None:
        doc.pop("thought_signature")
    return doc
