"""Schedules: what runs when, and where its answer goes (ARCHITECTURE.md, "Schedules").

A schedule is ``every`` a duration, a ``cron`` expression in a time zone, or one time ``at``; each
run posts its prompt as a user message into its target session. Cron expressions are parsed and
stepped by ``cronsim`` (the maintained evaluator of healthchecks.io): five fields, ``L``, ``W``,
``#``, names, and daylight-saving changes handled as cron does (a time that does not exist that day
runs at the first time after it; a time that occurs twice runs once).
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from kesoku.vocab.model import Kind, Message, Role

ScheduleKind = Literal["every", "cron", "at"]
Missed = Literal["catchup", "skip"]
RUN_SENDER = "Scheduler"
"""The sender of a scheduled run's user message."""
SCHEDULE_KEY = "schedule"
"""``metadata.extra`` key of a run's user message: ``{"name": …, "planned": UNIX seconds}``."""
MIN_EVERY_S = 1.0
"""The shortest ``every``."""
HEARTBEAT = "heartbeat"
"""The name of the schedule ``[heartbeat]`` keeps."""
HEARTBEAT_OK = "HEARTBEAT_OK"
"""A heartbeat run's whole answer when nothing needs attention: the chat adapters show nothing of
that turn."""

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")


class ScheduleError(ValueError):
    """A schedule's fields are wrong; the message names the field and what was expected."""


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """One schedule as stored.

    Attributes:
        name: Unique; the CLI and the tool name it.
        kind: ``every``, ``cron`` or ``at``.
        spec: The duration in seconds (``every``), the expression (``cron``) or the ISO time
            (``at``).
        tz: The IANA time zone of ``cron`` and of an ``at`` without an offset; empty: local.
        prompt: What each run posts.
        target: ``session:<id>``, ``discord:<channel or thread id>``, ``gchat:<space or thread>``,
            ``new`` (a new session per run) or ``own`` (one session of the schedule's own, kept
            across its runs).
        llm: A backend for the runs' sessions (a new session's override), or None.
        missed: After downtime, ``catchup`` (one run for all missed) or ``skip`` (none).
        enabled: False while paused.
        created_at: UNIX seconds.
        created_by: ``cli``, ``config`` (the heartbeat) or the session id of the agent that made it.
        next_run: The next planned run, UNIX seconds; None when no run is left (an ``at`` that ran).
        last_run: When the last run was posted, UNIX seconds.
        last_message_id: The last run's user message (its status is the run's outcome).
        last_note: Why the last planned run did not go out (a reached spend cap), or empty.
    """

    name: str
    kind: ScheduleKind
    spec: str
    prompt: str
    target: str
    tz: str = ""
    llm: str | None = None
    missed: Missed = "catchup"
    enabled: bool = True
    created_at: float = 0.0
    created_by: str = "cli"
    next_run: float | None = None
    last_run: float | None = None
    last_message_id: int | None = None
    last_note: str = ""

    def describe(self) -> str:
        """``every 30m``, ``cron 0 8 * * 1-5 (Europe/Paris)``, ``at 2026-12-24T17:00``."""
        if self.kind == "every":
            return f"every {format_duration(float(self.spec))}"
        where = f" ({self.tz})" if self.tz else ""
        if self.kind == "at":
            when = dt.datetime.fromtimestamp(float(self.spec), zone(self.tz))
            return f"at {when.isoformat(timespec='minutes')}"
        return f"cron {self.spec}{where}"


def parse_duration(text: str) -> float:
    """Seconds of ``2s``, ``30m``, ``1h``, ``1d`` or a sum (``1h30m``).

    Raises:
        ScheduleError: Not a duration, or shorter than :data:`MIN_EVERY_S`.
    """
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise ScheduleError(f"every: {text!r} is not a duration such as 30s, 15m, 2h or 1h30m")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds < MIN_EVERY_S:
        raise ScheduleError(f"every: {text!r} is shorter than {MIN_EVERY_S:g} s")
    return seconds


def format_duration(seconds: float) -> str:
    """``90`` → ``1m30s``; the largest units first."""
    left, out = round(seconds), ""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            out += f"{left // size}{unit}"
            left %= size
    return out or "0s"


def zone(name: str) -> dt.tzinfo:
    """The time zone ``name`` names (empty: the local one).

    Raises:
        ScheduleError: No such IANA zone.
    """
    if not name:
        local = dt.datetime.now().astimezone().tzinfo
        assert local is not None
        return local
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(f"tz: {name!r} is not an IANA time zone (Europe/Paris, UTC)") from None


