"""Every model call written as YAML: ``sessions/<session_id>/llm-turn-{idx}.log.yaml`` (DESIGN §11).

A turn log holds what was sent and what came back, so a bad answer can be read exactly as the model
saw it::

    metadata:     time (unix s), iso_time, session_id, idx, provider, model, duration_s, error
    request:      system prompt, turns with every block (bytes as base64; large attachments as
                  "<N bytes>": the file is at the block's path; a block's signature and signed_by
                  only when it has a signature)
    tools:        name, description, parameters (JSON Schema with the types)
    response:     text, thoughts, thought_blocks and thought_signature (when there are any),
                  tool_calls, usage (null when the call failed before any event)

Indexes come from the files in the folder, so they continue across restarts: the first call in an
empty folder is 1, then the highest index + 1. A file is reserved with ``O_CREAT | O_EXCL`` before
it is written, so two writers (threads or processes) never share an index; a per-folder cache of the
next index keeps a long session from rescanning its folder on every call.

:func:`write_turn_log` is synchronous (dumping a long history takes milliseconds);
:class:`TurnLogWriter` runs it in a thread of its own so the event loop never waits for a dump, and its
:class:`TurnLogRenderer` reuses the YAML of turns it already wrote, so a log costs about its new turns.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import operator
import os
import queue
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

_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVED_MAX = 4096
"""Scalars whose implicit tag :class:`_Dumper` remembers (keys and small values repeat in every log)."""
_resolved: dict[tuple[str, object], str] = {}


class _Dumper(_BaseDumper):
    """Block style, with multi-line strings as ``|`` literal blocks, no ``&id001`` anchors."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: Any) -> str:
        # The emitter asks, for every scalar, whether it could be written plain: the same few keys and
        # values ("type", "id", "completed") thousands of times per session. The answer depends on the
        # value alone (the safe resolver has no path rules), so it is remembered.
        if kind is not yaml.ScalarNode:
            return super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call,no-any-return]
        key = (value, implicit if isinstance(implicit, bool) else tuple(implicit))
        tag = _resolved.get(key)
        if tag is None:
            if len(_resolved) >= _RESOLVED_MAX:
                _resolved.clear()
            tag = _resolved[key] = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        return tag


_scalars = yaml.representer.SafeRepresenter()


def _node(value: Any) -> yaml.Node:
    """The YAML node of a msgspec builtins value (dict, list, str, int, float, bool, None).

    What ``yaml.dump`` does with a representer, without its per-value dispatch and alias bookkeeping
    (a log is dumped on every model call). Strings with a line break become ``|`` literal blocks (PyYAML
    falls back to quoting by itself when a literal block cannot hold the text).
    """
    if isinstance(value, str):
        return yaml.ScalarNode(_STR_TAG, value, style="|" if "\n" in value else None)
    if isinstance(value, dict):
        pairs = [(_node(k), _node(v)) for k, v in value.items()]
        return yaml.MappingNode("tag:yaml.org,2002:map", pairs, flow_style=False)
    if isinstance(value, list | tuple):
        return yaml.SequenceNode("tag:yaml.org,2002:seq", [_node(v) for v in value], flow_style=False)
    return _scalars.represent_data(value)  # None, bool, int, float; anything else raises RepresenterError


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
    folder = Path(entry.folder)
    try:
        idx, fd = _reserve(folder)
    except FileNotFoundError:  # the session's first log: its folder may not exist yet
        folder.mkdir(parents=True, exist_ok=True)
        idx, fd = _reserve(folder)
    path = folder / f"llm-turn-{idx}.log.yaml"
    try:
        data = (renderer or TurnLogRenderer()).render(entry, idx).encode()
        with os.fdopen(fd, "wb") as f:
            f.write(data)  # one write: each system call lets the event loop's thread take the GIL back
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


