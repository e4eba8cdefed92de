"""`kesoku doctor` on a healthy and a broken setup, as the real CLI in a subprocess.

Real parts: the model APIs' loopback fakes (a refused key is their own 401), a database made by
Store, the tests' MCP server (and a server whose program does not exist), a keys file in a
temporary XDG_CONFIG_HOME, the unit written by the real `kesoku service install`, and a fake
systemctl on PATH (the real one needs a running systemd)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
import trio
from fakes.discord_api import BOT_ID, serve_discord

from kesoku.config.envfile import KEY_VARIABLES, render_env_file, write_private
from kesoku.config.settings import Config, DiscordConfig, load_config
from kesoku.host.checks import check_sandbox
from kesoku.host.doctor import Finding, _bounded, adapter_findings, diagnose, parse_unit
from kesoku.host.service import plan_unit
from kesoku.store import Store
from kesoku.testing.fakes import anthropic_api, openai_api

REPO = Path(__file__).resolve().parent.parent
MCP_SERVER = Path(__file__).resolve().parent / "data" / "mcp" / "server.py"
CLEARED = ("KESOKU_CONFIG", "XDG_CONFIG_HOME", "SUDO_USER", *KEY_VARIABLES)
SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$FAKE_LOG"
if [ "$1" = "--user" ]; then shift; fi
case "$1" in
  show) echo "Version=252";;
  is-active) echo "${FAKE_STATE:-active}"; [ "${FAKE_STATE:-active}" = active ]; exit $?;;
esac
exit 0
"""
KEY = "sk-doctor-right-key"
SLOW_MACHINE = ("--timeout", "90")
"""A model check's time includes importing the SDK (seconds on a busy machine): not the point."""


class Setup:
    """A home, a config folder, a keys file and a fake systemctl: the doctor's world."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.xdg = tmp_path / "xdg"
        self.keys = self.xdg / "kesoku" / "kesoku.env"
        self.agent = tmp_path / "my agent"  # a space: the unit must quote it
        self.agent.mkdir()
        self.config = self.agent / "kesoku.toml"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        systemctl = self.bin / "systemctl"
        systemctl.write_text(SYSTEMCTL)
        systemctl.chmod(0o755)
        self.log = tmp_path / "systemctl.log"
        self.unit = self.xdg / "systemd" / "user" / "kesoku.service"

    def env(self, **extra: str) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if k not in CLEARED}
        return environ | {
            "HOME": str(self.home),
            "XDG_CONFIG_HOME": str(self.xdg),
            "XDG_STATE_HOME": str(self.root / "state"),
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "FAKE_LOG": str(self.log),
            **extra,
        }

    def write_keys(self, mode: int, **values: str) -> None:
        write_private(self.keys, render_env_file(values, header="test keys"))
        self.keys.chmod(mode)

    async def kesoku(self, *args: str, **extra: str) -> tuple[int, str, str]:
        with trio.fail_after(240):
            done = await trio.run_process(
                [sys.executable, "-m", "kesoku", *args],
                cwd=self.agent,
                env=self.env(**extra),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


def mcp_server(name: str, command: str, *args: str) -> str:
    quoted = ", ".join(f"'{a}'" for a in args)
    return (
        f'[[mcp.servers]]\nname = "{name}"\ntransport = "stdio"\n'
        f"command = '{command}'\nargs = [{quoted}]\n"
    )


def report(stdout: str) -> dict[str, list[str]]:
    """Each finding's first line, keyed by its mark; fixes are the lines starting with →."""
    out: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        mark = line[:4].strip()
        if mark in ("ok", "warn", "FAIL", "--"):
            out.setdefault(mark, []).append(line[6:])
    return out


def fix_of(stdout: str, start: str) -> str:
    """The fix line under the finding that starts with ``start``."""
    lines = stdout.splitlines()
    index = next(i for i, line in enumerate(lines) if line[6:].startswith(start))
    fix = lines[index + 1]
    assert fix.startswith("      → "), lines[index : index + 2]
    return fix.removeprefix("      → ")


