"""``[discord] api_base_url`` and ``gateway_url``: their defaults are discord.py's own, and the
client sets them process-wide (the adapter against the fake through them: test_discord_adapter.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kesoku_discord._compat import discord
from kesoku_discord.client import use_endpoints
from test_discord_adapter import restore_endpoints

from kesoku.config.settings import DiscordConfig

PRISTINE = (
    "import json, warnings; warnings.simplefilter('ignore'); import discord; "
    "gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY; "
    "print(json.dumps([discord.http.Route.BASE, str(gateway)]))"
)


def test_the_defaults_are_the_endpoints_discord_py_ships_with() -> None:
    # A fresh interpreter: this one's discord.py may have been pointed elsewhere by another test.
    result = subprocess.run(
        [sys.executable, "-c", PRISTINE],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    defaults = DiscordConfig()
    assert json.loads(result.stdout) == [defaults.api_base_url, defaults.gateway_url]


def test_use_endpoints_moves_rest_and_gateway_and_the_defaults_move_them_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    restore_endpoints(monkeypatch)
    use_endpoints("http://127.0.0.1:9/proxy/api/v10/", "ws://127.0.0.1:9/gateway")
    assert (
        discord.http.Route("GET", "/users/@me").url == "http://127.0.0.1:9/proxy/api/v10/users/@me"
    )
    gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    assert str(gateway.with_query(v=10)) == "ws://127.0.0.1:9/gateway?v=10"
    # The defaults put discord.py back at Discord (a client is made with them after a fake's).
    defaults = DiscordConfig()
    use_endpoints(defaults.api_base_url, defaults.gateway_url)
    assert discord.http.Route("GET", "/users/@me").url == "https://discord.com/api/v10/users/@me"
    assert str(discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY) == "wss://gateway.discord.gg/"
