"""The dispatcher: user messages → one SessionWorker per session, in the dispatcher's nursery.

Where it sits: ARCHITECTURE.md, "Task tree".
At start it recovers what a crash left: user messages still ``pending`` or ``processing`` go to
their session's worker (a turn left ``processing`` resumes; its tool calls without results are
answered ``lost`` first). Then it follows ``gateway.listen(role="user")``. Message status in the
store is the durable state, so the dispatcher needs no cursor of its own: the listener is opened
before the recovery scan, and a message seen by both is queued once.

A worker runs only while this process holds its session's lock (:mod:`kesoku.store.locks`). A
message of a session another process holds is left to that process (its dispatcher sees every user
message too) and looked at again every :data:`BUSY_RETRY_S` until it is answered or the session is
free, so a message posted just as the other process lets go is not stranded.

A worker that raises is a bug: its turn is marked failed, the user is told, the process keeps
running, and messages that were waiting for that worker get a fresh one.

Running out of file descriptors (EMFILE, ENFILE) is not a bug of the session but of the moment: a
lock that cannot be taken, or a worker that fails that way, never stops the dispatcher. The
session's messages wait with the busy ones and are tried again every :data:`BUSY_RETRY_S`, with one
warning naming the session; a turn that keeps failing so is marked failed after
:data:`OUT_OF_FILES_RETRIES`.
"""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING

import trio

from kesoku.agent.worker import Learned, SessionWorker
from kesoku.vocab.errors import OperatorError, StoreError
from kesoku.vocab.events import TurnEnded
from kesoku.vocab.metrics import TurnMetrics, TurnState
from kesoku.vocab.model import Kind, Role, Status, in_turn

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.vocab.model import Message

log = logging.getLogger(__name__)

BUSY_RETRY_S = 1.0
"""How often a message of a session held by another process is looked at again."""
LEARNED_SESSIONS = 4096
"""Sessions whose compaction calibration the dispatcher keeps once their worker returned (the
oldest is forgotten first: its next worker learns again from its first model call)."""
OUT_OF_FILES_RETRIES = 5
"""Times a session's worker may fail for want of file descriptors before its turn is marked
failed."""
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE)


