"""The daemon's turn-log writer: each model call handed to a writer process.

See ARCHITECTURE.md, "Task tree".

The event loop does the least it can per call: it works out what the session's previous log did not
hold (the turns after the longest prefix it shares with it, the system prompt and the tools if they
changed), encodes that as a :class:`~kesoku.observe.turnlog.TurnLogJob` (msgpack) and queues the
bytes, without a checkpoint. A task writes them to the process's stdin (those that come fast
together, :data:`SEND_DELAY_S`); another reads one line back per job and counts it. Rendering YAML
and writing files happen in ``python -m kesoku.observe.turnlog``, so they never take the GIL from
the event loop (a thread would: in a turn of fast tool calls it doubled the loop's cost per step,
see bench/runtime_bench.py).

If the process dies, the jobs it had not answered are counted failed, a new one starts after
:data:`RESTART_DELAY_S`, and the next job of each session sends its whole request.

With a :class:`~kesoku.config.redact.Redactor`, each response (text, thoughts, tool-call arguments)
and error is masked before its job is made, so a secret the model echoes stays out of the log. The
request needs no masking here: its turns come from the gateway's masked history and its system
prompt is masked where it is built.
"""

from __future__ import annotations

import logging
import math
import operator
import subprocess
import sys
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from msgspec.structs import replace

from kesoku.observe.turnlog import (
    FRAME_HEADER,
    RENDER_CACHE_SESSIONS,
    TurnLogEntry,
    TurnLogJob,
    make_job,
)
from kesoku.vocab.ir import LLMResponse, LLMTurn, ThoughtBlock, ToolCallBlock, ToolSpec
from kesoku.vocab.transcript import shared_prefix

if TYPE_CHECKING:
    from kesoku.config.redact import Redactor

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 5.0
"""Longest a cancelled :meth:`TurnLogWriter.serve` waits for the logs already submitted."""
WRITER_BUFFER = 64
"""Jobs submitted and not yet written before :meth:`TurnLogWriter.submit` waits (backpressure)."""
RESTART_DELAY_S = 1.0
"""Pause before a writer process that died is replaced (one that cannot start does not spin)."""
SEND_DELAY_S = 0.005
"""After a write to the writer process, the jobs of the next SEND_DELAY_S wait and go together: a
turn of fast tool calls makes one every few hundred µs, and each write (and the answer it wakes)
costs the event loop more than the job's encoding (bench/runtime_bench.py). A job after a quiet
spell goes at once."""


class _Sent:
    """What the session's last job carried, by identity: the next job sends only what differs."""

    __slots__ = ("system", "tools", "turns")

    def __init__(
        self, turns: tuple[LLMTurn, ...], system: str, tools: tuple[ToolSpec, ...]
    ) -> None:
        self.turns, self.system, self.tools = turns, system, tools


