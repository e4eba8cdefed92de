"""``kesoku init``: set Kesoku up by answering a few questions, each answer checked live.

It decides the model (Claude, Gemini, an OpenAI-compatible server such as Ollama on this machine,
or the bundled offline model), the chat surfaces (Discord, Google Chat) and the tools' sandbox, and
checks each answer as it is given (:mod:`kesoku.host.checks`: one model call, the bot token's
identity, the subscription's existence). The choices go to kesoku.toml: a new file is short and
commented; an existing one is edited in place (tomlkit keeps its comments, order and every other
key). Secrets (API keys, the bot token) go only to the keys file (``~/.config/kesoku/kesoku.env``,
mode 0600, :mod:`kesoku.config.envfile`): never to kesoku.toml, and never through argv (``ps``
shows it), so a script passes them in the environment. Nothing is written before the end, and
kesoku.toml only once the result loads as every command loads it (a temporary file, renamed).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
import os
import signal
import stat
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import tomlkit
import tomlkit.items
import trio
from cyclopts import Parameter

from kesoku.config.envfile import env_file_path, read_env_file, update_env_file
from kesoku.config.settings import Config, SandboxMode, load_config
from kesoku.host import checks
from kesoku.host.checks import Check, render_check, uses_vertex
from kesoku.vocab.errors import ConfigError, OperatorError

InitBackend = Literal["claude", "gemini", "openai", "local"]
BACKENDS: tuple[InitBackend, ...] = ("claude", "gemini", "openai", "local")
SANDBOX_MODES: tuple[SandboxMode, ...] = ("auto", "bwrap", "landlock", "off")

KEY_VARS: dict[str, str] = {
    "claude": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "openai": "OPENAI_API_KEY",
}
"""The variable each backend's key is stored as (the config's fallbacks read it)."""
OTHER_KEY_VARS: dict[str, tuple[str, ...]] = {"gemini": ("GOOGLE_API_KEY",)}
"""Variables the config also reads a backend's key from (only ever used, never written)."""
KEY_PAGES = {
    "claude": "https://console.anthropic.com/settings/keys",
    "gemini": "https://aistudio.google.com/apikey",
    "openai": "https://platform.openai.com/api-keys",
}
PROVIDERS = {"claude": "Anthropic", "gemini": "Gemini", "openai": "OpenAI"}
MODEL_TIMEOUT_S = 30.0
"""The model check's bound for a provider's API."""
SLOW_MODEL_TIMEOUT_S = 120.0
"""Its bound for a model this machine runs (the bundled one, a local server's first load)."""
DISCORD_TOKEN = "DISCORD_TOKEN"
ENV_HEADER = "Kesoku's keys (API keys, bot token), written by `kesoku init` (mode 0600)."

COMMENTS: dict[tuple[str, str], str] = {
    ("agent", "llm"): "The model: claude, gemini, openai (any OpenAI-compatible server) or local.",
    ("claude", "model_name"): "The Claude model id.",
    ("claude", "base_url"): "Where the Anthropic API is reached (a proxy). Unset: Anthropic's.",
    ("gemini", "model_name"): "The Gemini model id.",
    ("gemini", "base_url"): "Where the Gemini API is reached (a proxy). Unset: Google's.",
    ("openai", "model_name"): "The model id as the server lists it.",
    ("openai", "base_url"): "The server (Ollama: http://127.0.0.1:11434/v1). Unset: OpenAI's API.",
    ("discord", "enabled"): "Run the Discord bot; its token is DISCORD_TOKEN in the keys file.",
    ("gchat", "enabled"): "Run the Google Chat app (over a Pub/Sub pull subscription).",
    ("gchat", "project_id"): "The Google Cloud project of the subscription.",
    ("gchat", "subscription"): "The Pub/Sub subscription the Chat app publishes to.",
    ("gchat", "credentials_file"): "A service-account key file. Unset: Application Default "
    "Credentials.",
    ("sandbox", "mode"): "The tools' OS sandbox. auto: bubblewrap, else Landlock; off: none.",
    ("sandbox", "network"): "Let the tools' processes reach the network.",
}
"""The comment above each key a new kesoku.toml gets (an edited file keeps its own)."""

HEADER = """\
Kesoku's configuration, written by `kesoku init`. Run it again to change an answer: it edits this
file in place and keeps your comments and other keys. Every key: `kesoku config schema`, or the
commented reference kesoku.toml of the Kesoku repository. API keys and tokens are not here: they
are in {env_file} (mode 0600), which every kesoku command reads."""


