"""Every model call written as YAML: ``sessions/<session_id>/llm-turn-{idx}.log.yaml``.

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

:func:`write_turn_log` is synchronous (dumping a long history takes milliseconds). The daemon's
:class:`~kesoku.observe.turnlog_writer.TurnLogWriter` instead sends each call, as a
:class:`TurnLogJob` that holds only what the session's previous log did not, to a writer process
(``python -m kesoku.observe.turnlog``, :func:`main`): YAML never runs in the event loop's
interpreter, where a thread would still take turns with the loop for the GIL. Its
:class:`TurnLogRenderer` keeps the YAML of turns already written, so a log costs about its new
turns.
"""

from __future__ import annotations

import datetime
import os
import queue
import signal
import struct
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import yaml

from kesoku.observe.retention import Retention, log_files
from kesoku.vocab.ir import DocumentBlock, ImageBlock, LLMRequest, LLMResponse, LLMTurn, ToolSpec

INLINE_ATTACHMENT_MAX_BYTES = 1024
"""Attachment data up to this size is written as base64; larger data as ``<N bytes>``."""
_IDX_CACHE_FOLDERS = 1024
"""Folders whose next index is remembered (least recently used dropped first)."""
RENDER_CACHE_SESSIONS = 64
"""Sessions whose rendered turns a :class:`TurnLogRenderer` keeps.

The writer keeps as many in step.
"""
_RESERVE_ATTEMPTS = 1000
"""Indexes tried before giving up; only reached if something keeps creating files in the folder."""


try:  # libyaml's emitter: several times faster than the pure-Python one
    from yaml import CSafeDumper as _BaseDumper
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeDumper as _BaseDumper  # type: ignore[assignment]

_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVED_MAX = 4096
"""Scalars whose implicit tag :class:`_Dumper` remembers.

Keys and small values repeat in every log.
"""
_resolved: dict[tuple[str, object], str] = {}


class _Dumper(_BaseDumper):
    """Block style, with multi-line strings as ``|`` literal blocks, no ``&id001`` anchors."""

    def resolve(self, kind: type[yaml.Node], value: Any, implicit: Any) -> str:
        # The emitter asks, for every scalar, whether it could be written plain: the same few keys
        # and values ("type", "id", "completed") thousands of times per session. The answer depends
        # on the value alone (the safe resolver has no path rules), so it is remembered.
        if kind is not yaml.ScalarNode:
            resolved: str = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
            return resolved
        key = (value, implicit if isinstance(implicit, bool) else tuple(implicit))
        tag = _resolved.get(key)
        if tag is None:
            if len(_resolved) >= _RESOLVED_MAX:
                _resolved.clear()
            resolve = super().resolve
            tag = _resolved[key] = resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        return tag


_scalars = yaml.representer.SafeRepresenter()


def _node(value: Any) -> yaml.Node:
    """The YAML node of a msgspec builtins value (dict, list, str, int, float, bool, None).

    What ``yaml.dump`` does with a representer, without its per-value dispatch and alias bookkeeping
    (a log is dumped on every model call). Strings with a line break become ``|`` literal blocks
    (PyYAML falls back to quoting by itself when a literal block cannot hold the text).
    """
    if isinstance(value, str):
        return yaml.ScalarNode(_STR_TAG, value, style="|" if "\n" in value else None)
    if isinstance(value, dict):
        pairs = [(_node(k), _node(v)) for k, v in value.items()]
        return yaml.MappingNode("tag:yaml.org,2002:map", pairs, flow_style=False)
    if isinstance(value, list | tuple):
        return yaml.SequenceNode(
            "tag:yaml.org,2002:seq", [_node(v) for v in value], flow_style=False
        )
    # None, bool, int, float; anything else raises RepresenterError
    return _scalars.represent_data(value)


class TurnLogCall(msgspec.Struct, frozen=True):
    """Which model call a log is of (what :class:`TurnLogEntry` and :class:`TurnLogJob` share).

    Attributes:
        folder: The session's folder (``sessions/<session_id>``); created when missing.
        session_id: The session.
        provider: The backend (``gemini``, ``scripted``, ...).
        model: The model id.
        started_at: When the call started, UNIX seconds.
        duration_s: How long it took.
    """

    folder: str
    session_id: str
    provider: str
    model: str
    started_at: float
    duration_s: float


