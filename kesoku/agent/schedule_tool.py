"""The ``schedule`` tool: the agent plans a task in its own conversation ("I'll check at 9").

A schedule made or changed from a chat is a question the user must allow: a prompt injection (a
web page, a file) must not plant a task that runs later with the session's tools. Its runs go to the
conversation that made it (``session:<id>``); the agent lists and removes only that conversation's
schedules, and removing needs no question. Offered by the daemon, which runs schedules
(kesoku/agent/scheduler.py).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING, Literal

from kesoku.tools.base import Tool, ToolContext
from kesoku.tools.schema import tool_from_function
from kesoku.vocab.errors import ToolError
from kesoku.vocab.schedule import ScheduleError, new_schedule, schedule_lines

if TYPE_CHECKING:
    from kesoku.agent.runtime import Runtime


def schedule_tool(rt: Runtime) -> Tool:
    """The ``schedule`` tool of a runtime (its store, and the scheduler it wakes)."""

    async def schedule(  # noqa: D417 (the names say it; every word goes with each call)
        ctx: ToolContext,
        action: Literal["create", "list", "remove"],
        name: str = "",
        when: str = "",
        prompt: str = "",
        tz: str = "",
    ) -> str:
        """Plan a prompt to run later here (create replaces, and asks the user).

        Args:
            when: every 30m | cron 0 9 * * 1-5 | at 2026-12-24T17:00
            prompt: Said to you at each run.
            tz: IANA zone (default: the server's).
        """
        store = rt.store
        session_id = ctx.session.id
        now = time.time()
        clock = f"Now: {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}."
        mine = rt.gateway.schedules_of(ctx.session)
        if action == "list":
            lines = schedule_lines(mine, now=now) or ["No schedule in this conversation."]
            return "\n".join([clock, *lines])
        current = store.get_schedule(name)
        if action == "remove":
            if current is None or current.created_by != session_id:
                raise ToolError(f"no schedule {name!r} made in this conversation ({clock})")
            store.delete_schedule(name)
            return f"Removed {name}."
        if current is not None and current.created_by != session_id:
            raise ToolError(f"{name!r} names another conversation's schedule: pick another name")
        kind, _, value = when.strip().partition(" ")
        if kind not in ("every", "cron", "at"):
            raise ToolError(
                f"when: {when!r}: expected every 30m, cron 0 9 * * 1-5 or at 2026-12-24T17:00"
            )
        times = {kind: value.strip()}
        try:
            made = new_schedule(
                name,
                prompt=prompt,
                **times,
                tz=tz,
                target=f"session:{session_id}",
                created_by=session_id,
                missed="skip",
                now=now,
            )
        except ScheduleError as exc:
            raise ToolError(f"{exc} ({clock})") from None
        (line,) = schedule_lines([made], now=now)
        approval = await ctx.confirm(
            f"schedule wants to plan a task in this conversation: {line}. Allow?"
        )
        if not approval.allowed:
            raise ToolError(f"not scheduled: the user did not allow it ({approval.note})")
        store.put_schedule(made)
        if rt.scheduler is not None:
            rt.scheduler.wake()
        return f"Scheduled. {line} {clock}"

    return tool_from_function(schedule)
