"""``kesoku sessions``: the sessions in the database, from outside the chat.

The commands are ``kesoku sessions list | show | clear | fork | export``. Every command that takes
an ID accepts a unique prefix of it (at least 4 characters), as ``kesoku chat --session`` does
(:meth:`kesoku.store.Store.resolve_session`). These commands open the database directly; they are
safe beside a running daemon (SQLite WAL), except ``clear`` of a session whose turn is running,
which is refused.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import msgspec
from cyclopts import Parameter

from kesoku.vocab.errors import OperatorError
from kesoku.vocab.text import plural

if TYPE_CHECKING:
    from kesoku.config.settings import Config
    from kesoku.store import Store
    from kesoku.tools.paths import PathGates
    from kesoku.vocab.model import Message, Session

ConfigOption = Annotated[Path | None, Parameter(name=["--config", "-c"])]
NO_SESSIONS = 'no sessions yet; start one with: kesoku chat "your question" (or just kesoku chat)'
"""What ``list`` says before the first session, with how to start one."""
CONTENT_WIDTH = 80
"""Characters of a message shown on its line by ``show``."""


def no_database(config: Path | None) -> Path | None:
    """Where the config's database would be, when nothing has been stored yet; None once it exists.

    What the read-only listings (``kesoku sessions list``, ``kesoku schedule list``, ``kesoku
    usage``) check first: before anything was stored they say there is nothing yet and exit 0,
    without making an empty database.

    Args:
        config: The TOML file (None: the default lookup).

    Raises:
        OperatorError: A bad config.
    """
    from kesoku.config.settings import default_config_path, load_config

    cfg = load_config(config if config is not None else default_config_path())
    path = Path(cfg.workspace.db_path)
    return None if path.exists() else path


@contextmanager
def open_store(config: Path | None, *, create: bool = False) -> Iterator[tuple[Config, Store]]:
    """Load the config and open its database; a missing database is an error, not a new empty one.

    Args:
        config: The TOML file (None: the default lookup).
        create: Make the database when there is none (a command that stores something).

    Raises:
        OperatorError: A bad config, or no database at ``workspace.db_path``.
    """
    from kesoku.config.settings import default_config_path, load_config
    from kesoku.store import Store

    cfg = load_config(config if config is not None else default_config_path())
    path = Path(cfg.workspace.db_path)
    if not create and not path.exists():
        raise OperatorError(
            f"no database at {path} (workspace.db_path): nothing has been stored yet"
        )
    store = Store(path)
    try:
        yield cfg, store
    finally:
        store.close()


def find_session(store: Store, session_id: str) -> Session:
    """The session ``session_id`` names (whole id or unique prefix).

    Raises:
        OperatorError: No such session, or an ambiguous prefix.
    """
    from kesoku.vocab.errors import AmbiguousSessionError, UnknownSessionError

    try:
        return store.resolve_session(session_id)
    except AmbiguousSessionError as exc:
        raise OperatorError(f"session {session_id}: {exc}") from None
    except UnknownSessionError as exc:
        raise OperatorError(
            f"session {session_id}: {exc} (kesoku sessions list shows them)"
        ) from None


def output_gates(cfg: Config, config: Path | None) -> PathGates:
    """The path gates ``--output`` is checked with: the daemon's, for this config and its file.

    Args:
        cfg: The loaded config.
        config: ``--config`` as given; None: the default lookup (``$KESOKU_CONFIG``, ./kesoku.toml).
    """
    from kesoku.config.settings import default_config_path
    from kesoku.tools.paths import PathGates

    config_file = config if config is not None else default_config_path()
    return PathGates.from_config(cfg, config_file=config_file)


def write_output(path: Path, data: bytes, gates: PathGates) -> None:
    """Write ``--output``; a missing folder is the user's typo to fix, so it is not made.

    Args:
        path: The file to write.
        data: Its new content.
        gates: The protected files (:func:`output_gates`): the config, the database and secrets are
            never written over.

    Raises:
        OperatorError: The file is protected, or cannot be written (a missing folder, no
            permission): one line naming it.
    """
    from kesoku.tools.paths import protected_reason

    reason = protected_reason(path, Path.cwd(), gates)
    if reason is not None:
        raise OperatorError(f"cannot write {path}: {reason} (--output)")
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise OperatorError(f"cannot write {path}: {exc.strerror or exc} (--output)") from None


def list_sessions(
    *,
    adapter: Annotated[str | None, Parameter(name="--adapter")] = None,
    config: ConfigOption = None,
) -> None:
    """List the sessions, oldest first: id, creation time, adapter, turns, title.

    The title of a fork names its parent.

    Args:
        adapter: Only this adapter's sessions (terminal, discord, gchat).
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    sessions: list[Session] = []
    turns: dict[str, int] = {}
    if no_database(config) is None:
        with open_store(config) as (_, store):
            sessions = store.list_sessions(adapter=adapter)
            turns = {s.id: store.count_turns(s.id) for s in sessions}
    if not sessions:
        print(NO_SESSIONS if adapter is None else f"no {adapter} sessions yet")
        return
    rows = [("ID", "CREATED", "ADAPTER", "TURNS", "TITLE")]
    for s in sessions:
        title = (s.title or "untitled") + (f" (fork of {s.parent_id})" if s.parent_id else "")
        rows.append((s.id, _when(s.created_at), s.adapter, str(turns[s.id]), title))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print(
            f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  "
            f"{r[3]:>{widths[3]}}  {r[4]}"
        )