class TurnLogEntry(TurnLogCall, frozen=True, kw_only=True):
    """One model call to log (the fields of :class:`TurnLogCall`, then these).

    Attributes:
        request: Exactly what was sent.
        response: What came back (what was assembled before a failure), or None.
        error: Why the call failed, when it did.
    """

    request: LLMRequest
    response: LLMResponse | None
    error: str | None = None


class TurnLogJob(TurnLogCall, frozen=True, array_like=True):
    """One log as the writer gets it: the call, then what is new since the session's last job.

    The fields of :class:`TurnLogCall` come first.

    Attributes:
        error: Why the call failed, or None.
        keep: How many turns of the session's previous job lead this request too (their YAML is
            kept).
        turns: The request's turns after those.
        system: The system prompt, or None when it is the previous job's.
        tools: The tools, or None when they are the previous job's.
        response: What came back, or None.
        omitted: ``(turn, block, size)`` of each attachment whose data (over
            :data:`INLINE_ATTACHMENT_MAX_BYTES`) was left out: indexes into ``turns``, size in
            bytes.
    """

    error: str | None
    keep: int
    turns: tuple[LLMTurn, ...]
    system: str | None
    tools: tuple[ToolSpec, ...] | None
    response: LLMResponse | None
    omitted: tuple[tuple[int, int, int], ...] = ()


def make_job(
    entry: TurnLogEntry, *, keep: int = 0, system: bool = True, tools: bool = True
) -> TurnLogJob:
    """The job of ``entry`` that sends its turns from ``keep`` on.

    It also sends the system prompt and the tools if asked.

    Large attachment data is left out here (recorded in ``omitted``): a photo would cost more to
    send than the whole log, and the log shows only its size.
    """
    turns: list[LLMTurn] = []
    omitted: list[tuple[int, int, int]] = []
    for t, turn in enumerate(entry.request.turns[keep:]):
        big = [
            (b, len(block.data))
            for b, block in enumerate(turn.blocks)
            if isinstance(block, ImageBlock | DocumentBlock)
            and len(block.data) > INLINE_ATTACHMENT_MAX_BYTES
        ]
        if big:
            blocks = list(turn.blocks)
            for b, size in big:
                omitted.append((t, b, size))
                blocks[b] = msgspec.structs.replace(blocks[b], data=b"")
            turn = LLMTurn(turn.role, tuple(blocks))
        turns.append(turn)
    request = entry.request
    return TurnLogJob(
        entry.folder,
        entry.session_id,
        entry.provider,
        entry.model,
        entry.started_at,
        entry.duration_s,
        entry.error,
        keep,
        tuple(turns),
        request.system if system else None,
        tuple(request.tools) if tools else None,
        entry.response,
        tuple(omitted),
    )


def write_turn_log(entry: TurnLogEntry) -> Path:
    """Write one turn log under the next free index of its folder (blocking).

    Returns:
        The file written.

    Raises:
        OSError: The folder or file cannot be created or written (no partial file is left behind).
    """
    return _write_log(job := make_job(entry), TurnLogRenderer().body(job))[0]


def _write_log(job: TurnLogJob, body: str) -> tuple[Path, int, int]:
    """Reserve the next index, then write the metadata (which holds it) and ``body``.

    Returns:
        The file, its index and its size in bytes.
    """
    folder = Path(job.folder)
    try:
        idx, fd = _reserve(folder)
    except FileNotFoundError:  # the session's first log: its folder may not exist yet
        folder.mkdir(parents=True, exist_ok=True)
        idx, fd = _reserve(folder)
    path = folder / f"llm-turn-{idx}.log.yaml"
    try:
        data = (_dump({"metadata": _metadata_doc(job, idx)}) + body).encode()
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, idx, len(data)


class TurnLogOutOfStep(LookupError):
    """A job keeps turns, a system prompt or tools that the writer process does not hold.

    This happens when the writer process restarted.
    """


# -- the index ------------------------------------------------------------------------------------

_next_idx: OrderedDict[str, int] = OrderedDict()
_next_idx_lock = threading.Lock()


def _reserve(folder: Path) -> tuple[int, int]:
    """Create the next free ``llm-turn-{idx}.log.yaml`` exclusively; return its index and fd."""
    key = os.path.abspath(folder)
    with _next_idx_lock:
        idx = _next_idx.pop(key, None)
    if idx is None:
        idx = _scan(folder)
    for _ in range(_RESERVE_ATTEMPTS):
        try:
            fd = os.open(
                folder / f"llm-turn-{idx}.log.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644
            )
        except FileExistsError:
            # Another writer (thread or process) got there first: it may be far ahead, so look
            # again.
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
    return max((idx for idx, _ in log_files(folder)), default=0) + 1