class TurnLogWriter:
    """Writes turn logs through a writer process, in the order they were submitted.

    Args:
        buffer: Jobs submitted and not yet written before :meth:`submit` waits
            (:data:`WRITER_BUFFER`).
        max_session_bytes: Bytes of logs kept per session folder, the oldest deleted first; 0 keeps
            every log (``[turn_logs] max_mb_per_session``).
        redactor: Masks the secrets of each response and error (None: written as they are).

    Attributes:
        written: Logs written.
        failed: Logs that could not be written (each logged with ``logging``; never raised), those
            of a writer process that died among them.
        dropped: Entries submitted after :meth:`serve` stopped, or left unwritten when its drain
            timed out.
        restarts: Writer processes started after one died.
    """

    def __init__(
        self,
        *,
        buffer: int = WRITER_BUFFER,
        max_session_bytes: int = 0,
        redactor: Redactor | None = None,
    ) -> None:
        if buffer < 1:
            raise ValueError("buffer must be at least 1")
        if max_session_bytes < 0:
            raise ValueError("max_session_bytes must be 0 (no cap) or more")
        self.max_session_bytes = max_session_bytes
        self.redactor = redactor
        self._room = trio.Semaphore(buffer)
        self._encoder = msgspec.msgpack.Encoder()
        self._sent: OrderedDict[str, _Sent] = OrderedDict()
        self._outbox = bytearray()  # framed jobs not yet handed to the process
        self._outbox_ready = trio.Event()
        self._pending = 0  # jobs submitted and not yet answered
        self._quiet: dict[str, str] = {}  # session id -> the kind of failure already logged for it
        self._closing = trio.Event()  # serve was cancelled: send what is queued, then close stdin
        self._state = "new"
        self.written = 0
        self.failed = 0
        self.dropped = 0
        self.restarts = 0
        self.process: trio.Process | None = None
        """The current writer process (None before the first starts)."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the writer process until cancelled.

        Raises:
            RuntimeError: ``serve`` already ran on this writer.

        Cancellation:
            The logs already submitted are written first (at most :data:`DRAIN_TIMEOUT_S`), then
            ``Cancelled`` propagates; a process that has not finished by then is killed and its
            unwritten logs are counted as dropped. Later submissions are dropped and counted.
        """
        if self._state != "new":
            raise RuntimeError("TurnLogWriter.serve runs once per writer")
        self._state = "serving"
        done = trio.Event()
        # Shielded: the writer must outlive the cancellation that asks it to stop, to drain.
        machinery = trio.CancelScope(shield=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run, machinery, done)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._state = "stopped"
                self._closing.set()
                self._outbox_ready.set()
                with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_TIMEOUT_S):
                    await done.wait()
                machinery.cancel()  # past the bound: the process is killed

    async def submit(self, entry: TurnLogEntry) -> None:
        """Queue an entry for writing; waits only while :data:`WRITER_BUFFER` jobs are unanswered.

        Raises:
            RuntimeError: :meth:`serve` has not started: nothing would ever write the entry.

        Cancellation:
            With room in the buffer the entry is queued without a checkpoint, so a turn whose scope
            was just cancelled (an interruption) still logs the call it cut. Cancelled while waiting
            for room, the entry is not queued.
        """
        if self._state == "new":
            raise RuntimeError(
                "TurnLogWriter.submit before serve: start serve in the daemon's nursery first"
            )
        if self._state == "serving":
            try:
                self._room.acquire_nowait()
            except trio.WouldBlock:
                await self._room.acquire()
        if self._state != "serving":  # stopped (perhaps while we waited for room)
            self.dropped += 1
            logger.warning(
                "turn log of session %s dropped: the turn log writer has stopped", entry.session_id
            )
            return
        job = self._job(entry)
        try:
            frame = self._encoder.encode(job)
        except OverflowError:
            # A model may write any JSON number in a call's arguments; msgpack holds 64 bits.
            frame = self._encoder.encode(_wide_ints_as_text(msgspec.to_builtins(job)))
        self._outbox += FRAME_HEADER.pack(len(frame))
        self._outbox += frame
        self._pending += 1
        self._outbox_ready.set()

    def _job(self, entry: TurnLogEntry) -> TurnLogJob:
        if self.redactor is not None:
            entry = masked_entry(self.redactor, entry)
        request = entry.request
        sent = self._sent.pop(entry.session_id, None)
        self._sent[entry.session_id] = _Sent(request.turns, request.system, request.tools)
        # the process's renderer forgets in the same order
        while len(self._sent) > RENDER_CACHE_SESSIONS:
            self._sent.popitem(last=False)
        if sent is None:
            return make_job(entry)
        # Tuple and string comparison check identity first: unchanged tools and prompts cost no
        # more; an equal turn renders the same.
        return make_job(
            entry,
            keep=shared_prefix(sent.turns, request.turns),
            system=request.system != sent.system,
            tools=request.tools != sent.tools,
        )

    # -- the process ------------------------------------------------------------------------------

    async def _run(self, machinery: trio.CancelScope, done: trio.Event) -> None:
        """Start the writer process, feed it, and replace it if it dies, until closed."""
        try:
            with machinery:
                while True:
                    try:
                        # -P: the daemon's working folder must not shadow a module the writer
                        # imports.
                        process = await trio.lowlevel.open_process(
                            [
                                sys.executable,
                                "-P",
                                "-m",
                                "kesoku.observe.turnlog",
                                str(self.max_session_bytes),
                            ],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE,
                            start_new_session=True,  # Ctrl-C in a terminal reaches the daemon only
                        )
                    # out of processes or memory: the logs wait, the turns go on
                    except OSError as exc:
                        logger.error("the turn log writer process could not start: %s", exc)
                        self._lost(None)
                        if self._closing.is_set():
                            return
                        await trio.sleep(RESTART_DELAY_S)
                        continue
                    self.process = process
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self._send, process)
                            await self._read_answers(process)
                            nursery.cancel_scope.cancel()
                    finally:
                        if process.returncode is None:
                            process.kill()
                        with trio.CancelScope(shield=True):
                            await process.wait()
                    if self._closing.is_set() and not self._pending:
                        return
                    self._lost(process.returncode)
                    if self._closing.is_set():
                        return
                    await trio.sleep(RESTART_DELAY_S)
                    self.restarts += 1
        finally:
            self.dropped += self._pending
            self._pending = 0
            done.set()

    def _lost(self, returncode: int | None) -> None:
        """The process died (or never started).

        What it had not answered failed; sessions start afresh.
        """
        if returncode is not None:
            logger.error(
                "the turn log writer process exited (code %s): %d log(s) not written; "
                "starting another",
                returncode,
                self._pending,
            )
        self.failed += self._pending
        for _ in range(self._pending):
            self._room.release()
        self._pending = 0
        self._outbox.clear()
        self._sent.clear()

    async def _send(self, process: trio.Process) -> None:
        assert process.stdin is not None
        sent_at = -math.inf
        try:
            while True:
                if self._outbox:
                    # The first job after a quiet spell goes at once; those that follow it within
                    # SEND_DELAY_S go together at its end.
                    batch_end = sent_at + SEND_DELAY_S
                    if not self._closing.is_set() and trio.current_time() < batch_end:
                        await trio.sleep_until(batch_end)
                    data = bytes(self._outbox)
                    self._outbox.clear()
                    sent_at = trio.current_time()
                    await process.stdin.send_all(data)
                elif self._closing.is_set():
                    await process.stdin.aclose()  # the process writes what it has, then exits
                    return
                else:
                    self._outbox_ready = trio.Event()
                    await self._outbox_ready.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the process died: _read_answers sees its stdout end

    async def _read_answers(self, process: trio.Process) -> None:
        """Count one answer line per job until the process's stdout ends."""
        assert process.stdout is not None
        partial = b""
        async for chunk in process.stdout:
            *lines, partial = (partial + chunk).split(b"\n")
            for line in lines:
                self._pending -= 1
                self._room.release()
                if line == b"ok":
                    self.written += 1
                    self._quiet.clear()  # logs are written again: a new failure is news
                    continue
                self.failed += 1
                session_id, _, why = (
                    line.decode(errors="replace").removeprefix("failed ").partition(" ")
                )
                self._sent.pop(session_id, None)  # its next job sends everything again
                # A folder that cannot be written fails every call of the session: say it once.
                kind = why.partition(":")[0]
                if self._quiet.get(session_id) != kind:
                    self._quiet[session_id] = kind
                    logger.error(
                        "turn log of session %s not written: %s "
                        "(the same failure again is counted, not logged,"
                        " until a log is written)",
                        session_id,
                        why,
                    )