async def test_a_healthy_setup_says_so_line_by_line_and_exits_0(setup: Setup) -> None:
    fake = openai_api.OpenAIFake(api_key=KEY, server="openai")
    fake.handler = lambda body: openai_api.text_reply("OK")
    async with fake.serve() as url:
        setup.config.write_text(
            f'[openai]\nbase_url = "{url}"\nmodel_name = "gpt-test"\n'
            + mcp_server("tools", sys.executable, str(MCP_SERVER), "stdio")
        )
        setup.write_keys(0o600, OPENAI_API_KEY=KEY)
        store = Store(setup.agent / "kesoku.db")
        store.create_session("terminal", "t-1", workspace_root=setup.agent / "sessions")
        store.create_session("discord", "c-1", workspace_root=setup.agent / "sessions")
        store.close()
        code, out, err = await setup.kesoku("service", "install", "-c", str(setup.config))
        assert code == 0, err
        code, out, err = await setup.kesoku("doctor", "-c", str(setup.config), *SLOW_MACHINE)
    # The one part this test cannot set up: whether bubblewrap or Landlock works on this machine.
    cfg = load_config(setup.config, env={})
    sandbox = Finding(await trio.to_thread.run_sync(check_sandbox, cfg))
    assert code == (0 if sandbox.check.ok else 1), out + err
    assert err == ""
    found = report(out)
    assert f"sandbox: {sandbox.check.detail}" in found[sandbox.mark]
    problems = [line for mark in ("FAIL", "warn") for line in found.get(mark, [])]
    assert [line for line in problems if not line.startswith("sandbox:")] == [], out
    ok = found["ok"]
    assert f"config: {setup.config}" in ok
    assert f"keys file: {setup.keys} (mode 0600): 1 variable(s)" in ok
    assert "keys: OPENAI_API_KEY (keys file)" in ok
    assert any(line.startswith("model openai") for line in ok), out
    assert "MCP tools: connected (stdio): 12 tool(s), 1 prompt(s)" in ok
    db = setup.agent / "kesoku.db"
    assert any(line.startswith(f"database: {db}: 2 session(s), ") for line in ok), out
    assert f"service (user unit): {setup.unit}: runs {setup.config}" in ok
    assert (
        "service (user unit): its environment carries the keys its config uses: "
        "openai.api_key, openai.base_url" in ok
    )
    assert "service (user unit): active" in ok
    assert found["--"] == [
        "backend: openai: an OpenAI key or base_url is configured",
        "adapters: none enabled: only kesoku chat reaches the agent",
        "daemon: none serves kesoku.db: kesoku chat runs its own runtime",
    ]
    # Sections in their fixed order, whatever order they finished in.
    firsts = [line[6:].split(":")[0].split(" ")[0] for line in out.splitlines() if line[:1] != " "]
    order = ["config", "keys", "backend", "model", "adapters", "MCP", "sandbox", "database"]
    order.append("daemon")
    assert [w for w in dict.fromkeys(firsts) if w][: len(order) + 1] == [*order, "service"]
    if sandbox.mark == "ok":
        assert out.rstrip().endswith("\nall well")
    assert KEY not in out
    assert len(fake.bodies) == 1  # one live call
    assert "systemctl --user is-active kesoku.service" in setup.log.read_text().splitlines()


