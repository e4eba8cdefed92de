"""``kesoku chat "prompt"`` answered in this process: the runtime, the follower, the signals (trio).

The output, the controls and the exit codes are :mod:`kesoku_terminal.plain`'s.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import trio

from kesoku.vocab.model import DENY, parse_answer, user_text
from kesoku_terminal.plain import (
    SIGNALS,
    Controls,
    PlainSink,
    ask_line,
    finish,
    live_answer,
)
from kesoku_terminal.view import Follower, StoreLog, user_name

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.vocab.model import Message, Session


async def run_oneshot(rt: Runtime, session: Session, prompt: str) -> int:
    """Ask one question in ``session`` and show the turn that answers it.

    Args:
        rt: The runtime (not yet serving: this runs it).
        session: The session to ask in.
        prompt: The question (stdin already appended).

    Returns:
        The exit code (see the module docstring).

    Cancellation:
        Ctrl-C (SIGINT) stops the turn (a second one kills running tools); the turn ends ``stopped``
        and its metrics line is printed before 130 is returned. SIGTERM and SIGHUP stop it and kill
        its tools at once; 128 + the signal number is returned. A signal before the question is
        stored (while the runtime starts, or while the question waits for a locked database) ends
        the chat there: nothing is stored or asked, :data:`NOT_ASKED` says so, and 128 + the signal
        number is returned.
    """
    sink = PlainSink(sys.stdout, sys.stderr, err_tty=sys.stderr.isatty())
    stops = Controls(
        lambda force: rt.gateway.stop(session.id, force=force),
        lambda question_id, choice, by: rt.questions.answer(question_id, choice, by=by),
        sink.notice,
    )
    follower = Follower(
        rt.hub,
        StoreLog(rt.store),
        session.id,
        sink,
        on_event=stops.on_event,
        live_answer=live_answer(),
    )
    # Until the question is stored a signal cancels this scope (entered or not yet), so that the
    # question is never posted after a Ctrl-C that came while the runtime was starting.
    posting = trio.CancelScope()
    stops.posting = posting.cancel
    async with trio.open_nursery() as nursery:

        async def ask(question: Message) -> None:
            line = await trio.to_thread.run_sync(ask_line, abandon_on_cancel=True)
            stops.answer(question.id, parse_answer(line) or DENY, user_name())

        stops.ask = lambda question: nursery.start_soon(ask, question)
        await nursery.start(watch_signals, stops)  # first: Ctrl-C from here on is ours to handle
        await nursery.start(follower.run)
        await nursery.start(rt.serve)
        mine: Message | None = None
        with posting:
            stops.apply()
            mine = await rt.gateway.post(user_text(session.id, prompt))
        stops.stored(asked=mine is not None)
        if mine is not None:  # the turn that answers `mine` is rooted on it or on a later message
            await follower.wait_ended(mine.id)
        nursery.cancel_scope.cancel()
    return finish(sink, stops, session.id, asked=mine is not None)


async def watch_signals(
    stops: Controls, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Hand each signal of :data:`SIGNALS` to ``stops`` until cancelled."""
    with trio.open_signal_receiver(*SIGNALS) as signals:
        task_status.started()
        async for signum in signals:
            stops.on_signal(signum)
