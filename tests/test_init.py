"""`kesoku init`, run as the real command in a subprocess against the loopback model fakes.

The interactive setup runs on a pseudo-terminal (the standard ``pty`` module: the terminal is the
child's controlling one, so getpass reads from it without echo and Ctrl-C is a real SIGINT), typed
at as a person would; the scripted runs use flags and the environment. Each run has its own keys
file (``XDG_CONFIG_HOME``) and none of the keys of whoever runs the tests.
"""

from __future__ import annotations

import difflib
import fcntl
import functools
import os
import signal
import stat
import struct
import subprocess
import sys
import termios
from pathlib import Path

import trio
from test_checks import subscription  # noqa: F401 (a fresh subscription in the emulator)
from test_gchat_emulator import emulator  # noqa: F401 (the session's emulator, a fixture)

from kesoku.config.envfile import read_env_file
from kesoku.config.settings import Config, load_config
from kesoku.testing.fakes.anthropic_api import AnthropicFake, text_reply
from kesoku.testing.fakes.openai_api import OpenAIFake
from kesoku.testing.fakes.openai_api import text_reply as openai_reply

GOOD = "sk-ant-api03-good-key-0123456789abcdef"
BAD = "sk-ant-api03-refused-key-9876543210fedcba"
CLEARED = (
    "KESOKU_CONFIG",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "DISCORD_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "PUBSUB_EMULATOR_HOST",
)


def environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    return env | {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "TERM": "dumb", **extra}


async def written(tmp_path: Path) -> Config:
    """The kesoku.toml written, loaded alone (no environment), off the event loop."""
    load = functools.partial(load_config, tmp_path / "kesoku.toml", env={})
    return await trio.to_thread.run_sync(load)


def keys_file(tmp_path: Path) -> Path:
    return tmp_path / "xdg" / "kesoku" / "kesoku.env"


async def init(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """``kesoku init ARGS`` without a terminal (stdin is /dev/null), in ``tmp_path``."""
    return await trio.run_process(
        [sys.executable, "-m", "kesoku", "init", *args],
        cwd=tmp_path,
        env=environ(tmp_path, **env),
        stdin=b"",
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )


def _controlling_terminal() -> None:
    # In the child, after setsid: its stdin (the pty) becomes its controlling terminal, and it takes
    # SIGINT as a terminal's foreground job does: a suite started in the background (CI) has
    # SIGINT ignored, children inherit that, and Python then keeps ignoring it (Ctrl-C would hang).
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """``kesoku init`` on a pseudo-terminal: type keys, wait for text (what a person sees)."""

    def __init__(self, process: trio.Process, fd: int) -> None:
        self.process = process
        self.fd = fd
        self.output = ""
        self._seen = 0

    @classmethod
    async def start(cls, tmp_path: Path, *args: str, **env: str) -> Terminal:
        master, slave = os.openpty()
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
        try:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "kesoku", "init", *args],
                cwd=tmp_path,
                env=environ(tmp_path, **env),
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=_controlling_terminal,
            )
        finally:
            os.close(slave)
        return cls(process, master)

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    async def expect(self, text: str, *, timeout_s: float = 60) -> None:
        """Wait until ``text`` appears after what the last expect found."""
        with trio.move_on_after(timeout_s):
            while (found := self.output.find(text, self._seen)) < 0:
                if not await self._read():
                    break
            else:
                self._seen = found + len(text)
                return
        raise AssertionError(f"{text!r} never appeared; the terminal:\n{self.output}")

    async def exit_code(self, *, timeout_s: float = 60) -> int:
        with trio.fail_after(timeout_s):
            while await self._read():
                pass
            return await self.process.wait()

    async def _read(self) -> bool:
        await trio.lowlevel.wait_readable(self.fd)
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: every process holding the terminal has exited
            return False
        self.output += data.decode("utf-8", "replace").replace("\r\n", "\n")
        return bool(data)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            if self.process.returncode is None:
                self.process.kill()
            await self.process.wait()
        os.close(self.fd)