async def test_a_broken_setup_names_each_problem_with_its_fix_and_exits_1(setup: Setup) -> None:
    fake = anthropic_api.AnthropicFake(api_key=KEY)
    async with fake.serve() as url:
        setup.config.write_text(
            f'[claude]\nbase_url = "{url}"\n'
            "[discord]\nenabled = true\n"
            '[workspace]\ndb_path = "state/kesoku.db"\n'
            + mcp_server("gone", "/nonexistent/mcp-server")
        )
        (setup.agent / "state").mkdir()
        (setup.agent / "state" / "kesoku.db").write_text("not a database, a note\n" * 100)
        setup.write_keys(0o600, MY_SERVICE_TOKEN="for a tool")
        # Installed from a shell without the model key: the unit's environment lacks it.
        code, _, err = await setup.kesoku("service", "install", "-c", str(setup.config))
        assert code == 0, err
        setup.keys.chmod(0o644)  # opened up by hand afterwards
        code, out, err = await setup.kesoku(
            "doctor",
            "-c",
            str(setup.config),
            *SLOW_MACHINE,
            FAKE_STATE="failed",
            ANTHROPIC_API_KEY="sk-wrong",
        )
    assert code == 1, out + err
    assert err == ""
    found = report(out)
    fails = found["FAIL"]
    assert "keys: ANTHROPIC_API_KEY (shell)" in found["ok"]
    # The refused key: the fake's own 401.
    model = next(line for line in fails if line.startswith("model claude"))
    assert "401" in model or "key" in model.lower(), model
    assert "sk-wrong" not in out
    assert fix_of(out, model)
    # The MCP server whose program does not exist.
    assert "MCP gone: cannot start /nonexistent/mcp-server: no such program" in fails
    assert fix_of(out, "MCP gone").startswith("check its command (/nonexistent/mcp-server)")
    # Discord enabled without a token.
    assert "adapter discord: enabled, but no bot token" in fails
    assert "DISCORD_TOKEN" in fix_of(out, "adapter discord")
    # The database is some other file.
    database = next(line for line in fails if line.startswith("database"))
    assert "not a Kesoku database" in database
    assert "workspace.db_path" in fix_of(out, "database")
    # The keys file others may read: a warning, with its fix.
    assert (
        f"keys file: {setup.keys} is open to other users (mode 0644), and it holds keys"
        in (found["warn"])
    )
    assert fix_of(out, "keys file") == f"chmod 600 {shlex.quote(str(setup.keys))}"
    # The unit installed without the key: the service would not answer with Claude.
    carried = (
        "service (user unit): its environment lacks keys this shell has (ANTHROPIC_API_KEY): "
        "the service would answer with the small offline model, not claude"
    )
    assert carried in fails
    assert fix_of(out, carried[:40]).startswith(
        f"kesoku service install -c {shlex.quote(str(setup.config))}: it carries the keys"
    )
    assert "service (user unit): failed" in fails
    assert fix_of(out, "service (user unit): failed").startswith("kesoku service logs")
    assert out.rstrip().endswith("each line above says what to do")


async def test_no_call_calls_no_model_and_a_missing_systemd_is_a_fact(setup: Setup) -> None:
    fake = openai_api.OpenAIFake(api_key=KEY, server="openai")
    async with fake.serve() as url:
        setup.config.write_text(f'[openai]\nbase_url = "{url}"\n')
        cfg = load_config(setup.config, env={})
        env = setup.env(PATH="/nonexistent")  # no systemctl anywhere
        sections: list[list[Finding]] = []
        findings = await diagnose(
            cfg, setup.config, call_model=False, env=env, on_section=sections.append
        )
    assert fake.bodies == []
    assert all(f.check.ok for f in findings), [f.lines() for f in findings]
    lines = {f.check.what: (f.mark, f.check.detail) for f in findings}
    assert lines["model openai/gpt-5-mini"] == ("--", "not called (--no-call)")
    assert lines["keys"][0] == "--"
    assert lines["keys file"] == ("--", f"none at {setup.keys}")
    assert lines["database"] == (
        "--",
        f"none yet at {setup.agent / 'kesoku.db'}: made at the first message",
    )
    assert lines["MCP servers"] == ("--", "none configured")
    assert lines["service"] == (
        "--",
        "not installed; systemd is not available here (no systemctl on PATH)",
    )
    # Each section reported once, in order, as soon as those above it were done.
    assert [f for section in sections for f in section] == findings
    assert len(sections) == 8


async def test_an_inactive_unit_for_another_config_is_a_warning(setup: Setup) -> None:
    setup.config.write_text('[agent]\nllm = "local"\n')
    other = setup.root / "other.toml"
    other.write_text('[agent]\nllm = "local"\n')
    env = setup.env(FAKE_STATE="inactive")
    unit = plan_unit(other, [], user=True, env=env)
    setup.unit.parent.mkdir(parents=True)
    setup.unit.write_text(unit.render())
    cfg = load_config(setup.config, env={})
    findings = await diagnose(cfg, setup.config, call_model=False, env=env)
    service = [f for f in findings if f.check.what == "service (user unit)"]
    assert [(f.mark, f.check.detail) for f in service] == [
        ("warn", f"runs {other}, not {setup.config} (checked here)"),
        ("ok", "its environment carries the keys its config uses: none needed"),
        ("warn", "inactive: installed but not running"),
    ]
    assert service[0].check.fix == f"kesoku doctor -c {other} checks the service's config"
    assert service[2].check.fix == "kesoku service start"