class TurnLogWriter:
    """Writes turn logs in its own thread, one at a time, in the order they were submitted.

    The thread takes entries from a queue as fast as it can write them: the event loop only queues an
    entry (no trip through the scheduler per log), and a writer that fell behind catches up without
    waiting for the loop between logs.

    Args:
        buffer: Entries queued before :meth:`submit` waits (:data:`WRITER_BUFFER`).

    Attributes:
        written: Logs written.
        failed: Logs that could not be written (logged with ``logging``; never raised).
        dropped: Entries submitted after :meth:`serve` stopped, or left unwritten when its drain
            timed out.
    """

    def __init__(self, *, buffer: int = WRITER_BUFFER) -> None:
        if buffer < 1:
            raise ValueError("buffer must be at least 1")
        self._queue: queue.SimpleQueue[TurnLogEntry | None] = queue.SimpleQueue()  # None: stop
        self._room = trio.Semaphore(buffer)  # released by the thread (through the trio token) per entry
        self._state = "new"
        self._renderer = TurnLogRenderer()  # used by the writer thread only
        self.written = 0
        self.failed = 0
        self.dropped = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer thread until cancelled.

        Raises:
            RuntimeError: ``serve`` already ran on this writer.

        Cancellation:
            Entries already queued are written first (shielded, at most :data:`DRAIN_TIMEOUT_S`), then
            ``Cancelled`` propagates. Later submissions are dropped and counted; so are the queued
            entries a timed-out drain leaves (a hung disk cannot hold the shutdown).
        """
        if self._state != "new":
            raise RuntimeError("TurnLogWriter.serve runs once per writer")
        self._state = "serving"
        token = trio.lowlevel.current_trio_token()
        thread = threading.Thread(target=self._run, args=(token,), name="kesoku turn log writer", daemon=True)
        thread.start()
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            self._state = "stopped"
            self._queue.put(None)  # after what is queued: those are calls that happened
            with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_TIMEOUT_S) as drain:
                await trio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
            if drain.cancelled_caught:
                self.dropped += self._discard_queued()
                self._queue.put(None)  # the stuck thread ends after its write

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
        if self._state == "serving":
            try:
                self._room.acquire_nowait()
            except trio.WouldBlock:
                await self._room.acquire()
        if self._state != "serving":  # stopped (perhaps while we waited for room)
            self.dropped += 1
            logger.warning("turn log of session %s dropped: the turn log writer has stopped", entry.session_id)
            return
        self._queue.put(entry)

    def _run(self, token: trio.lowlevel.TrioToken) -> None:
        """The writer thread: write queued entries until the stop mark."""
        while (entry := self._queue.get()) is not None:
            try:
                write_turn_log(entry, self._renderer)
            except Exception as exc:  # disk full, a folder that is a file, an argument YAML cannot hold
                self.failed += 1
                logger.error("turn log of session %s not written: %s: %s", entry.session_id, type(exc).__name__, exc)
            else:
                self.written += 1
            with contextlib.suppress(trio.RunFinishedError):  # the run ended during a drain that gave up
                token.run_sync_soon(self._room.release)

    def _discard_queued(self) -> int:
        count = 0
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                return count
            count += entry is not None


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
    text: str = yaml.serialize(_node(doc), Dumper=_Dumper, allow_unicode=True, width=100)
    return text


def _dump_all(docs: list[Any]) -> list[str]:
    """The YAML of each doc (mappings or non-empty lists), from one emitter.

    The docs are written as one stream of ``---`` documents and split at the markers: every line of a
    block mapping or list that starts in column 0 is a key or a ``- `` item, so ``---`` alone on a
    line can only be a marker. Should the split ever disagree, each doc is dumped on its own.
    """
    text: str = yaml.serialize_all(
        [_node(doc) for doc in docs], Dumper=_Dumper, allow_unicode=True, width=100, explicit_start=True
    )
    parts = text.removeprefix("---\n").split("\n---\n")
    if len(parts) != len(docs) or not text.startswith("---\n"):
        return [_dump(doc) for doc in docs]
    return [part + "\n" for part in parts[:-1]] + parts[-1:]


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
    return {"role": turn.role, "blocks": _unsigned_left_out(blocks)}


def _unsigned_left_out(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Block docs without ``signature: null`` and ``signed_by: null`` (most blocks carry none)."""
    for doc in blocks:
        if doc.get("signature", True) is None:
            del doc["signature"]
            if doc.get("signed_by", True) is None:
                del doc["signed_by"]
    return blocks


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

    def render(self, entry: TurnLogEntry, idx: int) -> str:
        """The YAML document of one log: ``metadata`` (with ``idx``), ``request``, ``tools``, ``response``."""
        request = entry.request
        cache = self._sessions.pop(entry.session_id, None) or _SessionCache()
        self._sessions[entry.session_id] = cache
        while len(self._sessions) > _RENDER_CACHE_SESSIONS:
            self._sessions.popitem(last=False)
        shared = shared_prefix(cache.turns, request.turns)
        new_turns = request.turns[shared:]
        # Everything new goes through one emitter: setting one up costs more than a small document.
        docs: list[Any] = [
            {"metadata": _metadata_doc(entry, idx)},
            {"response": _response_doc(entry.response)},
            *([_turn_doc(turn)] for turn in new_turns),
        ]
        system_changed = request.system is not cache.system
        if system_changed:
            docs.append({"system": request.system})
        tools = request.tools
        tools_changed = (
            cache.tools is None or len(cache.tools) != len(tools) or not all(map(operator.is_, cache.tools, tools))
        )
        if tools_changed:
            docs.append({"tools": msgspec.to_builtins(tools)})
        texts = _dump_all(docs)
        metadata, response = texts[0], texts[1]
        turn_texts = texts[2 : 2 + len(new_turns)]
        rest = texts[2 + len(new_turns) :]
        if system_changed:
            cache.system, cache.system_text = request.system, _indent(rest.pop(0))
        if tools_changed:
            cache.tools, cache.tools_text = tools, rest.pop(0)
        cache.texts = cache.texts[:shared] + [_indent(text) for text in turn_texts]
        cache.turns = request.turns
        turns_head = "  turns:\n" if cache.texts else "  turns: []\n"
        parts = [metadata, "request:\n", cache.system_text, turns_head, *cache.texts, cache.tools_text, response]
        return "".join(parts)


def _response_doc(response: LLMResponse | None) -> dict[str, Any] | None:
    if response is None:
        return None
    doc: dict[str, Any] = msgspec.to_builtins(response)
    if response.thought_signature is None:
        doc.pop("thought_signature")
    if not response.thought_blocks:
        doc.pop("thought_blocks")  # `thoughts` holds their text; the blocks matter when signed
    _unsigned_left_out(doc["tool_calls"])
    return doc