async def test_interactive_setup_asks_checks_a_refused_key_and_writes_the_key_apart(
    tmp_path: Path,
) -> None:
    fake = AnthropicFake(api_key=GOOD)
    fake.push(text_reply("OK"), text_reply("OK"))
    async with fake.serve() as url:
        term = await Terminal.start(tmp_path, "--base-url", url)
        try:
            await term.expect("Which model should answer?")
            await term.expect("Model: ")  # the menu's question
            term.type("1\r")  # Claude
            await term.expect("The Anthropic API key (input hidden;")
            term.type(f"{BAD}\r")
            await term.expect("Model id [claude-sonnet-4-6]: ")
            term.type("\r")
            await term.expect("✗ model claude/claude-sonnet-4-6: claude: HTTP 401")
            await term.expect("fix: a valid key in ANTHROPIC_API_KEY")
            await term.expect("Another Anthropic API key (input hidden;")
            term.type(f"{GOOD}\r")
            await term.expect("✓ model claude/claude-sonnet-4-6: answered in")
            await term.expect("Discord: should the agent answer on a Discord server? [y/N]")
            term.type("\r")
            await term.expect("Google Chat: should the agent answer in Google Chat")
            term.type("n\r")
            await term.expect("sandbox")
            await term.expect("Mode (auto, bwrap, landlock, off) [auto]: ")
            term.type("\r")
            await term.expect("Let the tools' processes reach the network? [y/N]")
            term.type("\r")
            await term.expect("To write kesoku.toml:")
            await term.expect('agent.llm = "claude"')
            await term.expect("ANTHROPIC_API_KEY")
            await term.expect("Write them? [Y/n]")
            term.type("\r")
            await term.expect('kesoku chat "hello"')
            assert await term.exit_code() == 0, term.output
        finally:
            await term.aclose()
        # the keys were typed without echo and never printed
        assert GOOD not in term.output and BAD not in term.output
        assert [r.headers["authorization"] for r in fake.log.requests] == [
            f"Bearer {BAD}",
            f"Bearer {GOOD}",
        ]

        text = (tmp_path / "kesoku.toml").read_text()
        assert GOOD not in text and "api_key" not in text
        cfg = await written(tmp_path)  # the file alone, no environment
        assert cfg.agent.llm == "claude" and cfg.claude.base_url == url
        assert cfg.claude.model_name == "claude-sonnet-4-6" and cfg.claude.api_key is None
        assert not cfg.discord.enabled and not cfg.gchat.enabled
        assert "# The model: claude, gemini, openai" in text  # a new file is commented
        keys = keys_file(tmp_path)
        assert stat.S_IMODE(keys.stat().st_mode) == 0o600
        assert read_env_file(keys) == {"ANTHROPIC_API_KEY": GOOD}

        # By hand: a comment and a key init knows nothing of. A re-run changing only the model
        # keeps both, and every other line: the key comes from the keys file.
        edited = text.replace("[agent]\n", "[agent]\n# mine: keep this note\n") + (
            "\n[shell]\ntimeout_s = 42.0  # slow machine\n"
        )
        (tmp_path / "kesoku.toml").write_text(edited)
        again = await init(tmp_path, "--model", "claude-opus-4-6", "--yes")
        assert again.returncode == 0, again.stderr.decode()
        assert "✓ model claude/claude-opus-4-6: answered in" in again.stdout.decode()
    after = (tmp_path / "kesoku.toml").read_text()
    changed = [
        line for line in difflib.ndiff(edited.splitlines(), after.splitlines()) if line[:1] in "+-"
    ]
    assert changed == ['- model_name = "claude-sonnet-4-6"', '+ model_name = "claude-opus-4-6"']
    assert (await written(tmp_path)).shell.timeout_s == 42.0
    assert read_env_file(keys_file(tmp_path)) == {"ANTHROPIC_API_KEY": GOOD}