class Stop(Exception):
    """The user left (Ctrl-C, or the end of input): nothing is written."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


class CheckFailed(Exception):
    """A live check failed without a terminal to ask what to do: nothing is written (exit 1)."""


# -- the command ----------------------------------------------------------------------------------


def init(
    *,
    config: Annotated[Path | None, Parameter(name=["--config", "-c"])] = None,
    llm: Annotated[InitBackend | None, Parameter(name="--llm")] = None,
    model: Annotated[str | None, Parameter(name="--model")] = None,
    base_url: Annotated[str | None, Parameter(name="--base-url")] = None,
    discord: Annotated[bool | None, Parameter(name="--discord", negative="--no-discord")] = None,
    gchat: Annotated[bool | None, Parameter(name="--gchat", negative="--no-gchat")] = None,
    gchat_project: Annotated[str | None, Parameter(name="--gchat-project")] = None,
    gchat_subscription: Annotated[str | None, Parameter(name="--gchat-subscription")] = None,
    credentials_file: Annotated[Path | None, Parameter(name="--credentials-file")] = None,
    sandbox_mode: Annotated[SandboxMode | None, Parameter(name="--sandbox-mode")] = None,
    sandbox_network: Annotated[
        bool | None, Parameter(name="--sandbox-network", negative="--no-sandbox-network")
    ] = None,
    yes: Annotated[bool, Parameter(name=["--yes", "-y"], negative="")] = False,
    no_check: Annotated[bool, Parameter(name="--no-check", negative="")] = False,
) -> None:
    """Set Kesoku up: the model, Discord and Google Chat, the sandbox; each answer checked live.

    On a terminal it asks, offering what it finds (API keys already set, an Ollama or other
    OpenAI-compatible server on this machine), and checks each answer as it is given: one small
    call to the model, the Discord bot's identity, the Pub/Sub subscription's existence. Then it
    shows what it will write and asks to confirm. kesoku.toml gets the choices (a new file is short
    and commented; an existing one is edited in place, its comments and other keys kept: run init
    again to change an answer); API keys and the bot token go only to ~/.config/kesoku/kesoku.env
    (mode 0600), which every kesoku command and the service read. Ctrl-C leaves without writing.

    Without a terminal, or with --yes, the flags are the answers and secrets come from the
    environment, never from flags (ps shows a command line): a missing answer exits 2 naming the
    flag, a failed check exits 1, and nothing is written in either case. Flags given on a terminal
    answer their questions and the rest are asked.

    For instance (the last two edit an existing file and keep the rest of it):

        kesoku init
        ANTHROPIC_API_KEY=sk-ant-... kesoku init --llm claude --yes
        kesoku init --llm openai --base-url http://127.0.0.1:11434/v1 --model llama3.2 --yes
        DISCORD_TOKEN=... kesoku init --discord --yes
        kesoku init --model claude-opus-4-6 --yes

    Args:
        config: The file to write or edit. Default: $KESOKU_CONFIG, else ./kesoku.toml.
        llm: The model backend: claude, gemini, openai (OpenAI or any compatible server: Ollama,
            vLLM, llama.cpp, LM Studio) or local (the bundled offline model: small, short answers).
        model: The model id (claude-sonnet-4-6, gemini-2.5-flash, llama3.2 …).
        base_url: Where the model's API is: an OpenAI-compatible server
            (http://127.0.0.1:11434/v1), or a proxy in front of Claude's or Gemini's.
        discord: Answer on Discord (the bot token: DISCORD_TOKEN), or stop answering there.
        gchat: Answer in Google Chat, or stop answering there.
        gchat_project: The Google Cloud project of the Pub/Sub subscription.
        gchat_subscription: The Pub/Sub subscription the Chat app publishes to (implies --gchat).
        credentials_file: A service-account key file for Google Chat. Default: Application
            Default Credentials.
        sandbox_mode: The tools' OS sandbox: auto (bubblewrap, else Landlock), bwrap, landlock,
            off.
        sandbox_network: Let the tools' processes reach the network.
        yes: Ask nothing: the flags and the environment are the answers; write without asking.
        no_check: Skip the live checks (offline set-ups, a server that is not running yet).
    """
    target = (
        config if config is not None else Path(os.environ.get("KESOKU_CONFIG") or "kesoku.toml")
    )
    flags = Flags(
        llm=llm,
        model=model,
        base_url=base_url,
        discord=discord,
        gchat=True if gchat_subscription and gchat is None else gchat,
        gchat_project=gchat_project,
        gchat_subscription=gchat_subscription,
        credentials_file=_absolute(credentials_file),
        sandbox_mode=sandbox_mode,
        sandbox_network=sandbox_network,
        check=not no_check,
    )
    # The bundled model's "run `kesoku init`" notice says nothing here: the check tells of it.
    logging.getLogger("kesoku.llm.factory").setLevel(logging.ERROR)
    interactive = not yes and sys.stdin.isatty()
    try:
        existing = Existing.read(target)
        setup = Setup(existing, flags, Terminal() if interactive else None)
        setup.run()
    except KeyboardInterrupt:
        _stopped(Stop(130, "stopped"))
    except BaseExceptionGroup as group:  # trio.run wraps a Ctrl-C met inside a nursery
        if group.subgroup(KeyboardInterrupt) is None:
            raise
        _stopped(Stop(130, "stopped"))
    except Stop as stop:
        _stopped(stop)
    except CheckFailed as failed:
        print(f"kesoku: init: {failed}; nothing was written", file=sys.stderr)
        raise SystemExit(1) from None


def _stopped(stop: Stop) -> NoReturn:
    print(f"\ninit: {stop}; nothing was written", file=sys.stderr)
    raise SystemExit(stop.code)


def _absolute(path: Path | None) -> str | None:
    return None if path is None else os.fspath(path.expanduser().resolve())


@dataclass(frozen=True)
class Flags:
    """The answers given on the command line (None: not given)."""

    llm: InitBackend | None
    model: str | None
    base_url: str | None
    discord: bool | None
    gchat: bool | None
    gchat_project: str | None
    gchat_subscription: str | None
    credentials_file: str | None
    sandbox_mode: SandboxMode | None
    sandbox_network: bool | None
    check: bool


# -- what is there --------------------------------------------------------------------------------


@dataclass
class Existing:
    """The file being edited (or its absence), and the keys already set.

    Attributes:
        path: Where kesoku.toml is written (a symbolic link's target).
        text: The file's text; None: there is none yet.
        data: The file's tables as TOML values (empty without a file).
        cfg: The file loaded as every command loads it (keys filled from the environment).
        env_file: The keys file.
        stored: The variables the keys file holds.
        environ: This process's environment (the shell's variables and the keys file's).
    """

    path: Path
    text: str | None
    data: dict[str, Any]
    cfg: Config
    env_file: Path
    stored: dict[str, str]
    environ: Mapping[str, str]

    @classmethod
    def read(cls, target: Path) -> Existing:
        """Read ``target`` and the keys file.

        Raises:
            OperatorError: The file exists but cannot be used (it must load before it is edited),
                or its folder does not exist.
        """
        import tomllib

        path = target.resolve() if target.is_symlink() else target
        if not path.parent.is_dir():
            raise OperatorError(f"init: {path.parent} is not a folder; create it first")
        env_file = env_file_path()
        stored = read_env_file(env_file)
        if not path.exists():
            # no file: the defaults and the environment's keys, paths resolved beside the file
            with _staged(path, "", {}) as (_, cfg):
                return cls(path, None, {}, cfg, env_file, stored, os.environ)
        try:
            cfg = load_config(path)
        except ConfigError as exc:
            raise OperatorError(
                f"{exc} (init edits the file it reads: fix it, or give another file with -c)"
            ) from None
        text = path.read_text(encoding="utf-8-sig")
        return cls(path, text, tomllib.loads(text), cfg, env_file, stored, os.environ)

    def raw(self, section: str, key: str) -> Any:
        """The value the file itself sets (no default, no environment); None when unset."""
        table = self.data.get(section)
        return table.get(key) if isinstance(table, dict) else None

    def key_source(self, backend: str) -> Source | None:
        """Where the key the backend would use now comes from; None: nowhere."""
        return self.source(
            backend, "api_key", (KEY_VARS[backend], *OTHER_KEY_VARS.get(backend, ()))
        )

    def source(self, section: str, key: str, names: Sequence[str]) -> Source | None:
        """Where a secret comes from: ``[section] key`` of the file, else the first variable set."""
        if self.raw(section, key):
            return Source(f"[{section}] {key} of {self.path.name}", "", self.raw(section, key))
        for name in names:
            value = self.environ.get(name)
            if value:
                return Source(name, name if self.shell_only(name) else "", value)
        return None

    def shell_only(self, name: str) -> bool:
        """The variable is set in this shell, and not (or not to that value) in the keys file."""
        return self.stored.get(name) != self.environ.get(name)


@dataclass(frozen=True)
class Source:
    """Where a key or token already set comes from.

    Attributes:
        where: For a question: ``ANTHROPIC_API_KEY``, ``[claude] api_key of kesoku.toml``.
        shell: The variable it comes from when only this shell has it (the keys file should get
            it, for the service and other shells); empty otherwise.
        value: The secret itself.
    """

    where: str
    shell: str
    value: str

    def describe(self) -> str:
        """For a question: where it is set, and for a variable, by whom."""
        if self.where.startswith("["):
            return self.where
        return f"{self.where} ({'this shell' if self.shell else 'the keys file'})"


@dataclass
class Plan:
    """What will be written: kesoku.toml keys set or removed, and the keys file's variables."""

    sets: dict[tuple[str, str], Any] = field(default_factory=dict)
    removes: dict[tuple[str, str], str] = field(default_factory=dict)
    """Key -> why it goes."""
    secrets: dict[str, str] = field(default_factory=dict)

    def set(self, section: str, key: str, value: Any) -> None:
        self.sets[(section, key)] = value
        self.removes.pop((section, key), None)

    def remove(self, section: str, key: str, why: str) -> None:
        self.sets.pop((section, key), None)
        self.removes[(section, key)] = why

    def changes(self, existing: Existing) -> list[tuple[str, str, Any]]:
        """The keys whose value the file does not already hold, in the order they were set.

        An edited file gets no key whose value it already has, nor one it does not set whose
        value is the default anyway; a new file gets every answer (that is what it is for).
        """
        defaults = Config()
        out = []
        for (section, key), value in self.sets.items():
            current = existing.raw(section, key)
            if current == value:
                continue
            unset_default = current is None and getattr(getattr(defaults, section), key) == value
            if existing.text is not None and unset_default:
                continue
            out.append((section, key, value))
        return out


# -- rendering and writing ------------------------------------------------------------------------


def render(existing: Existing, plan: Plan) -> str:
    """kesoku.toml's text after ``plan``: the existing file edited in place, or a new one."""
    if existing.text is None:
        doc = tomlkit.document()
        for line in HEADER.format(env_file=existing.env_file).splitlines():
            doc.add(tomlkit.comment(line))
    else:
        doc = tomlkit.parse(existing.text)
    for section, key in plan.removes:
        table = doc.get(section)
        if isinstance(table, tomlkit.items.AbstractTable) and key in table:
            del table[key]
    for section, key, value in plan.changes(existing):
        table = doc.get(section)
        if not isinstance(table, tomlkit.items.AbstractTable):
            table = tomlkit.table()
            doc.add(tomlkit.nl())
            doc.add(section, table)
        fresh = key not in table
        super_table = isinstance(table, tomlkit.items.Table) and table.is_super_table()
        if fresh and not super_table and (section, key) in COMMENTS:
            # A super-table ([x] only implied by [[x.y]]) would put the comment after its arrays.
            table.add(tomlkit.comment(COMMENTS[(section, key)]))
        table[key] = value
    return tomlkit.dumps(doc)


def _sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.init-{os.getpid()}.tmp")


@contextlib.contextmanager
def _staged(path: Path, text: str, overlay: Mapping[str, str]) -> Iterator[tuple[Path, Config]]:
    """``text`` in a temporary file beside ``path``, loaded as every command loads it.

    The file is removed on the way out unless the caller renamed it.

    Raises:
        ConfigError: The text does not load (a bug of init's, or a key the answers made wrong);
            the message names ``path``, not the temporary file.
    """
    tmp = _sibling(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            cfg = load_config(tmp, env={**os.environ, **overlay})
        except ConfigError as exc:
            raise ConfigError(str(exc).replace(os.fspath(tmp), os.fspath(path))) from None
        yield tmp, cfg
    finally:
        tmp.unlink(missing_ok=True)


def write(existing: Existing, plan: Plan) -> None:
    """The keys file, then kesoku.toml (validated, then renamed over the old one).

    SIGINT is ignored while they are written: a Ctrl-C never leaves one written without the other.
    """
    text = render(existing, plan)
    with _staged(existing.path, text, plan.secrets) as (tmp, _):
        if existing.text is not None:  # the old file's mode: one that holds a key stays private
            mode = stat.S_IMODE(existing.path.stat().st_mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if plan.secrets:
                update_env_file(existing.env_file, plan.secrets, header=ENV_HEADER)
            if plan.changes(existing) or plan.removes or existing.text is None:
                os.replace(tmp, existing.path)
        finally:
            signal.signal(signal.SIGINT, previous)


# -- asking ---------------------------------------------------------------------------------------


class Terminal:
    """Questions on the terminal; Ctrl-C and the end of input end the setup."""

    def ask(self, question: str, default: str | None = None) -> str:
        shown = f" [{default}]" if default else ""
        answer = self._read(lambda: input(f"{question}{shown}: ")).strip()
        return answer or (default or "")

    def yes(self, question: str, default: bool) -> bool:
        while True:
            answer = self._read(lambda: input(f"{question} [{'Y/n' if default else 'y/N'}] "))
            answer = answer.strip().lower()
            if not answer:
                return default
            if answer in ("y", "yes", "n", "no"):
                return answer.startswith("y")
            print("  y or n, please")

    def secret(self, question: str) -> str:
        return self._read(lambda: getpass.getpass(f"{question}: ")).strip()

    def choose(self, question: str, options: Sequence[str], default: int | None) -> int:
        """One of ``options`` (numbered from 1) by its number; returns its index."""
        for number, text in enumerate(options, 1):
            print(f"  {number}. {text}")
        while True:
            answer = self.ask(question, str(default + 1) if default is not None else None)
            if answer.isdigit() and 1 <= int(answer) <= len(options):
                return int(answer) - 1
            print(f"  a number from 1 to {len(options)}, please")

    @staticmethod
    def _read(read: Callable[[], str]) -> str:
        try:
            return read()
        except EOFError:
            raise Stop(1, "no more input") from None


# -- the setup ------------------------------------------------------------------------------------


class Setup:
    """The questions (or the flags) in order, then what to write, then writing it.

    Args:
        existing: The file and keys already there.
        flags: The command line's answers.
        term: The terminal to ask on; None: the flags and the environment are all the answers.
    """

    def __init__(self, existing: Existing, flags: Flags, term: Terminal | None) -> None:
        self.existing = existing
        self.flags = flags
        self.term = term
        self.plan = Plan()
        self.servers: list[tuple[str, list[str]]] | None = None

    # -- the whole run ----------------------------------------------------------------------------

    def run(self) -> None:
        """Ask (or read the flags), check, show, confirm, write, and say what comes next."""
        if self.term is not None:
            state = "edits" if self.existing.text is not None else "writes"
            print(f"Kesoku setup: it {state} {self.existing.path}, and keeps API keys and tokens")
            print(f"in {self.existing.env_file} (mode 0600). Ctrl-C leaves, writing nothing.\n")
            self.model()
            self.discord()
            self.gchat()
            self.sandbox()
        else:
            self.from_flags()
        changes = self.plan.changes(self.existing)
        nothing = not changes and not self.plan.removes and not self.plan.secrets
        if nothing and self.existing.text is not None:
            print(f"nothing to change: {self.existing.path} already says all that")
            return
        self.show(changes)
        if self.term is not None and not self.term.yes("Write them?", True):
            raise Stop(1, "not confirmed")
        write(self.existing, self.plan)
        self.done()

    def check(self, make: Callable[[], Awaitable[Check]]) -> Check:
        """Run a live check and print it."""
        result = trio.run(make)
        print(f"  {render_check(result)}".replace("\n", "\n  "))
        return result

    def staged_config(self) -> Config:
        """The config the answers so far make, loaded as every command would load it."""
        with _staged(self.existing.path, render(self.existing, self.plan), self.plan.secrets) as (
            _,
            cfg,
        ):
            return cfg

    # -- the model --------------------------------------------------------------------------------

    def model(self) -> None:
        backend = self.flags.llm
        while True:
            if backend is None:
                backend = self.choose_backend()
            if self.ask_model(backend) and (not self.flags.check or self.model_works(backend)):
                return
            backend = None

    def model_works(self, backend: InitBackend) -> bool:
        """Check the model until it answers or the user keeps it; False: choose another."""
        assert self.term is not None
        keyed = backend in KEY_VARS and not uses_vertex(self.existing.cfg, backend)
        options = ["type the key again"] if keyed else []
        options += ["change the model id", "choose another model", "keep these answers unchecked"]
        result = self.check_model(backend)
        while not result.ok:
            refused = keyed and result.fix in checks.KEY_FIXES.values()
            if refused and self.ask_key(backend, again=True):  # straight to another key
                result = self.check_model(backend)
                continue
            default = options.index("change the model id") if "model_name" in result.fix else 0
            picked = options[self.term.choose("What now?", options, default)]
            if picked == "choose another model":
                return False
            if picked == "keep these answers unchecked":
                return True
            if picked == "change the model id":
                self.ask_model_id(backend, again=True)
            elif not self.ask_key(backend, again=True):
                continue  # nothing typed: the choices again
            result = self.check_model(backend)
        return True

    def choose_backend(self) -> InitBackend:
        assert self.term is not None
        print("Which model should answer?")
        servers = self.local_servers()
        found = "; ".join(f"{url} ({', '.join(ids[:4]) or 'no models'})" for url, ids in servers)
        labels = {
            "claude": "Claude (Anthropic API key)",
            "gemini": "Gemini (Google AI Studio API key)",
            "openai": "OpenAI, or an OpenAI-compatible server (Ollama, vLLM, llama.cpp, "
            "LM Studio)" + (f": found {found}" if found else ""),
            "local": "the bundled offline model: small (135M), short answers, no tools "
            "(kesoku[local])",
        }
        options = []
        for backend in BACKENDS:
            source = self.existing.key_source(backend) if backend in KEY_VARS else None
            options.append(labels[backend] + (f"  [{source.where} is set]" if source else ""))
        current = self.existing.cfg.agent.llm
        if current in BACKENDS:
            default: int | None = BACKENDS.index(current)
        else:
            detected = [b for b in BACKENDS if b in KEY_VARS and self.existing.key_source(b)]
            default = BACKENDS.index(detected[0]) if detected else 2 if servers else None
        return BACKENDS[self.term.choose("Model", options, default)]

    def ask_model(self, backend: InitBackend) -> bool:
        """The backend's questions; False when the user wants another backend."""
        self.plan.set("agent", "llm", backend)
        for other in BACKENDS:  # a backend chosen earlier in this run leaves nothing behind
            if other != backend:
                for key in ("model_name", "base_url"):
                    self.plan.sets.pop((other, key), None)
                self.plan.secrets.pop(KEY_VARS.get(other, ""), None)
        if backend == "local":
            return True
        if backend == "openai":
            self.ask_server()
        elif self.flags.base_url:
            self.plan.set(backend, "base_url", self.flags.base_url)
        if (backend != "openai" or self.needs_openai_key()) and not self.ask_key(
            backend, again=False
        ):
            return False
        self.ask_model_id(backend)
        return True

    def ask_server(self) -> None:
        """An OpenAI-compatible server's URL (and whether it is OpenAI's own API)."""
        assert self.term is not None
        from kesoku.llm.openai import DEFAULT_BASE_URL

        if self.flags.base_url:
            self.set_openai_server(self.flags.base_url)
            return
        servers = self.local_servers()
        default = self.existing.raw("openai", "base_url") or (
            servers[0][0] if servers else DEFAULT_BASE_URL
        )
        self.set_openai_server(
            self.term.ask("Server URL (OpenAI's API, or a server's, up to /v1)", default)
        )

    def set_openai_server(self, url: str) -> None:
        """[openai] base_url, or none for OpenAI's own API (the default)."""
        if _own_server(url):
            self.plan.set("openai", "base_url", url)
        elif self.existing.raw("openai", "base_url"):
            self.plan.remove("openai", "base_url", "OpenAI's own API is the default")
        else:
            self.plan.sets.pop(("openai", "base_url"), None)

    def local_servers(self) -> list[tuple[str, list[str]]]:
        """The OpenAI-compatible servers answering on this machine (looked for once)."""
        if self.servers is None:
            self.servers = _servers()
        return self.servers

    def needs_openai_key(self) -> bool:
        if not _own_server(self.plan.sets.get(("openai", "base_url"))):
            return True
        assert self.term is not None
        if self.existing.key_source("openai"):
            return True
        return self.term.yes("Does this server want an API key?", False)

    def ask_key(self, backend: str, *, again: bool) -> bool:
        """The backend's API key (hidden); False when the user typed nothing.

        Args:
            backend: claude, gemini or openai.
            again: The key was refused: ask for another, whatever is set.
        """
        assert self.term is not None
        var = KEY_VARS[backend]
        if uses_vertex(self.existing.cfg, backend):
            print(f"  {backend}: Vertex AI, as {self.existing.path.name} says: no API key")
            return True
        source = self.existing.key_source(backend)
        question = f"Use the key already set: {source.describe()}?" if source else ""
        if source and not again and self.term.yes(question, True):
            self.adopt(source, var)
            return True
        while True:
            escape = "other choices" if again else "choose another model"
            key = self.term.secret(
                f"{'Another' if again else 'The'} {PROVIDERS[backend]} API key (input hidden; "
                f"{KEY_PAGES[backend]}; Enter alone: {escape})"
            )
            if not key:
                return False
            if "\n" in key or " " in key:
                print("  a key has no spaces; paste it again")
                continue
            self.plan.secrets[var] = key
            if self.existing.raw(backend, "api_key"):
                # the file's key would win over the keys file's
                self.plan.remove(backend, "api_key", f"now {var} in the keys file")
            return True

    def ask_model_id(self, backend: str, *, again: bool = False) -> None:
        """The model id (asked even when --model gave one, ``again``: it did not answer)."""
        assert self.term is not None
        if self.flags.model and not again:
            self.plan.set(backend, "model_name", self.flags.model)
            return
        current = (
            self.plan.sets.get((backend, "model_name"))
            or getattr(self.existing.cfg, backend).model_name
        )
        if backend == "openai":
            url = self.plan.sets.get(("openai", "base_url"))
            listed = _servers((url,)) if url else []
            if listed and listed[0][1]:
                ids = listed[0][1]
                print(f"  the server lists: {', '.join(ids[:12])}{' …' if len(ids) > 12 else ''}")
                if current not in ids:
                    current = ids[0]
        self.plan.set(backend, "model_name", self.term.ask("Model id", current))

    def check_model(self, backend: str) -> Check:
        cfg = self.staged_config()
        slow = backend == "local" or (
            backend == "openai" and cfg.openai.base_url is not None and _on_this_machine(cfg)
        )
        if backend == "local":
            print("  loading the offline model (about 100 MB) for one answer: a few seconds …")
        timeout_s = SLOW_MODEL_TIMEOUT_S if slow else MODEL_TIMEOUT_S
        return self.check(functools.partial(checks.check_model, cfg, backend, timeout_s=timeout_s))

    # -- Discord ----------------------------------------------------------------------------------

    def discord(self) -> None:
        assert self.term is not None
        term = self.term
        enabled = self.existing.cfg.discord.enabled
        wanted = self.flags.discord
        if wanted is None:
            print()
            wanted = term.yes("Discord: should the agent answer on a Discord server?", enabled)
        if wanted:
            print(
                "  The bot's token: https://discord.com/developers/applications → your "
                "application → Bot.\n  It needs the Message Content intent (Bot → Privileged "
                "Gateway Intents)."
            )
            token = self.discord_token()
            while token is not None:
                self.plan.set("discord", "enabled", True)
                if not self.flags.check:
                    return
                base = self.existing.cfg.discord.api_base_url  # init never asks for it
                check = functools.partial(checks.check_discord_token, token, api_base_url=base)
                result = self.check(check)
                missing = _extra("discord", "discord")
                if missing is not None:
                    print(f"  {render_check(missing)}".replace("\n", "\n  "))
                if result.ok:
                    return
                options = ["type the token again", "go on without Discord", "keep it unchecked"]
                picked = term.choose("What now?", options, 0)
                if picked == 2:
                    return
                token = self.ask_token() if picked == 0 else None
        self.plan.secrets.pop(DISCORD_TOKEN, None)
        self.plan.sets.pop(("discord", "enabled"), None)
        if enabled:
            self.plan.set("discord", "enabled", False)

    def discord_token(self) -> str | None:
        """The token already set (if the user wants it) or a new one; None: no Discord."""
        assert self.term is not None
        source = self.existing.source("discord", "bot_token", (DISCORD_TOKEN,))
        if source and self.term.yes(f"Use the token already set: {source.describe()}?", True):
            self.adopt(source, DISCORD_TOKEN)
            return source.value
        return self.ask_token()

    def adopt(self, source: Source, var: str) -> None:
        """Store a key only this shell has: the service and other shells need it too."""
        if source.shell:
            self.plan.secrets[var] = source.value

    def ask_token(self) -> str | None:
        assert self.term is not None
        token = self.term.secret("Bot token (input hidden; Enter alone: no Discord)")
        if not token:
            return None
        self.plan.secrets[DISCORD_TOKEN] = token
        if self.existing.raw("discord", "bot_token"):
            self.plan.remove("discord", "bot_token", f"now {DISCORD_TOKEN} in the keys file")
        return token

    # -- Google Chat ------------------------------------------------------------------------------

    def gchat(self) -> None:
        assert self.term is not None
        term = self.term
        enabled = self.existing.cfg.gchat.enabled
        wanted = self.flags.gchat
        if wanted is None:
            print()
            wanted = term.yes(
                "Google Chat: should the agent answer in Google Chat (a Chat app and a Pub/Sub "
                "subscription)?",
                enabled,
            )
        if not wanted:
            if enabled:
                self.plan.set("gchat", "enabled", False)
            return
        self.plan.set("gchat", "enabled", True)
        again = False
        while True:
            project, subscription, credentials = self.ask_gchat(again=again)
            again = True
            if not self.flags.check:
                return
            make = functools.partial(
                checks.check_gchat_subscription, project, subscription, credentials
            )
            if self.check(make).ok:
                return
            picked = term.choose(
                "What now?", ["answer again", "go on without Google Chat", "keep it unchecked"], 0
            )
            if picked == 1:
                for key in ("enabled", "project_id", "subscription", "credentials_file"):
                    self.plan.sets.pop(("gchat", key), None)
                if enabled:
                    self.plan.set("gchat", "enabled", False)
                return
            if picked == 2:
                return

    def ask_gchat(self, *, again: bool) -> tuple[str, str, str | None]:
        """The project, the subscription and the key file (the flags' unless ``again``)."""
        assert self.term is not None
        term = self.term
        cfg = self.existing.cfg.gchat
        flags = self.flags
        if again:  # the flags' answers did not work: ask
            flags = replace(
                flags, gchat_project=None, gchat_subscription=None, credentials_file=None
            )
        while True:
            project = flags.gchat_project or term.ask(
                "Google Cloud project",
                self.plan.sets.get(("gchat", "project_id")) or cfg.project_id or None,
            )
            subscription = flags.gchat_subscription or term.ask(
                "Pub/Sub subscription (its name in that project, or projects/P/subscriptions/S)",
                self.plan.sets.get(("gchat", "subscription")) or cfg.subscription or None,
            )
            if subscription and (project or subscription.startswith("projects/")):
                break
            print("  a subscription, and its project, please")
        default_file = self.plan.sets.get(("gchat", "credentials_file")) or self.existing.raw(
            "gchat", "credentials_file"
        )
        while True:
            credentials = flags.credentials_file or term.ask(
                "Service-account key file (Enter alone: Application Default Credentials)",
                default_file,
            )
            if not credentials or credentials == default_file:
                break
            credentials = os.fspath(Path(credentials).expanduser().resolve())
            if Path(credentials).is_file():
                break
            print(f"  {credentials}: no such file")
        if project:
            self.plan.set("gchat", "project_id", project)
        self.plan.set("gchat", "subscription", subscription)
        if credentials:
            self.plan.set("gchat", "credentials_file", credentials)
        resolved = self.staged_config().gchat.credentials_file if credentials else None
        return project, subscription, resolved

    # -- the sandbox ------------------------------------------------------------------------------

    def sandbox(self) -> None:
        assert self.term is not None
        term = self.term
        print("\nThe tools' sandbox (where the shell's and run_code's processes run):")
        current = self.existing.cfg.sandbox
        print(f"  {render_check(checks.check_sandbox(self.existing.cfg))}".replace("\n", "\n  "))
        mode = self.flags.sandbox_mode
        while mode is None:
            answer = term.ask(f"Mode ({', '.join(SANDBOX_MODES)})", current.mode)
            if answer in SANDBOX_MODES:
                mode = answer
            else:
                print(f"  one of {', '.join(SANDBOX_MODES)}, please")
        network = self.flags.sandbox_network
        if network is None:
            network = term.yes("Let the tools' processes reach the network?", current.network)
        self.plan.set("sandbox", "mode", mode)
        self.plan.set("sandbox", "network", network)
        if mode != current.mode or network != current.network:
            print(f"  {render_check(checks.check_sandbox(self.staged_config()))}")

    # -- without a terminal -----------------------------------------------------------------------

    def from_flags(self) -> None:
        """The flags as the answers; exit 2 for a missing one, 1 for a failed check."""
        flags, existing, plan = self.flags, self.existing, self.plan
        backend = flags.llm
        if backend is None and (flags.model or flags.base_url):
            current = existing.raw("agent", "llm")
            if current not in BACKENDS:
                raise OperatorError(
                    "init: --llm is required with --model or --base-url "
                    f"({existing.path.name} names no backend)"
                )
            backend = current
        if backend is None and existing.text is None:
            raise OperatorError(
                "init: --llm is required without a terminal (claude, gemini, openai or local)"
            )
        todo: list[Callable[[], Awaitable[Check]]] = []
        if backend is not None:
            self.model_from_flags(backend)
        if flags.discord is not None:
            self.discord_from_flags(flags.discord)
        if flags.gchat is not None:
            self.gchat_from_flags(flags.gchat)
        if flags.sandbox_mode is not None:
            plan.set("sandbox", "mode", flags.sandbox_mode)
        if flags.sandbox_network is not None:
            plan.set("sandbox", "network", flags.sandbox_network)
        if not flags.check:
            return
        cfg = self.staged_config()
        if backend is not None:
            slow = backend == "local" or (backend == "openai" and _on_this_machine(cfg))
            timeout_s = SLOW_MODEL_TIMEOUT_S if slow else MODEL_TIMEOUT_S
            todo.append(functools.partial(checks.check_model, cfg, backend, timeout_s=timeout_s))
        if flags.discord and cfg.discord.bot_token:
            todo.append(
                functools.partial(
                    checks.check_discord_token,
                    cfg.discord.bot_token,
                    api_base_url=cfg.discord.api_base_url,
                )
            )
        if flags.gchat and cfg.gchat.subscription:
            todo.append(
                functools.partial(
                    checks.check_gchat_subscription,
                    cfg.gchat.project_id or "",
                    cfg.gchat.subscription,
                    cfg.gchat.credentials_file,
                )
            )
        failed = [result for make in todo if not (result := self.check(make)).ok]
        if flags.sandbox_mode is not None or flags.sandbox_network is not None:
            # told, never blocking: the tools work without it where a terminal asks
            print(f"  {render_check(checks.check_sandbox(cfg))}".replace("\n", "\n  "))
        if failed:
            raise CheckFailed(
                f"{failed[0].what}: the check failed (see above; --no-check writes anyway)"
            )

    def model_from_flags(self, backend: InitBackend) -> None:
        flags, existing, plan = self.flags, self.existing, self.plan
        plan.set("agent", "llm", backend)
        if backend == "local":
            if flags.model or flags.base_url:
                raise OperatorError(
                    "init: --llm local takes no --model nor --base-url "
                    "([local] model_path names another GGUF file)"
                )
            return
        if flags.base_url and backend == "openai":
            self.set_openai_server(flags.base_url)
        elif flags.base_url:
            plan.set(backend, "base_url", flags.base_url)
        if flags.model:
            plan.set(backend, "model_name", flags.model)
        url = flags.base_url or existing.raw(backend, "base_url")
        own_server = backend == "openai" and _own_server(url)
        if own_server and not flags.model and not existing.raw("openai", "model_name"):
            raise OperatorError(
                "init: --model is required with an OpenAI-compatible server "
                f"(the model id as {url}/models lists it)"
            )
        var = KEY_VARS[backend]
        source = existing.key_source(backend)
        if source is None and not own_server and not uses_vertex(existing.cfg, backend):
            raise OperatorError(
                f"init: --llm {backend} needs {var} in the environment "
                "(keys are never flags: ps shows a command line)"
            )
        if source is not None:
            self.adopt(source, var)

    def discord_from_flags(self, wanted: bool) -> None:
        existing, plan = self.existing, self.plan
        plan.set("discord", "enabled", wanted)
        if not wanted:
            return
        source = existing.source("discord", "bot_token", (DISCORD_TOKEN,))
        if source is None:
            raise OperatorError(
                f"init: --discord needs {DISCORD_TOKEN} in the environment "
                "(the bot's token; never a flag: ps shows a command line)"
            )
        self.adopt(source, DISCORD_TOKEN)

    def gchat_from_flags(self, wanted: bool) -> None:
        flags, existing, plan = self.flags, self.existing, self.plan
        plan.set("gchat", "enabled", wanted)
        if not wanted:
            return
        subscription = flags.gchat_subscription or existing.cfg.gchat.subscription
        if not subscription:
            raise OperatorError("init: --gchat needs --gchat-subscription (the Pub/Sub one)")
        project = flags.gchat_project or existing.cfg.gchat.project_id
        if not project and not subscription.startswith("projects/"):
            raise OperatorError(
                "init: --gchat-project is required (or GOOGLE_CLOUD_PROJECT, or a subscription "
                "given as projects/P/subscriptions/S)"
            )
        if flags.gchat_project:
            plan.set("gchat", "project_id", flags.gchat_project)
        if flags.gchat_subscription:
            plan.set("gchat", "subscription", flags.gchat_subscription)
        if flags.credentials_file:
            if not Path(flags.credentials_file).is_file():
                raise OperatorError(f"init: --credentials-file {flags.credentials_file}: no file")
            plan.set("gchat", "credentials_file", flags.credentials_file)

    # -- the end ----------------------------------------------------------------------------------

    def show(self, changes: Sequence[tuple[str, str, Any]]) -> None:
        existing = self.existing
        verb = "edit" if existing.text is not None else "write"
        print(f"\nTo {verb} {existing.path}:")
        for section, key, value in changes:
            print(f"  {section}.{key} = {tomlkit.item(value).as_string()}")
        for (section, key), why in self.plan.removes.items():
            if existing.raw(section, key) is not None:
                print(f"  {section}.{key}: removed ({why})")
        if existing.text is not None:
            print("  (every other line of the file is kept as it is)")
        if self.plan.secrets:
            names = ", ".join(sorted(self.plan.secrets))
            print(f"To store in {existing.env_file} (mode 0600): {names}")

    def done(self) -> None:
        existing = self.existing
        written = "edited" if existing.text is not None else "wrote"
        print(f"{written} {existing.path}")
        if self.plan.secrets:
            names = ", ".join(sorted(self.plan.secrets))
            print(f"keys in {existing.env_file} (mode 0600, read by every kesoku command): {names}")
            for name, value in sorted(self.plan.secrets.items()):
                shell = existing.environ.get(name)
                if shell and shell != value and existing.shell_only(name):
                    print(f"note: {name} set in this shell wins over the keys file; unset it")
        default = Path("kesoku.toml").absolute() == existing.path.absolute()
        option = "" if default else f" -c {existing.path}"
        steps = [
            (f'kesoku chat{option} "hello"', "ask it something"),
            (f"kesoku doctor{option}", "check the whole setup again"),
            (f"kesoku service install{option}", "run it in the background, started at boot"),
        ]
        cfg = self.staged_config_after()
        for name, module, on in (
            ("discord", "discord", cfg.discord.enabled),
            ("gchat", "google.cloud.pubsub_v1", cfg.gchat.enabled),
        ):
            missing = _extra(name, module) if on else None
            if missing is not None:
                steps.append((missing.fix, f"the {name} extra, which `kesoku start` needs"))
        width = max(len(command) for command, _ in steps)
        print("\nNext:")
        for command, why in steps:
            print(f"  {command:<{width}}  {why}")

    def staged_config_after(self) -> Config:
        try:
            return load_config(self.existing.path)
        except ConfigError:
            return self.existing.cfg


def _servers(candidates: Sequence[str] = checks.LOCAL_SERVERS) -> list[tuple[str, list[str]]]:
    return trio.run(functools.partial(checks.find_openai_servers, candidates))


def _own_server(url: str | None) -> bool:
    """``url`` is an OpenAI-compatible server's, not OpenAI's own API (nor unset)."""
    if not url:
        return False
    from kesoku.llm.openai import DEFAULT_BASE_URL  # the openai SDK: only where it is chosen

    return url.rstrip("/") != DEFAULT_BASE_URL


def _on_this_machine(cfg: Config) -> bool:
    from urllib.parse import urlsplit

    host = urlsplit(cfg.openai.base_url or "").hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


def _extra(name: str, module: str) -> Check | None:
    """A warning when an adapter's extra is not installed; None when it is."""
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if found:
        return None
    return Check(
        ok=True,
        what=f"the {name} extra",
        detail="not installed",
        fix=f"pip install 'kesoku[{name}]'",
    )


__all__ = ["init"]