async def test_a_unit_from_before_python_p_fails_with_the_fix(setup: Setup) -> None:
    setup.config.write_text('[agent]\nllm = "local"\n')
    env = setup.env(FAKE_STATE="active")
    old = plan_unit(setup.config, [], user=True, env=env).render().replace(" -P -m ", " -m ")
    setup.unit.parent.mkdir(parents=True)
    setup.unit.write_text(old)
    findings = await diagnose(load_config(setup.config, env={}), setup.config, call_model=False,
                              env=env)  # fmt: skip
    [bad] = [f for f in findings if f.check.what == "service (user unit)" and not f.check.ok]
    assert bad.check.detail.startswith("ExecStart runs python -m without -P: it imports from")
    assert bad.check.fix == f"kesoku service install -c {shlex.quote(str(setup.config))}"


def test_the_unit_is_read_back_as_install_renders_it(setup: Setup) -> None:
    odd = setup.root / '50% $HOME "quoted" it\'s'
    odd.mkdir()
    config = odd / "kesoku.toml"
    config.write_text("")
    env = setup.env(OPENAI_BASE_URL="http://127.0.0.1:9/v1", OPENAI_API_KEY="sk-x")
    unit = plan_unit(config, ["A=1 2"], user=True, env=env, python="/opt/my venv/bin/python")
    parsed = parse_unit(unit.render())
    assert parsed.exec_start == (
        "/opt/my venv/bin/python",
        "-P",
        "-m",
        "kesoku",
        "start",
        "-c",
        str(config),
    )
    assert parsed.config == str(config)
    assert parsed.environment["OPENAI_BASE_URL"] == "http://127.0.0.1:9/v1"
    assert "OPENAI_API_KEY" not in parsed.environment  # a secret: in the EnvironmentFile
    assert parsed.env_files == (str(setup.keys),)
    assert parsed.user is None


async def test_a_config_that_does_not_load_is_one_line_and_exit_2(setup: Setup) -> None:
    setup.config.write_text("[agent]\nllm = 3\n")
    code, out, err = await setup.kesoku("doctor", "-c", str(setup.config))
    assert code == 2
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"kesoku: {setup.config}:2: agent.llm")


async def test_a_malformed_keys_file_is_a_finding_of_doctor_and_stops_other_commands(
    setup: Setup,
) -> None:
    setup.keys.parent.mkdir(parents=True)
    write_private(setup.keys, "OPENAI_API_KEY=sk-1\nthis line is no assignment\n")
    setup.config.write_text('[agent]\nllm = "local"\n')
    code, out, _ = await setup.kesoku("doctor", "-c", str(setup.config), "--no-call", "--json")
    keys_file = next(row for row in json.loads(out) if row["what"] == "keys file")
    assert (code, keys_file["mark"]) == (1, "FAIL"), keys_file
    assert f"{setup.keys}:2" in keys_file["detail"], keys_file
    code, out, err = await setup.kesoku("config", "check", "-c", str(setup.config))
    assert (code, out) == (2, "")
    assert err.startswith(f"kesoku: {setup.keys}:2"), err


async def test_a_key_in_the_config_that_hides_a_newer_exported_one_is_a_warning(
    setup: Setup,
) -> None:
    setup.config.write_text('[agent]\nllm = "claude"\n[claude]\napi_key = "sk-old"\n')
    setup.config.chmod(0o600)
    code, out, _ = await setup.kesoku(
        "doctor", "-c", str(setup.config), "--no-call", ANTHROPIC_API_KEY="sk-new"
    )
    assert code == 0, out
    warning = "keys: kesoku.toml sets claude.api_key: it is used, not $ANTHROPIC_API_KEY"
    assert warning in report(out)["warn"], out
    assert fix_of(out, "keys: kesoku.toml sets") == (
        f"remove claude.api_key from {setup.config} to use $ANTHROPIC_API_KEY"
    )
    _, same, _ = await setup.kesoku(
        "doctor", "-c", str(setup.config), "--no-call", ANTHROPIC_API_KEY="sk-old"
    )
    assert "it is used, not" not in same