# -- the document ---------------------------------------------------------------------------------


def _dump(doc: Any) -> str:
    text: str = yaml.serialize(_node(doc), Dumper=_Dumper, allow_unicode=True, width=100)
    return text


def _dump_all(docs: list[Any]) -> list[str]:
    """The YAML of each doc (mappings or non-empty lists), from one emitter.

    The docs are written as one stream of ``---`` documents and split at the markers: every line of
    a block mapping or list that starts in column 0 is a key or a ``- `` item, so ``---`` alone on a
    line can only be a marker. Should the split ever disagree, each doc is dumped on its own.
    """
    text: str = yaml.serialize_all(
        [_node(doc) for doc in docs],
        Dumper=_Dumper,
        allow_unicode=True,
        width=100,
        explicit_start=True,
    )
    parts = text.removeprefix("---\n").split("\n---\n")
    if len(parts) != len(docs) or not text.startswith("---\n"):
        return [_dump(doc) for doc in docs]
    return [part + "\n" for part in parts[:-1]] + parts[-1:]


def _metadata_doc(entry: TurnLogJob, idx: int) -> dict[str, Any]:
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


def _turn_doc(turn: LLMTurn, omitted: dict[int, int]) -> dict[str, Any]:
    """The doc of one turn; ``omitted`` maps a block's index to the size of its data left out."""
    # bytes → base64, enums → their values
    blocks: list[dict[str, Any]] = msgspec.to_builtins(turn.blocks)
    for b, size in omitted.items():
        blocks[b]["data"] = f"<{size} bytes>"
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
    """Indent each line by two spaces (a standalone YAML node put under a key keeps its meaning)."""
    return "".join("  " + line if line.strip() else line for line in text.splitlines(keepends=True))


class _SessionCache:
    """What the last log of one session rendered: the YAML of its turns, system prompt and tools."""

    __slots__ = ("system_text", "texts", "tools_text")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.system_text: str | None = None
        self.tools_text: str | None = None


class TurnLogRenderer:
    """Renders turn logs, reusing the YAML of what the previous log of the session already held.

    A turn of many model calls sends a history that grows by a step each call: a job names how many
    turns it shares with the session's previous one (``keep``), and only its new turns are dumped;
    the system prompt and tools only when they changed. The most recent
    :data:`RENDER_CACHE_SESSIONS` sessions are kept. Not thread-safe.
    """

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _SessionCache] = OrderedDict()

    def body(self, job: TurnLogJob) -> str:
        """The YAML of one log after its metadata: ``request``, ``tools`` and ``response``.

        Raises:
            TurnLogOutOfStep: The job keeps what this renderer does not hold; the session's cache is
                dropped, so a job that sends everything renders again.
        """
        cache = self._sessions.pop(job.session_id, None) or _SessionCache()
        # the session's cache is dropped already: a job that sends everything renders again
        if (
            job.keep > len(cache.texts)
            or (job.system is None and cache.system_text is None)
            or (job.tools is None and cache.tools_text is None)
        ):
            raise TurnLogOutOfStep(
                f"session {job.session_id}: the job keeps what the writer does not hold"
            )
        # Everything new goes through one emitter: setting one up costs more than a small document.
        omitted: list[dict[int, int]] = [{} for _ in job.turns]
        for t, b, size in job.omitted:
            omitted[t][b] = size
        docs: list[Any] = [
            {"response": _response_doc(job.response)},
            *([_turn_doc(turn, sizes)] for turn, sizes in zip(job.turns, omitted, strict=True)),
        ]
        if job.system is not None:
            docs.append({"system": job.system})
        if job.tools is not None:
            docs.append({"tools": msgspec.to_builtins(job.tools)})
        texts = _dump_all(docs)
        response = texts[0]
        turn_texts = texts[1 : 1 + len(job.turns)]
        rest = texts[1 + len(job.turns) :]
        if job.system is not None:
            cache.system_text = _indent(rest.pop(0))
        if job.tools is not None:
            cache.tools_text = rest.pop(0)
        del cache.texts[job.keep :]
        cache.texts += [_indent(text) for text in turn_texts]
        self._sessions[job.session_id] = cache
        while len(self._sessions) > RENDER_CACHE_SESSIONS:
            self._sessions.popitem(last=False)
        turns_head = "  turns:\n" if cache.texts else "  turns: []\n"
        parts = [
            "request:\n",
            cache.system_text,
            turns_head,
            *cache.texts,
            cache.tools_text,
            response,
        ]
        return "".join(parts)  # type: ignore[arg-type]  # both texts were set above or before


