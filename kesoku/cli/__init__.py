"""The ``kesoku`` command line (cyclopts).

Only the light set is imported here: every command lives in its own module and is loaded lazily by
cyclopts (``app.command("module:function")``), so ``kesoku --help`` starts fast and SDKs, discord and
Pub/Sub are imported only by the code that uses them.
"""

from __future__ import annotations

import sys

from cyclopts import App

from kesoku import __version__

app = App(
    name="kesoku",
    help="Kesoku: a self-hosted autonomous agent on Discord, Google Chat and the terminal.",
    version=__version__,
)

app.command("kesoku.cli.chat_cmd:chat", name="chat", help='Talk to the agent, or ask once: kesoku chat "question"')
app.command("kesoku.cli.start_cmd:start", name="start", help="Run the daemon in the foreground (what systemd runs).")
app.command("kesoku.cli.service_cmd:service_app", name="service", help="Install and control the systemd service.")

config_app = App(name="config", help="Check kesoku.toml and print its JSON Schema.")
config_app.command(
    "kesoku.cli.config_cmd:check", name="check", help="Validate a kesoku.toml; exit 2 with one line naming the problem."
)
config_app.command("kesoku.cli.config_cmd:schema", name="schema", help="Print the JSON Schema of kesoku.toml.")
app.command(config_app)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; an operator error prints one line on stderr and exits 2.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.
    """
    from kesoku.errors import OperatorError

    try:
        app(argv if argv is not None else sys.argv[1:])
    except OperatorError as exc:
        print(f"kesoku: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