def show(
    session_id: str,
    /,
    *,
    limit: Annotated[int, Parameter(name="--limit")] = 50,
    config: ConfigOption = None,
) -> None:
    """Show a session: its fields, token totals, and its last messages with ids (for fork --at).

    Args:
        session_id: The session (id or unique prefix).
        limit: Messages shown, the most recent; 0 shows all.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.observe.spend import Budget
    from kesoku.observe.usage import usage_lines

    with open_store(config) as (cfg, store):
        s = find_session(store, session_id)
        history = store.history(s.id)
        turns = store.count_turns(s.id)
        calls, tokens, cost, *caps = usage_lines(Budget.from_config(cfg, store), s, turns=turns)
        for key, value in (
            ("id", s.id),
            ("title", s.title or "untitled"),
            ("adapter", f"{s.adapter} · channel {s.channel_id}"),
            ("created", _when(s.created_at)),
            ("workspace", s.workspace),
            ("llm", s.llm or "default (agent.llm)"),
            ("forked from", s.parent_id or ""),
            ("turns", f"{calls} · {plural(len(history), 'message')}"),
            ("tokens", tokens),
            ("spend", cost.removeprefix("cost: ")),
            *(("cap", line.removeprefix("cap ")) for line in caps),
        ):
            if value:
                print(f"{key + ':':<13}{value}")
        shown = history[-limit:] if limit > 0 else history
        if len(shown) < len(history):
            earlier = plural(len(history) - len(shown), "earlier message")
            print(f"\n… {earlier} (--limit 0 shows all)")
        print()
        for m in shown:
            print(_message_line(m))


def clear(session_id: str, /, *, config: ConfigOption = None) -> None:
    """Delete a session: its messages, view states and workspace folder. A running turn is refused.

    Args:
        session_id: The session (id or unique prefix).
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.vocab.model import Role, Status

    with open_store(config) as (_, store):
        s = find_session(store, session_id)
        history = store.history(s.id)
        if any(
            m.role is Role.USER and m.status in (Status.PENDING, Status.PROCESSING) for m in history
        ):
            raise OperatorError(
                f"session {s.id} has a turn running or queued: stop it first, then clear it"
            )
        store.delete_session(s.id)
        shutil.rmtree(s.workspace, ignore_errors=True)
        what = plural(len(history), "message")
        print(f"deleted session {s.id} ({what} and its workspace {s.workspace})")
        orphans = [x.name for x in store.list_schedules() if x.target == f"session:{s.id}"]
        if orphans:
            print(
                f"schedule(s) {', '.join(orphans)} still target it and will not run: "
                "kesoku schedule remove NAME, or add it again with another target",
                file=sys.stderr,
            )


def fork(
    session_id: str,
    /,
    *,
    at: Annotated[int | None, Parameter(name="--at")] = None,
    config: ConfigOption = None,
) -> None:
    """Fork a session: a new terminal session holding its history (up to --at).

    The new session is continued with kesoku chat. It names the original as its parent; the
    original is not changed. The workspace files are not copied.

    Args:
        session_id: The session (id or unique prefix).
        at: The id of the last message to copy (kesoku sessions show lists them). Default: all of
            them.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    from kesoku.host.build import INTERACTIVE_ADAPTER
    from kesoku.vocab.errors import UnknownSessionError

    with open_store(config) as (cfg, store):
        s = find_session(store, session_id)
        try:
            new = store.fork_session(
                s.id,
                adapter=INTERACTIVE_ADAPTER,
                channel_id=f"tty-{uuid.uuid4().hex}",
                workspace_root=cfg.workspace.sessions_dir,
                at_message_id=at,
            )
        except UnknownSessionError as exc:
            raise OperatorError(
                f"fork --at {at}: {exc} (kesoku sessions show {s.id} lists them)"
            ) from None
        Path(new.workspace).mkdir(parents=True, exist_ok=True)
        count = len(store.history(new.id))
        print(
            f"forked {s.id} into {new.id} ({plural(count, 'message')}); "
            f"continue it: kesoku chat --session {new.id}"
        )


def export(
    session_id: str,
    /,
    *,
    output: Annotated[Path | None, Parameter(name=["--output", "-o"])] = None,
    config: ConfigOption = None,
) -> None:
    """Export a session as JSON lines, to keep or to process with other tools.

    The first line is ``{"type": "session", ...}`` with the session's fields, then one
    ``{"type": "message", ...}`` per message in history order (bytes as base64).

    Args:
        session_id: The session (id or unique prefix).
        output: The file to write. Default: stdout.
        config: The TOML file. Default: $KESOKU_CONFIG, else ./kesoku.toml, else built-in defaults.
    """
    encode = msgspec.json.Encoder().encode
    with open_store(config) as (cfg, store):
        gates = output_gates(cfg, config)
        s = find_session(store, session_id)
        lines = [encode({"type": "session", **msgspec.to_builtins(s)})]
        lines += [
            encode({"type": "message", **msgspec.to_builtins(m)}) for m in store.history(s.id)
        ]
    data = b"\n".join(lines) + b"\n"
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        write_output(output, data, gates)
        what = plural(len(lines) - 1, "message")
        print(f"wrote {what} of session {s.id} to {output}", file=sys.stderr)


def _when(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M")


def _message_line(m: Message) -> str:
    text = " ".join(m.content.split())
    if len(text) > CONTENT_WIDTH:
        text = text[: CONTENT_WIDTH - 1] + "…"
    status = "" if m.status.value == "done" else f" [{m.status.value}]"
    return (
        f"{m.id:>7}  {dt.datetime.fromtimestamp(m.ts):%H:%M:%S}  "
        f"{m.role.value}/{m.kind.value}{status}  {text}"
    )