def _response_doc(response: LLMResponse | None) -> dict[str, Any] | None:
    if response is None:
        return None
    doc: dict[str, Any] = msgspec.to_builtins(response)
    if response.thought_signature is None:
        doc.pop("thought_signature")
    if not response.thought_blocks:
        doc.pop("thought_blocks")  # `thoughts` holds their text; the blocks matter when signed
    if response.stop_reason is None:  # older logs and unfinished streams have none
        doc.pop("stop_reason")
    if not response.stop_detail:
        doc.pop("stop_detail")
    _unsigned_left_out(doc["tool_calls"])
    return doc


# -- the writer process ---------------------------------------------------------------------------

FRAME_HEADER = struct.Struct(">I")
"""Each job on the writer's stdin: its msgpack length (4 bytes, big-endian), then the msgpack."""


def serve_jobs(jobs: BinaryIO, acks: BinaryIO, *, max_session_bytes: int = 0) -> None:
    """Write the log of each framed job read from ``jobs``; answer each with one line on ``acks``.

    The line is ``ok`` or ``failed SESSION_ID WHY`` (one line: the reason's line breaks become
    spaces), in the order of the jobs. Rendering (CPU) and writing the files (the file system)
    overlap: this thread renders the next job while a second one creates and writes the last.
    Returns at the end of ``jobs`` (a job cut short there is dropped), once every log is written. If
    ``acks`` breaks (the daemon is gone), the logs already received are still written: they explain
    its last turns. Past ``max_session_bytes`` of logs in a session's folder (0: no cap), its oldest
    logs are deleted (:class:`~kesoku.observe.retention.Retention`).
    """
    decoder = msgspec.msgpack.Decoder(TurnLogJob)
    retention = Retention(max_session_bytes)
    renderer = TurnLogRenderer()
    rendered: queue.Queue[tuple[TurnLogJob, str | Exception] | None] = queue.Queue(maxsize=8)
    answering = True

    def answer(line: bytes) -> None:
        nonlocal answering
        if answering:
            try:
                acks.write(line)
                # The answers of jobs that came together go back together (the last one's flush,
                # or the end's): each read of them wakes the daemon's event loop.
                if not line or rendered.empty():
                    acks.flush()
            except (OSError, ValueError):  # a broken or closed pipe: nobody is listening any more
                answering = False

    def write_rendered() -> None:
        while (item := rendered.get()) is not None:
            job, body = item
            try:
                if isinstance(body, Exception):
                    raise body
                retention.written(*_write_log(job, body))
            except Exception as exc:  # disk full, a folder that is a file, a writer out of step
                answer(
                    f"failed {job.session_id} {type(exc).__name__}: {exc}".replace(
                        "\n", " "
                    ).encode()
                    + b"\n"
                )
            else:
                answer(b"ok\n")
        answer(b"")  # flushes what a job queued behind the last answer held back

    writer = threading.Thread(target=write_rendered, name="turn log files")
    writer.start()

    def hand_over(item: tuple[TurnLogJob, str | Exception] | None) -> None:
        while writer.is_alive():  # never wait for ever on a thread that is gone
            try:
                rendered.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    try:
        while len(header := jobs.read(FRAME_HEADER.size)) == FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack(header)
            data = jobs.read(size)
            if len(data) < size:
                break  # the daemon died while sending this job
            job = decoder.decode(data)
            try:
                hand_over((job, renderer.body(job)))
            except Exception as exc:  # answered in order, by the writing thread
                hand_over((job, exc))
    finally:
        hand_over(None)
        writer.join()


def main() -> None:
    """The writer process: ``python -m kesoku.observe.turnlog [MAX_SESSION_BYTES]``.

    Fed by :class:`~kesoku.observe.turnlog_writer.TurnLogWriter`; the argument caps each session's
    logs (0 or absent: no cap).
    """
    # The daemon decides when this process ends, by closing its stdin once the queued logs are sent:
    # systemd's stop signal reaches every process of the service, and Ctrl-C the whole process
    # group.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    max_session_bytes = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    serve_jobs(sys.stdin.buffer, sys.stdout.buffer, max_session_bytes=max_session_bytes)
    # Every log is written and answered (serve_jobs flushes its answers): the daemon waits for this
    # exit at shutdown, so skip the interpreter's teardown.
    os._exit(0)


if __name__ == "__main__":
    main()
