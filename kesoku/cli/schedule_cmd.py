"""``kesoku schedule``: add, list, run, pause, resume and remove scheduled tasks.

The schedules live in the database; ``kesoku start`` runs them (kesoku/agent/scheduler.py).
"""

from __future__ import annotations

import datetime as dt
import signal
import sys
import time
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec
from cyclopts import Parameter

from kesoku.cli.sessions_cmd import ConfigOption, no_database, open_store
from kesoku.config.settings import Backend
from kesoku.vocab.errors import OperatorError
from kesoku.vocab.model import Status

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.store import Store
    from kesoku.vocab.schedule import Schedule


_NONE = 'no schedules (kesoku schedule add NAME --every 1h --prompt "…")'


def _get(store: Store, name: str) -> Schedule:
    found = store.get_schedule(name)
    if found is None:
        names = ", ".join(s.name for s in store.list_schedules()) or "none yet"
        raise OperatorError(f"no schedule named {name!r} (schedules: {names})")
    return found


def add(
    name: str,
    /,
    *,
    prompt: Annotated[str, Parameter(name="--prompt")],
    every: Annotated[str | None, Parameter(name="--every")] = None,
    cron: Annotated[str | None, Parameter(name="--cron")] = None,
    at: Annotated[str | None, Parameter(name="--at")] = None,
    tz: Annotated[str, Parameter(name="--tz")] = "",
    session: Annotated[str | None, Parameter(name="--session")] = None,
    to: Annotated[str | None, Parameter(name="--to")] = None,
    llm: Annotated[Backend | None, Parameter(name="--llm")] = None,
    missed: Annotated[Literal["catchup", "skip"], Parameter(name="--missed")] = "catchup",
    config: ConfigOption = None,
) -> None:
    """Add a schedule (or replace the one of that name): its prompt runs as a user message.

    Examples: ``kesoku schedule add standup --cron "0 9 * * 1-5" --tz Europe/Paris --to
    discord:1234567890 --prompt "Summarise yesterday's commits"``, ``kesoku schedule add check
    --every 30m --prompt "Is the site up?"``, ``kesoku schedule add remind --at 2026-12-24T17:00
    --session 3f2a --prompt "Remind me to call home"``. ``kesoku start`` runs them; each run is
    posted once, even across restarts and several processes.

    Args:
        name: ASCII letters and digits, '.', '_' or '-'.
        prompt: What each run says to the agent.
        every: A period of elapsed time: 30s, 15m, 2h, 1d, 1h30m (the first run is one period from
            now; 1d is 24 h, so it drifts by an hour across a daylight saving change: for a time
            of day use --cron).
        cron: Five cron fields (minute hour day month weekday), in --tz.
        at: One time, ISO 8601 (2026-12-24T17:00), in --tz unless it has an offset.
        tz: An IANA time zone (Europe/Paris) for --cron and --at. Default: this machine's.
        session: Run in this session (id or unique prefix).
        to: Run in a chat: discord:CHANNEL_OR_THREAD_ID or gchat:SPACE (spaces/AAAA, or a thread).
            Default (no --session, no --to): a new session per run, answered in the database only.
        llm: A backend for the run's session, when the run opens it.
        missed: After downtime, catchup (one run for all missed) or skip (none).
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.host.build import INTERACTIVE_ADAPTER
    from kesoku.vocab.errors import AmbiguousSessionError, UnknownSessionError
    from kesoku.vocab.schedule import ScheduleError, new_schedule

    if session is not None and to is not None:
        raise OperatorError("schedule add: give --session or --to, not both")
    with open_store(config, create=True) as (cfg, store):
        target = "new" if to is None else to
        if session is not None:
            try:
                found = store.resolve_session(session)
            except (AmbiguousSessionError, UnknownSessionError) as exc:
                raise OperatorError(f"schedule add: --session {session}: {exc}") from None
            if found.adapter == INTERACTIVE_ADAPTER:
                raise OperatorError(
                    f"schedule add: --session {session}: a terminal session, which only kesoku "
                    "chat answers (the daemon does not): use no target, or --to a chat"
                )
            target = f"session:{found.id}"
        try:
            schedule = new_schedule(
                name,
                prompt=prompt,
                every=every,
                cron=cron,
                at=at,
                tz=tz,
                target=target,
                llm=llm,
                missed=missed,
                now=time.time(),
            )
        except ScheduleError as exc:
            raise OperatorError(f"schedule add: {exc}") from None
        replaced = store.get_schedule(name) is not None
        store.put_schedule(schedule)
    verb = "replaced" if replaced else "added"
    print(f"{verb} {name}: {schedule.describe()} → {schedule.target}; next run {_when(schedule)}")
    kind = schedule.target.partition(":")[0]
    enabled = {"discord": cfg.discord.enabled, "gchat": cfg.gchat.enabled}.get(kind, True)
    if not enabled:
        print(
            f"warning: [{kind}] is not enabled in kesoku.toml: its runs will be answered but not "
            "delivered to the chat",
            file=sys.stderr,
        )


def list_schedules(*, config: ConfigOption = None) -> None:
    """List the schedules: when each runs, where, its prompt, next run, last run and outcome.

    Args:
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.vocab.schedule import short_prompt

    if no_database(config) is not None:
        print(_NONE)
        return
    with open_store(config) as (_, store):
        schedules = store.list_schedules()
        if not schedules:
            print(_NONE)
            return
        for s in schedules:
            state = "" if s.enabled else " (paused)"
            print(f"{s.name}{state}: {s.describe()} → {s.target}")
            print(f'  prompt: "{short_prompt(s, 90)}"')
            print(f"  next: {_when(s)} · last: {_last(store, s)}")
            if s.last_note:
                print(f"  note: {s.last_note}")