def parse_at(text: str, tz: str = "") -> float:
    """UNIX seconds of an ISO time (``2026-12-24T17:00``; no offset: in ``tz``).

    Raises:
        ScheduleError: Not an ISO 8601 date and time.
    """
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ScheduleError(f"at: {text!r} is not a time such as 2026-12-24T17:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=zone(tz))
    return when.timestamp()


def check_cron(expr: str) -> None:
    """Raise :class:`ScheduleError` naming what is wrong with a cron expression."""
    from cronsim import CronSim, CronSimError

    fields = len(expr.split())
    if fields != 5:  # cronsim also takes a sixth field, seconds: not what a user means here
        raise ScheduleError(
            f"cron: {expr!r}: 5 fields (minute hour day month weekday), not {fields}"
        )
    try:
        CronSim(expr, dt.datetime.now(dt.UTC))
    except CronSimError as exc:
        raise ScheduleError(f"cron: {expr!r}: {exc}") from None


def next_run(schedule: Schedule, after: float) -> float | None:
    """The first planned run strictly after ``after`` (UNIX seconds); None when none is left.

    ``every`` counts from the schedule's last planned run (``next_run``, else its creation), so a
    late run does not shift the ones after it.
    """
    if schedule.kind == "at":
        planned = float(schedule.spec)
        return planned if planned > after else None
    if schedule.kind == "every":
        period = float(schedule.spec)
        base = schedule.next_run if schedule.next_run is not None else schedule.created_at
        if base > after:
            return base
        steps = int((after - base) // period) + 1
        return base + steps * period
    from cronsim import CronSim

    start = dt.datetime.fromtimestamp(after, zone(schedule.tz))
    return next(iter(CronSim(schedule.spec, start))).timestamp()


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TARGET = re.compile(r"new|own|(session|discord|gchat):\S+")


def check_target(target: str) -> None:
    """Raise :class:`ScheduleError` unless ``target`` is a schedule's target."""
    if not _TARGET.fullmatch(target):
        raise ScheduleError(
            f"target: {target!r}: expected new, own, session:ID, discord:CHANNEL_ID or gchat:SPACE"
        )


def new_schedule(
    name: str,
    *,
    prompt: str,
    every: str | None = None,
    cron: str | None = None,
    at: str | None = None,
    tz: str = "",
    target: str = "new",
    llm: str | None = None,
    missed: Missed = "catchup",
    created_by: str = "cli",
    now: float,
) -> Schedule:
    """Check a new schedule's fields and plan its first run.

    An ``every`` schedule first runs one period after ``now``; a cron one at its next match.

    Raises:
        ScheduleError: A field is wrong (the message names it), or an ``at`` time is past.
    """
    if not _NAME.fullmatch(name):
        raise ScheduleError(
            f"name: {name!r}: use ASCII letters and digits, '.', '_' or '-' (64 at most)"
        )
    if not prompt.strip():
        raise ScheduleError("prompt: empty; a run posts it as the user's message")
    check_target(target)
    given = [(k, v) for k, v in (("every", every), ("cron", cron), ("at", at)) if v is not None]
    if len(given) != 1:
        raise ScheduleError("give exactly one of every, cron or at")
    kind, value = given[0]
    if kind == "every" and tz:
        raise ScheduleError(
            "tz: applies to cron and at; every is a period of elapsed time (for a time of day, "
            "across daylight saving changes too, use cron)"
        )
    zone(tz)  # a wrong zone is an error now, not at the first run
    if kind == "every":
        spec = repr(parse_duration(value))
    elif kind == "cron":
        check_cron(value)
        spec = value.strip()
    else:
        when = parse_at(value, tz)
        if when <= now:
            raise ScheduleError(f"at: {value!r} is in the past")
        spec = repr(when)
    draft = Schedule(
        name=name,
        kind=kind,  # type: ignore[arg-type]
        spec=spec,
        prompt=prompt,
        target=target,
        tz=tz,
        llm=llm,
        missed=missed,
        created_at=now,
        created_by=created_by,
    )
    first = now + float(spec) if kind == "every" else next_run(draft, now)
    return msgspec.structs.replace(draft, next_run=first)


def schedule_lines(schedules: list[Schedule], *, now: float) -> list[str]:
    """One line per schedule, for /schedules and the tool: what, when next, and the prompt.

    ``standup: cron 0 9 * * 1-5 (Europe/Paris) · next Thu 2026-12-03 09:00 CET · "Sum up…"``.
    """
    lines = []
    for s in schedules:
        if not s.enabled:
            when = "paused"
        elif s.next_run is None:
            when = "done"
        else:
            local = dt.datetime.fromtimestamp(s.next_run, zone(s.tz))
            when = f"next {local:%a %Y-%m-%d %H:%M %Z}"
        note = f" · {s.last_note}" if s.last_note else ""
        lines.append(f'{s.name}: {s.describe()} · {when} · "{short_prompt(s)}"{note}')
    return lines


def short_prompt(schedule: Schedule, width: int = 60) -> str:
    """The schedule's prompt on one line, cut to ``width`` characters with "…"."""
    prompt = " ".join(schedule.prompt.split())
    return prompt if len(prompt) <= width else prompt[: width - 1] + "…"


def is_heartbeat_run(message: Message) -> bool:
    """Whether a user message is a run of the ``heartbeat`` schedule (``[heartbeat]``)."""
    run = message.metadata.extra.get(SCHEDULE_KEY)
    return isinstance(run, dict) and run.get("name") == HEARTBEAT


@dataclass
class HeldTurn:
    """A heartbeat run's turn a chat adapter keeps back until its end says whether to show it."""

    session_id: str
    root: Message
    messages: list[Message] = field(default_factory=list)

    def quiet(self) -> bool:
        """Its last answer is ``HEARTBEAT_OK``: nothing needs attention, nothing is shown."""
        answers = [m for m in self.messages if m.role is Role.ASSISTANT and m.kind is Kind.TEXT]
        return bool(answers) and answers[-1].content.strip() == HEARTBEAT_OK


SCHEDULES_COMMAND = "/schedules"
"""A chat message of exactly this (the bot's mention aside) lists the conversation's schedules."""


def schedules_reply(lines: Sequence[str], target: str) -> str:
    """What ``/schedules`` answers: the schedules' lines, or how to make one.

    Args:
        lines: From :func:`schedule_lines`.
        target: The conversation as ``kesoku schedule add --to`` names it (``discord:<id>``).
    """
    if lines:
        return "\n".join(lines)
    return (
        "No schedules in this conversation. Ask me to make one (“every weekday at 9, …”), or on "
        f"the server: `kesoku schedule add NAME --to {target} --every 1h --prompt …`"
    )
