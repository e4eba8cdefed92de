"""The scheduler: each due schedule posts its prompt into its target session, once.

A run is a user message from ``Scheduler`` whose external id is ``schedule:<name>:<planned time>``:
the message log's dedupe makes it exactly once across restarts and across processes on one database
(both may post; one message is stored). The run is posted first and the schedule advanced after, so
a crash in between only posts the same run again, which the dedupe drops. A run more than
:data:`LATE_S` late was missed (the daemon was down): ``missed = "catchup"`` posts one run for all
the missed ones, ``"skip"`` none; never a burst. Schedules live in the store
(:class:`~kesoku.vocab.schedule.Schedule`); ARCHITECTURE.md, "Schedules".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import msgspec
import trio

from kesoku.vocab.errors import OperatorError
from kesoku.vocab.model import Message, Metadata, Session, user_text
from kesoku.vocab.schedule import (
    HEARTBEAT,
    RUN_SENDER,
    SCHEDULE_KEY,
    Schedule,
    ScheduleError,
    new_schedule,
    next_run,
)
from kesoku.vocab.spend import BUDGET_GROUP_KEY, BudgetExceeded

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime
    from kesoku.config.settings import Config, HeartbeatConfig
    from kesoku.store import Store

log = logging.getLogger(__name__)

LATE_S = 60.0
"""A run this late was missed (downtime), and follows the schedule's ``missed`` rule."""
IDLE_S = 5.0
"""Longest sleep between two looks at the schedules: one ``kesoku schedule add`` (another process)
made is seen within it. A look is one indexed query."""
NEW_SESSION_ADAPTER = "schedule"
"""The adapter of the sessions the targets ``new`` (one per run) and ``own`` (one per schedule)
open: no chat platform delivers them; their answers stay in the store."""


def run_external_id(name: str, planned: float) -> str:
    """The external id of a run: the schedule and its planned time (whole seconds)."""
    return f"schedule:{name}:{planned:.0f}"