def run(name: str, /, *, config: ConfigOption = None) -> None:
    """Run a schedule once, now, and print the answer (its next planned run does not move).

    The run is posted like a planned one: into its target session, where a running daemon's
    adapter delivers the answer as well. If no daemon answers the session, this process does. It
    counts as the schedule's last run. Exit 0 when the turn answered, 1 otherwise, 130 after
    Ctrl-C and 143 after SIGTERM (the run is then marked interrupted: no restart takes it up).

    Args:
        name: The schedule.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    import trio

    from kesoku.config.settings import set_config
    from kesoku.host.build import build_runtime

    with open_store(config) as (cfg, store):
        set_config(cfg)
        schedule = _get(store, name)
        session_ids: set[str] = set()
        rt = build_runtime(cfg, store, serves=session_ids.__contains__)
        roots: list[int] = []
        code = 130
        try:
            code = trio.run(_run_now, rt, cfg, schedule, session_ids, roots)
        except* KeyboardInterrupt:  # raised in the task that was running: inside a nursery's group
            code = 130
        if code in (130, _TERMINATED):
            # The run is over: a restart must not take it up again and pay for it.
            store.set_status(roots, Status.INTERRUPTED)
            print("interrupted: the run was stopped", file=sys.stderr)
        raise SystemExit(code)


_TERMINATED = 128 + 15  # SIGTERM's exit code, as a shell reports it


async def _run_now(
    rt: object, cfg: Config, schedule: Schedule, session_ids: set[str], roots: list[int]
) -> int:
    import trio

    from kesoku.agent.runtime import Runtime
    from kesoku.agent.scheduler import Scheduler, adapter_targets
    from kesoku.vocab.model import Kind, Role

    assert isinstance(rt, Runtime)
    open_ = (Status.PENDING, Status.PROCESSING)
    now = time.time()
    scheduler = Scheduler(rt, adapter_targets(cfg), config=cfg)
    terminated = False

    async def on_sigterm(task_status: trio.TaskStatus[None]) -> None:
        nonlocal terminated
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            task_status.started()
            async for _ in signals:
                terminated = True
                nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        await nursery.start(on_sigterm)
        await nursery.start(rt.serve)
        session = scheduler.session_for(schedule, now)
        session_ids.add(session.id)
        root = await scheduler.post_run(schedule, session, planned=now, manual=True)
        roots.append(root.id)
        rt.store.note_run(schedule.name, last_run=now, last_message_id=root.id)
        # The daemon, when one holds the session, runs the turn: its end is only in the store.
        get = rt.store.get_message
        while (current := get(root.id)) is not None and current.status in open_:  # noqa: ASYNC110
            await trio.sleep(0.2)
        nursery.cancel_scope.cancel()
    if terminated:
        return _TERMINATED
    for m in rt.store.history(session.id):
        if m.root_id == root.id and m.kind is Kind.TEXT and m.role is Role.ASSISTANT:
            print(m.content)
        elif m.root_id == root.id and m.role is Role.SYSTEM:
            print(m.content, file=sys.stderr)
    print(f"session {session.id}", file=sys.stderr)
    return 0 if current is not None and current.status is Status.DONE else 1


def pause(name: str, /, *, config: ConfigOption = None) -> None:
    """Pause a schedule: no run until it is resumed.

    Args:
        name: The schedule.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    with open_store(config) as (_, store):
        store.put_schedule(msgspec.structs.replace(_get(store, name), enabled=False))
    print(f"paused {name}")


def resume(name: str, /, *, config: ConfigOption = None) -> None:
    """Resume a paused schedule from now (the runs it missed while paused are not made).

    Args:
        name: The schedule.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.vocab.schedule import next_run

    with open_store(config) as (_, store):
        s = _get(store, name)
        now = time.time()
        upcoming = s.next_run if s.next_run is not None and s.next_run > now else None
        if upcoming is None and s.kind != "at":
            upcoming = next_run(s, now)
        s = msgspec.structs.replace(s, enabled=True, next_run=upcoming)
        store.put_schedule(s)
    print(f"resumed {name}; next run {_when(s)}")


def remove(name: str, /, *, config: ConfigOption = None) -> None:
    """Remove a schedule (its past runs stay in their sessions).

    Args:
        name: The schedule.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    with open_store(config) as (_, store):
        _get(store, name)
        store.delete_schedule(name)
    print(f"removed {name}")


def _when(s: Schedule) -> str:
    if s.next_run is None:
        return "none (done)"
    return dt.datetime.fromtimestamp(s.next_run).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _last(store: Store, s: Schedule) -> str:
    if s.last_run is None:
        return "never"
    when = dt.datetime.fromtimestamp(s.last_run).astimezone().strftime("%Y-%m-%d %H:%M")
    message = store.get_message(s.last_message_id) if s.last_message_id else None
    outcome = message.status.value if message is not None else "its session was deleted"
    return f"{when} ({outcome})"