async def test_discord_and_google_chat_answers_each_checked_the_token_kept_apart(
    tmp_path: Path,
    subscription: tuple[str, str],  # noqa: F811 (the fixture)
) -> None:
    project, name = subscription  # in the Pub/Sub emulator
    token = "MTAx.discord-bot-token.0123456789"
    model = OpenAIFake(api_key=None, model_id="served-model")
    model.push(openai_reply("OK"))
    async with model.serve() as url:
        term = await Terminal.start(
            tmp_path,
            *("--llm", "openai", "--base-url", url, "--model", "served-model"),
            PUBSUB_EMULATOR_HOST=os.environ["PUBSUB_EMULATOR_HOST"],
        )
        try:
            await term.expect("Does this server want an API key? [y/N]")
            term.type("\r")
            await term.expect("✓ model openai/served-model: answered in")
            await term.expect("Discord: should the agent answer on a Discord server? [y/N]")
            term.type("y\r")
            await term.expect("Message Content intent")
            await term.expect("Bot token (input hidden; Enter alone: no Discord)")
            term.type(f"{token}\r")
            # discord.com is not reachable from the tests: the check fails, kept unchecked
            await term.expect("✗ Discord bot token:")
            await term.expect("What now? [1]: ")
            term.type("3\r")
            await term.expect("Google Chat: should the agent answer in Google Chat")
            term.type("y\r")
            await term.expect("Google Cloud project: ")
            term.type(f"{project}\r")
            await term.expect("Pub/Sub subscription (its name in that project")
            term.type("no-such-subscription\r")
            await term.expect("Service-account key file (Enter alone: Application Default")
            term.type("\r")
            await term.expect("✗ Google Chat subscription:")
            await term.expect("does not exist")
            await term.expect("What now? [1]: ")
            term.type("\r")  # answer again
            await term.expect(f"Google Cloud project [{project}]: ")
            term.type("\r")
            await term.expect("Pub/Sub subscription (its name in that project")
            term.type(f"{name}\r")
            await term.expect("Service-account key file")
            term.type("\r")
            await term.expect(
                f"✓ Google Chat subscription: projects/{project}/subscriptions/{name} exists"
            )
            await term.expect("Mode (auto, bwrap, landlock, off) [auto]: ")
            term.type("\r")
            await term.expect("reach the network? [y/N]")
            term.type("y\r")
            await term.expect("Write them? [Y/n]")
            term.type("y\r")
            assert await term.exit_code() == 0, term.output
        finally:
            await term.aclose()
    assert token not in term.output
    text = (tmp_path / "kesoku.toml").read_text()
    assert token not in text
    cfg = await written(tmp_path)
    assert cfg.discord.enabled and cfg.discord.bot_token is None
    assert (cfg.gchat.enabled, cfg.gchat.project_id, cfg.gchat.subscription) == (
        True,
        project,
        name,
    )
    assert cfg.gchat.credentials_file is None and cfg.sandbox.network
    assert read_env_file(keys_file(tmp_path)) == {"DISCORD_TOKEN": token}


async def test_ctrl_c_at_a_question_leaves_with_130_and_writes_nothing(tmp_path: Path) -> None:
    term = await Terminal.start(tmp_path, "--llm", "claude")
    try:
        await term.expect("The Anthropic API key (input hidden;")
        term.type("\x03")  # Ctrl-C: the terminal sends SIGINT
        assert await term.exit_code() == 130
    finally:
        await term.aclose()
    assert "init: stopped; nothing was written" in term.output
    assert "Traceback" not in term.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no kesoku.toml, no keys file