async def test_a_section_that_breaks_or_hangs_is_one_failed_line(autojump_clock: object) -> None:
    async def broken() -> list[Finding]:
        raise RuntimeError("a bug\nin two lines")

    async def hanging() -> list[Finding]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    (bug,) = await _bounded("database", broken, 10.0)
    assert (bug.mark, bug.check.detail) == (
        "FAIL",
        "the check itself broke: RuntimeError: a bug in two lines",
    )
    (hang,) = await _bounded("MCP servers", hanging, 70.0)
    assert (hang.mark, hang.check.what, hang.check.detail) == (
        "FAIL",
        "MCP servers",
        "no answer within 70 s",
    )


async def test_no_call_still_fails_a_chosen_backend_without_its_key(setup: Setup) -> None:
    setup.config.write_text('[agent]\nllm = "claude"\n')
    code, out, _ = await setup.kesoku(
        "doctor", "-c", str(setup.config), "--no-call", "--json", PATH="/usr/bin:/bin"
    )
    model = next(row for row in json.loads(out) if row["what"].startswith("model claude"))
    assert (code, model["mark"]) == (1, "FAIL"), model
    assert "ANTHROPIC_API_KEY" in model["detail"] + model["fix"], model


async def test_json_lists_every_finding_with_its_mark(setup: Setup) -> None:
    setup.config.write_text('[agent]\nllm = "local"\n[sandbox]\nmode = "off"\n')
    code, out, err = await setup.kesoku(
        "doctor", "-c", str(setup.config), "--no-call", "--json", PATH="/usr/bin:/bin"
    )
    assert (code, err) == (0, "")
    rows = json.loads(out)
    assert [row["what"] for row in rows] == [
        "config",
        "keys file",
        "keys",
        "model local/SmolLM2-135M-Instruct",
        "adapters",
        "MCP servers",
        "sandbox",
        "database",
        "service",
    ]
    assert {row["what"]: row["mark"] for row in rows}["sandbox"] == "warn"
    assert rows[-1]["mark"] == "--" and rows[-1]["detail"].startswith("not installed")


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            '[gchat]\nenabled = true\nproject_id = "p"\n',
            ("enabled, but gchat.subscription unset", "set them in kesoku.toml"),
        ),
        (
            '[gchat]\nenabled = true\nproject_id = "p"\nsubscription = "s"\n'
            'credentials_file = "missing.json"\n',
            ("cannot read the credentials file {agent}/missing.json", "fix gchat.credentials_file"),
        ),
    ],
)
async def test_google_chat_settings_are_checked_before_pubsub_is_asked(
    setup: Setup, section: str, expected: tuple[str, str]
) -> None:
    setup.config.write_text(section)
    cfg = load_config(setup.config, env={})
    findings = await diagnose(cfg, setup.config, call_model=False, env=setup.env())
    (gchat,) = [f for f in findings if f.check.what == "adapter gchat"]
    detail, fix = expected
    assert (gchat.mark, gchat.check.detail) == ("FAIL", detail.format(agent=setup.agent))
    assert gchat.check.fix.startswith(fix)


async def test_doctor_asks_discord_at_the_configured_api_base_url() -> None:
    async with serve_discord() as fake:
        fake.token = "the-bot-token.abc"
        discord = DiscordConfig(
            enabled=True, bot_token="the-bot-token.abc", api_base_url=f"{fake.base_url}/api/v10"
        )
        findings = await adapter_findings(Config(discord=discord), timeout_s=10)
    (check,) = [f.check for f in findings if f.check.what == "Discord bot token"]
    assert check.ok and check.detail == f"bot kesoku (id {BOT_ID})", check
    assert next(r.path for r in fake.log.requests) == "/api/v10/users/@me"