def masked_entry(redactor: Redactor, entry: TurnLogEntry) -> TurnLogEntry:
    """``entry`` with its response's text, thoughts and tool-call arguments, and its error, masked.

    Signatures, ids and usage are left as they are. Returns ``entry`` itself when nothing changed.
    """
    response = entry.response
    masked = None if response is None else masked_response(redactor, response)
    error = None if entry.error is None else redactor.mask(entry.error)
    if masked is response and error is entry.error:
        return entry
    return replace(entry, response=masked, error=error)


def masked_response(redactor: Redactor, response: LLMResponse) -> LLMResponse:
    """``response`` with its text, thoughts and tool-call arguments masked (itself if unchanged)."""
    text, thoughts = redactor.mask(response.text), redactor.mask(response.thoughts)
    blocks = tuple(_masked_thought(redactor, block) for block in response.thought_blocks)
    calls = tuple(_masked_call(redactor, call) for call in response.tool_calls)
    if (
        text is response.text
        and thoughts is response.thoughts
        and all(map(operator.is_, blocks, response.thought_blocks))
        and all(map(operator.is_, calls, response.tool_calls))
    ):
        return response
    return replace(response, text=text, thoughts=thoughts, thought_blocks=blocks, tool_calls=calls)


def _masked_thought(redactor: Redactor, block: ThoughtBlock) -> ThoughtBlock:
    text = redactor.mask(block.text)
    return block if text is block.text else replace(block, text=text)


def _masked_call(redactor: Redactor, call: ToolCallBlock) -> ToolCallBlock:
    arguments = redactor.mask_tree(call.arguments)
    return call if arguments is call.arguments else replace(call, arguments=arguments)


_MSGPACK_INTS = range(-(2**63), 2**64)


def _wide_ints_as_text(value: Any) -> Any:
    """``value`` (builtins) with every integer msgpack cannot hold written as its decimal text."""
    if isinstance(value, int) and value not in _MSGPACK_INTS:
        return str(value)
    if isinstance(value, dict):
        return {key: _wide_ints_as_text(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_wide_ints_as_text(item) for item in value]
    return value
