"""The ``kesoku`` command line (cyclopts).

Only the light set is imported here: every command lives in its own module and is loaded lazily by
cyclopts (``app.command("module:function")``), so SDKs, discord and Pub/Sub are imported only by the
code that uses them. The bare overview (``kesoku``, ``kesoku --help``, ``kesoku --version``) is
printed without importing cyclopts and rich at all: they cost about 200 ms before the first line,
several times the interpreter itself (bench/startup_bench.py). A test keeps that overview equal to
the commands the cyclopts app knows. So is ``kesoku chat "question"`` (one argument, not an option)
run: the same call cyclopts would make (:mod:`kesoku.cli.chat_run`).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from kesoku import __version__

if TYPE_CHECKING:
    from cyclopts import App

SUMMARY = "Kesoku: a self-hosted autonomous agent on Discord, Google Chat and the terminal."
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("chat", "kesoku.cli.chat_cmd:chat", 'Talk to the agent, or ask once: kesoku chat "question"'),
    ("config", "", "Check kesoku.toml and print its JSON Schema."),
    (
        "doctor",
        "kesoku.cli.doctor_cmd:doctor",
        "Check the whole setup: what works, what does not, and each fix.",
    ),
    (
        "init",
        "kesoku.cli.init_cmd:init",
        "Set Kesoku up: model, Discord, Google Chat, sandbox; each answer checked live.",
    ),
    ("mcp", "", "List the MCP servers: whether each connects, its tools and prompts."),
    ("service", "kesoku.cli.service_cmd:service_app", "Install and control the systemd service."),
    ("sessions", "", "List, show, fork, export (JSON lines) and clear sessions."),
    ("skills", "", "List the skills the agent can use, and the ones that fail to load."),
    (
        "start",
        "kesoku.cli.start_cmd:start",
        "Run the daemon in the foreground (what systemd runs).",
    ),
    (
        "trace",
        "kesoku.cli.trace_cmd:trace",
        "Write a session's trajectory as an HTML page (works offline).",
    ),
    ("schedule", "", "Add, list, run, pause, resume and remove scheduled tasks."),
    ("usage", "kesoku.cli.usage_cmd:usage", "What the model calls cost: per day, session, model."),
)
"""(name, lazy import path, one-line help) of each top-level command; the sub-apps below."""
_HELP_FLAGS = frozenset({"--help", "-h"})


def build_app() -> App:
    """The cyclopts application with every command registered lazily."""
    from cyclopts import App

    app = App(name="kesoku", help=SUMMARY, version=__version__)
    for name, target, _ in COMMANDS:
        if target:
            # No help= here: a command's own --help then shows its whole docstring; the one-liners
            # are for the overview, which main() prints without cyclopts.
            app.command(target, name=name)
    config_app = App(name="config", help=dict((c[0], c[2]) for c in COMMANDS)["config"])
    config_app.command(
        "kesoku.cli.config_cmd:check",
        name="check",
        help="Validate a kesoku.toml; exit 2 with one line naming the problem.",
    )
    config_app.command(
        "kesoku.cli.config_cmd:schema", name="schema", help="Print the JSON Schema of kesoku.toml."
    )
    app.command(config_app)
    skills_app = App(name="skills", help=dict((c[0], c[2]) for c in COMMANDS)["skills"])
    skills_app.command("kesoku.cli.skills_cmd:list_skills", name="list")
    app.command(skills_app)
    mcp_app = App(name="mcp", help=dict((c[0], c[2]) for c in COMMANDS)["mcp"])
    mcp_app.command("kesoku.cli.mcp_cmd:list_servers", name="list")
    app.command(mcp_app)
    sessions_app = App(name="sessions", help=dict((c[0], c[2]) for c in COMMANDS)["sessions"])
    for name in ("list", "show", "clear", "fork", "export"):
        function = "list_sessions" if name == "list" else name
        # No help=: it would replace the command's whole docstring in its own --help.
        sessions_app.command(f"kesoku.cli.sessions_cmd:{function}", name=name)
    app.command(sessions_app)
    schedule_app = App(name="schedule", help=dict((c[0], c[2]) for c in COMMANDS)["schedule"])
    for name in ("add", "list", "run", "pause", "resume", "remove"):
        function = "list_schedules" if name == "list" else name
        # No help=: each command's --help shows its whole docstring (examples, what moves).
        schedule_app.command(f"kesoku.cli.schedule_cmd:{function}", name=name)
    app.command(schedule_app)
    return app


def overview() -> str:
    """The top-level help, as printed without cyclopts."""
    width = max(len(name) for name, _, _ in COMMANDS)
    commands = "\n".join(f"  {name:<{width}}  {text}" for name, _, text in COMMANDS)
    return (
        f"Usage: kesoku COMMAND\n\n{SUMMARY}\n\nCommands:\n{commands}\n\n"
        "Options:\n  --help, -h  Display this message and exit.\n"
        "  --version   Display application version.\n\n"
        "`kesoku COMMAND --help` describes a command and its options.\n"
    )


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; an operator error prints one line on stderr and exits 2.

    A reader that closes stdout early (``kesoku config schema | head -c 600``) ends the command
    quietly with 141, as a shell reports a writer whose reader left, whichever command was writing.
    Ctrl-C before a command listens for it (while Python imports it, parses, opens the database)
    ends it quietly with 130, as a shell reports SIGINT; a command that listens says what it
    stopped.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.
    """
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["chat"]:
        from kesoku.host import interrupt

        interrupt.install()  # until the chat takes SIGINT over
    try:
        try:
            _run(args)
        finally:
            sys.stdout.flush()  # output still buffered meets the closed pipe here, not at exit
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # 128 + SIGINT
    except (BrokenPipeError, BaseExceptionGroup) as exc:  # trio.run wraps a chat's in a group
        if _only(exc, KeyboardInterrupt):
            raise SystemExit(130) from None
        if not _only(exc, BrokenPipeError):
            raise
        # The recipe of Python's signal docs: Python would report the pipe again when it flushes
        # stdout at exit, so point stdout at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(141) from None  # 128 + SIGPIPE