class Dispatcher:
    """Owns the session workers.

    Args:
        rt: The runtime.

    Attributes:
        workers: The live workers, by session id.
        crashes: How many workers raised (each one a bug, logged with its traceback).
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.workers: dict[str, SessionWorker] = {}
        self.crashes = 0
        self.busy: dict[int, Message] = {}
        """Open messages of sessions another process holds, by id (retried every BUSY_RETRY_S)."""
        self._busy_added = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._starved: dict[str, int] = {}
        """Sessions that ran out of file descriptors, by id: worker failures so far
        (0: the lock)."""
        self.learned: dict[str, Learned] = {}
        """What returned workers' compactors learned, by session id, for the session's next worker
        (only sessions that learned something; at most :data:`LEARNED_SESSIONS`, oldest out)."""
        self._ended: dict[int, trio.Event] = {}  # id(worker) -> set once it let its lock go

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, then dispatch user messages until cancelled.

        Cancellation:
            Cancelling stops every worker; turns in progress stay ``processing`` and resume at the
            next start (a running tool batch finishes first: it is shielded).
        """
        gateway = self.rt.gateway
        with gateway.listen(role=Role.USER) as listener:
            recovered = self.rt.store.open_user_messages(up_to=listener.cursor)
            if recovered:
                log.info("recovering %d open user message(s)", len(recovered))
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._retry_busy)
                for message in recovered:
                    self.submit(message)
                gateway.set_stop_handler(self.stop)
                try:
                    task_status.started()
                    async for message in listener:
                        if message.status is Status.PENDING:
                            self.submit(message)
                finally:
                    gateway.set_stop_handler(None)
                    self._nursery = None

    def submit(self, message: Message) -> None:
        """Queue a user message on its session's worker, starting the worker if needed.

        A message of a session another process holds waits in :attr:`busy` instead.
        """
        worker = self._worker(message.session_id)
        if worker is not None:
            worker.submit(message)
        elif self.rt.store.get_session(message.session_id) is not None:
            self.busy[message.id] = message
            self._busy_added.set()

    async def _retry_busy(self) -> None:
        """Retry the messages of busy sessions until each is answered or its session is free."""
        store = self.rt.store
        while True:
            await self._busy_added.wait()
            await trio.sleep(BUSY_RETRY_S)
            waiting, self.busy = self.busy, {}
            self._busy_added = trio.Event()
            for message in waiting.values():
                current = store.get_message(message.id)
                if current is not None and current.status in (Status.PENDING, Status.PROCESSING):
                    self.submit(current)

    def compact(self, session_id: str) -> bool:
        """Compact a session as soon as it has no running turn (``/compact``).

        Returns:
            False when the session does not exist. The outcome arrives as a
            :class:`~kesoku.vocab.events.Compacted` event.
        """
        worker = self._worker(session_id)
        if worker is None:
            return False
        worker.request_compaction()
        return True

    def _worker(self, session_id: str) -> SessionWorker | None:
        """The session's worker, started if needed.

        None if the session is deleted or held elsewhere.
        """
        assert self._nursery is not None, "the dispatcher is not running"
        worker = self.workers.get(session_id)
        if worker is None:
            session = self.rt.store.get_session(session_id)
            if session is None or not self._lock(session.id):
                return None
            learned = self.learned.pop(session.id, None)
            worker = self.workers[session.id] = SessionWorker(self.rt, session, learned)
            self._nursery.start_soon(self._run_worker, worker, name=f"worker {session.id}")
        return worker

    def _lock(self, session_id: str) -> bool:
        """Take the session's lock; False if another process holds it or it cannot be taken now."""
        try:
            held = self.rt.gateway.locks.acquire(session_id)
        except OSError as exc:
            if session_id not in self._starved:  # one line per session until it gets through
                self._starved[session_id] = 0
                log.warning(
                    "session %s: cannot take its lock (%s); "
                    "its messages wait and are retried every %g s",
                    session_id,
                    exc,
                    BUSY_RETRY_S,
                )
            return False
        if held and self._starved.get(session_id) == 0:
            del self._starved[session_id]
            log.info("session %s: its lock was taken at last", session_id)
        return held

    async def ended(self, worker: SessionWorker) -> None:
        """Wait until ``worker`` has returned and let its session's lock go (at once if it has).

        Cancellation:
            Safe: the wait only ends; the worker goes on.
        """
        if self.workers.get(worker.session.id) is worker:
            await self._ended.setdefault(id(worker), trio.Event()).wait()

    def stop(self, session_id: str, *, force: bool = False) -> bool:
        """Stop a session's running turn (see :meth:`SessionWorker.stop`); False if none runs."""
        worker = self.workers.get(session_id)
        return worker.stop(force=force) if worker is not None else False

    async def _run_worker(self, worker: SessionWorker) -> None:
        sid = worker.session.id
        starved = False
        try:
            await worker.serve()
            self._starved.pop(sid, None)
        except Exception as exc:
            worker.turn = None
            starved = self._out_of_files(sid, exc)
            # A database locked too long, a session's backend that cannot be built (no key, no
            # extra): the operator's to fix, one line.
            if isinstance(exc, OperatorError):
                log.error("session %s: %s", sid, exc)
                await self._report_crash(worker.current_roots, exc)
            elif not starved:
                self.crashes += 1
                log.exception("session worker %s crashed", sid)
                await self._report_crash(worker.current_roots, exc)
        finally:
            # An idle worker sheds everything but what its compactor learned: the next one reloads
            # the history, view and taint from the store and takes the lock again.
            worker.history.close()
            if self.workers.get(sid) is worker:
                del self.workers[sid]
                self._keep_learned(sid, worker.learned())
            self.rt.gateway.locks.release(sid)
            if (ended := self._ended.pop(id(worker), None)) is not None:
                ended.set()
        if starved:  # the cut turn and what waited for it are tried again later, not at once
            for message in [*worker.current_roots, *worker.pending.values()]:
                self.busy[message.id] = message
            self._busy_added.set()
            return
        # Messages that arrived for the crashed worker still deserve an answer: give them a new one.
        for message in worker.pending.values():
            self.submit(message)

    def _keep_learned(self, session_id: str, learned: Learned | None) -> None:
        if learned is None:
            return
        self.learned[session_id] = learned
        if len(self.learned) > LEARNED_SESSIONS:
            del self.learned[next(iter(self.learned))]

    def _out_of_files(self, session_id: str, exc: Exception) -> bool:
        """Whether a worker failure is a want of descriptors to retry later (with a warning)."""
        if not isinstance(exc, OSError) or exc.errno not in _OUT_OF_FILES:
            return False
        failures = self._starved[session_id] = self._starved.get(session_id, 0) + 1
        if failures > OUT_OF_FILES_RETRIES:
            return False
        log.warning(
            "session %s: out of file descriptors (%s); its turn is retried in %g s (%d/%d)",
            session_id,
            exc,
            BUSY_RETRY_S,
            failures,
            OUT_OF_FILES_RETRIES,
        )
        return True

    async def _report_crash(self, roots: list[Message], exc: Exception) -> None:
        if not roots:
            return
        store = self.rt.store
        root = roots[-1]
        if isinstance(exc, StoreError):
            text = f"⚠ Kesoku could not store this turn and gave up on it: {exc}."
        elif isinstance(exc, OperatorError):
            text = f"⚠ This session's model cannot be used: {exc}"
        else:
            text = (
                "⚠ Kesoku hit an internal error and gave up on this turn "
                f"({type(exc).__name__}: {exc})."
            )
        try:
            store.set_status((r.id for r in roots), Status.FAILED)
            await self.rt.gateway.post(in_turn(root, Role.SYSTEM, Kind.TEXT, text))
        except StoreError as failure:  # the database is still locked: the log line is all there is
            log.error(
                "session %s: the failed turn could not be recorded: %s", root.session_id, failure
            )
        metrics = TurnMetrics(
            session_id=root.session_id,
            root_id=root.id,
            state=TurnState.FAILED,
            session_turns=store.count_turns(root.session_id),
            context_tokens=0,
            tool_calls=0,
            turn_tokens=0,
            model_calls=0,
            turn_s=0.0,
        )
        self.rt.hub.publish(TurnEnded(root.session_id, metrics))