class Scheduler:
    """Posts the runs of due schedules; one more ``serve()`` under the daemon's nursery.

    Args:
        rt: The runtime (gateway, store, budget).
        adapters: Target prefix → the adapter's chatbot id (``{"discord": "discord", "gchat":
            "gchat"}``).
        clock: Wall time, UNIX seconds (tests tie it to trio's clock).
        config: The channel entries (``[[discord.channels]]``, ``[[gchat.spaces]]``) whose backend
            and spend caps a channel session the scheduler opens gets; None: none.
    """

    def __init__(
        self,
        rt: Runtime,
        adapters: Mapping[str, str],
        *,
        clock: Callable[[], float] = time.time,
        config: Config | None = None,
    ) -> None:
        self.rt = rt
        self.adapters = dict(adapters)
        self.config = config
        self.clock = clock
        self._wake = trio.Event()

    def wake(self) -> None:
        """A schedule changed in this process: look again now."""
        self._wake.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Post due runs until cancelled; sleeps until the next planned run (or :data:`IDLE_S`)."""
        task_status.started()
        while True:
            await self.run_due()
            upcoming = self.rt.store.next_schedule_time()
            delay = IDLE_S if upcoming is None else min(IDLE_S, upcoming - self.clock())
            if self._wake.is_set():
                self._wake = trio.Event()
                continue
            with trio.move_on_after(max(delay, 0.0)):
                await self._wake.wait()
            self._wake = trio.Event()

    async def run_due(self) -> int:
        """Post the run of every due schedule; returns how many were posted."""
        now = self.clock()
        posted = 0
        for schedule in self.rt.store.due_schedules(now):
            try:
                posted += await self.fire(schedule, now)
            except Exception as exc:  # a bug, or a row edited by hand: stop it, not the daemon
                log.exception(
                    "schedule %s: failed; no further runs until it is changed", schedule.name
                )
                planned = schedule.next_run
                assert planned is not None
                self.rt.store.advance_schedule(
                    schedule.name, planned=planned, next_run=None, last_note=f"failed: {exc}"
                )
        return posted

    async def fire(self, schedule: Schedule, now: float) -> bool:
        """Post one run of a due schedule and plan the next; True when a run was posted.

        Skipped: a missed run under ``missed = "skip"``, a target that is gone, a reached spend
        cap (said once: in the log and in the schedule's note, until a run goes out again).
        """
        planned = schedule.next_run
        assert planned is not None
        following = next_run(schedule, max(now, planned))
        store = self.rt.store
        if now - planned > LATE_S and schedule.missed == "skip":
            store.advance_schedule(schedule.name, planned=planned, next_run=following)
            log.info("schedule %s: missed run skipped (missed = skip)", schedule.name)
            return False
        try:
            session = self.session_for(schedule, planned)
            self.rt.budget.check(session)
        except (OperatorError, BudgetExceeded) as exc:
            note = f"not run: {exc}"
            if isinstance(exc, BudgetExceeded):  # its notice counts down: keep the note steady
                at = exc.resets_at
                until = time.strftime(" until %Y-%m-%d %H:%M", time.localtime(at)) if at else ""
                note = f"not run: spend cap {exc.cap} reached{until}"
            if note != schedule.last_note:
                log.warning("schedule %s: %s", schedule.name, note)
            store.advance_schedule(
                schedule.name, planned=planned, next_run=following, last_note=note
            )
            return False
        stored = await self.post_run(schedule, session, planned=planned)
        moved = store.advance_schedule(
            schedule.name,
            planned=planned,
            next_run=following,
            last_run=now,
            last_message_id=stored.id,
        )
        if not moved:  # another daemon on this database posted the same run first (one stored)
            return False
        late = now - planned
        log.info(
            "schedule %s: run posted to session %s%s",
            schedule.name,
            session.id,
            f" ({late:.0f} s late: one run for the missed ones)" if late > LATE_S else "",
        )
        return True

    async def post_run(
        self, schedule: Schedule, session: Session, *, planned: float, manual: bool = False
    ) -> Message:
        """Post one run's user message (a duplicate of a posted run returns the stored one).

        Args:
            schedule: The schedule.
            session: Its target session (:meth:`session_for`).
            planned: The run's planned time, UNIX seconds.
            manual: ``kesoku schedule run``: an extra run, not a planned one.
        """
        external_id = run_external_id(schedule.name, planned)
        if manual:
            external_id = f"schedule:{schedule.name}:manual:{planned:.3f}"
        message = user_text(session.id, schedule.prompt, sender=RUN_SENDER, external_id=external_id)
        extra = {SCHEDULE_KEY: {"name": schedule.name, "planned": planned, "manual": manual}}
        message = msgspec.structs.replace(message, metadata=Metadata(extra=extra))
        return await self.rt.gateway.post(message)

    def session_for(self, schedule: Schedule, planned: float) -> Session:
        """The session a run goes to (opened when the target is a channel or ``new``).

        Raises:
            OperatorError: The target session is gone, or its adapter is unknown.
        """
        gateway = self.rt.gateway
        kind, _, where = schedule.target.partition(":")
        if kind == "session":
            session = gateway.get_session(where)
            if session is None:
                raise OperatorError(f"its target session {where} no longer exists")
            return session
        if kind in ("new", "own"):
            key = f"{schedule.name}/{planned:.0f}" if kind == "new" else schedule.name
            return gateway.open_session(
                NEW_SESSION_ADAPTER, key, title=f"⏰ {schedule.name}", llm=schedule.llm
            )
        adapter = self.adapters.get(kind)
        if adapter is None or not where:
            raise OperatorError(f"unknown target {schedule.target!r}")
        llm, group = self._channel_entry(kind, where)
        metadata = {BUDGET_GROUP_KEY: group} if group else None
        return gateway.open_session(adapter, where, llm=schedule.llm or llm, metadata=metadata)

    def _channel_entry(self, kind: str, where: str) -> tuple[str | None, str]:
        """The backend and spend-cap group a channel entry gives a session it opens.

        As the adapter would: the first ``[[discord.channels]]`` entry naming the channel by id, or
        ``[[gchat.spaces]]`` entry naming the space (a thread's space). Names the adapter matches
        through the platform (a Discord channel's name) are not known here.
        """
        config = self.config
        if config is None:
            return None, ""
        if kind == "discord":
            for channel in config.discord.channels:
                if where in channel.channels:
                    return channel.llm, channel.label
            return None, ""
        space = "/".join(where.split("/")[:2])
        for entry in config.gchat.spaces:
            if space in entry.spaces:
                return entry.llm or config.gchat.llm, entry.label
        return config.gchat.llm, ""


def adapter_targets(config: Config) -> dict[str, str]:
    """Target prefix → chatbot id of the adapters a schedule may post into."""
    return {"discord": config.discord.chatbot_id, "gchat": config.gchat.chatbot_id}


def sync_heartbeat(store: Store, config: HeartbeatConfig, now: float) -> Schedule | None:
    """Keep the ``heartbeat`` schedule as ``[heartbeat]`` says (at start; its next run is kept).

    Raises:
        OperatorError: ``[heartbeat]`` holds a bad period or target.
    """
    current = store.get_schedule(HEARTBEAT)
    if not config.every:
        if current is not None and current.created_by == "config":
            store.delete_schedule(HEARTBEAT)
        return None
    try:
        wanted = new_schedule(
            HEARTBEAT,
            prompt=config.prompt,
            every=config.every,
            target=config.target,
            missed="skip",
            created_by="config",
            now=now,
        )
    except ScheduleError as exc:
        raise OperatorError(f"[heartbeat] {exc}") from None
    same = current is not None and (current.spec, current.target, current.prompt) == (
        wanted.spec,
        wanted.target,
        wanted.prompt,
    )
    if not same:
        store.put_schedule(wanted)
        return wanted
    return current