async def test_a_key_from_the_environment_is_checked_and_stored_without_a_terminal(
    tmp_path: Path,
) -> None:
    fake = AnthropicFake(api_key=GOOD)
    fake.push(text_reply("OK"))
    async with fake.serve() as url:
        done = await init(
            tmp_path, "--llm", "claude", "--base-url", url, "--yes", ANTHROPIC_API_KEY=GOOD
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "✓ model claude/claude-sonnet-4-6: answered in" in out and GOOD not in out
    assert "kesoku service install" in out
    assert read_env_file(keys_file(tmp_path)) == {"ANTHROPIC_API_KEY": GOOD}
    cfg = await written(tmp_path)
    assert (cfg.agent.llm, cfg.claude.base_url, cfg.claude.api_key) == ("claude", url, None)


async def test_a_refused_key_without_a_terminal_exits_1_and_writes_nothing(
    tmp_path: Path,
) -> None:
    fake = AnthropicFake(api_key=GOOD)
    async with fake.serve() as url:
        done = await init(tmp_path, "--llm", "claude", "--base-url", url, ANTHROPIC_API_KEY=BAD)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 1
    assert "✗ model claude/claude-sonnet-4-6: claude: HTTP 401" in out
    assert err == (
        "kesoku: init: model claude/claude-sonnet-4-6: the check failed (see above; --no-check "
        "writes anyway); nothing was written\n"
    )
    assert BAD not in out + err
    assert list(tmp_path.iterdir()) == []


async def test_a_missing_answer_without_a_terminal_exits_2_naming_the_flag(
    tmp_path: Path,
) -> None:
    cases: list[tuple[tuple[str, ...], str]] = [
        ((), "--llm is required without a terminal"),
        (("--llm", "claude"), "--llm claude needs ANTHROPIC_API_KEY in the environment"),
        (("--llm", "gemini", "--yes"), "--llm gemini needs GEMINI_API_KEY"),
        (
            ("--llm", "openai", "--base-url", "http://127.0.0.1:11434/v1"),
            "--model is required with an OpenAI-compatible server",
        ),
        (("--llm", "local", "--discord"), "--discord needs DISCORD_TOKEN in the environment"),
        (
            ("--llm", "local", "--gchat-subscription", "chat"),
            "--gchat-project is required",
        ),
        (("--llm", "local", "--model", "x"), "--llm local takes no --model"),
    ]
    for args, expected in cases:
        done = await init(tmp_path, *args)
        err = done.stderr.decode()
        assert done.returncode == 2, (args, err)
        assert err.startswith(f"kesoku: init: {expected}") and err.count("\n") == 1, err
        assert list(tmp_path.iterdir()) == [], args


async def test_a_local_server_and_discord_are_added_to_an_existing_file_keeping_it(
    tmp_path: Path,
) -> None:
    mine = (
        "# my setup\n"
        "[agent]\n"
        'persona = "terse"  # short answers\n'
        "\n"
        "[[discord.channels]]\n"
        'channels = ["general"]\n'
        "auto_thread = false\n"
    )
    (tmp_path / "kesoku.toml").write_text(mine)
    (tmp_path / "kesoku.toml").chmod(0o600)
    fake = OpenAIFake(api_key=None, server="ollama", model_id="llama3.2")
    fake.push(openai_reply("OK"))
    async with fake.serve() as url:
        # the server is checked; the Discord token is not (no Discord here): --no-check would
        # skip both, so the model is checked first, alone
        done = await init(tmp_path, "--llm", "openai", "--base-url", url, "--model", "llama3.2")
        assert done.returncode == 0, done.stderr.decode()
        assert "✓ model openai/llama3.2: answered in" in done.stdout.decode()
    added = await init(tmp_path, "--discord", "--no-check", DISCORD_TOKEN="bot.token.value")
    assert added.returncode == 0, added.stderr.decode()
    text = (tmp_path / "kesoku.toml").read_text()
    assert text.startswith(mine.split("\n\n")[0])  # the comment and [agent] as they were
    cfg = await written(tmp_path)
    assert (cfg.agent.llm, cfg.agent.persona) == ("openai", "terse")
    assert (cfg.openai.base_url, cfg.openai.model_name) == (url, "llama3.2")
    assert cfg.discord.enabled and cfg.discord.channels[0].channels == ("general",)
    assert cfg.discord.bot_token is None and "bot.token.value" not in text
    assert read_env_file(keys_file(tmp_path)) == {"DISCORD_TOKEN": "bot.token.value"}
    assert stat.S_IMODE((tmp_path / "kesoku.toml").stat().st_mode) == 0o600  # kept private
    unchanged = await init(tmp_path, "--discord", "--no-check", DISCORD_TOKEN="bot.token.value")
    assert unchanged.stdout.decode().startswith("nothing to change")


async def test_a_config_that_does_not_load_is_not_edited(tmp_path: Path) -> None:
    (tmp_path / "kesoku.toml").write_text("[agent]\nllm = 'nope'\n")
    done = await init(tmp_path, "--llm", "local", "--no-check")
    err = done.stderr.decode()
    assert done.returncode == 2 and err.startswith("kesoku: kesoku.toml:2: agent.llm")
    assert "init edits the file it reads" in err
    assert (tmp_path / "kesoku.toml").read_text() == "[agent]\nllm = 'nope'\n"