def _only(exc: BaseException, kind: type[BaseException]) -> bool:
    """``exc`` is a ``kind``, or a group holding nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only(e, kind) for e in exc.exceptions)
    return isinstance(exc, kind)


def _run(args: list[str]) -> None:
    if not args or (len(args) == 1 and args[0] in _HELP_FLAGS):
        sys.stdout.write(overview())
        return
    if args == ["--version"]:
        print(__version__)
        return
    from kesoku.config.envfile import apply_env_file
    from kesoku.vocab.errors import ConfigError, OperatorError

    try:
        try:
            # The keys `kesoku init` stored (~/.config/kesoku/kesoku.env); the shell's own win.
            apply_env_file()
        except ConfigError:
            if args[:1] != ["doctor"]:
                raise  # doctor reports a malformed keys file among its findings
        if len(args) == 2 and args[0] == "chat" and not args[1].startswith("-"):
            # `kesoku chat "question"`, the common one-shot, as cyclopts would parse it: through a
            # running daemon, importing cyclopts would be a third of its time.
            from kesoku.cli.chat_run import run_chat

            raise SystemExit(run_chat(args[1]))
        app = build_app()
        if len(args) == 2 and args[1] in _HELP_FLAGS and args[0] in app:
            # `kesoku sessions --help`: cyclopts lists a lazily registered command without
            # importing it, so with no description; import the group's commands for their lines.
            group = app[args[0]]
            for name in list(group):
                group[name]
        app(args)
    except OperatorError as exc:
        print(f"kesoku: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except BaseExceptionGroup as group:  # trio.run wraps a chat's (a database locked too long)
        _, rest = group.split(OperatorError)
        first = _first_leaf(group)
        if rest is not None or not isinstance(first, OperatorError):
            raise
        print(f"kesoku: {first}", file=sys.stderr)
        raise SystemExit(2) from None


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def __getattr__(name: str) -> Any:
    """``kesoku.cli.app``: the cyclopts application, built on first use."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
