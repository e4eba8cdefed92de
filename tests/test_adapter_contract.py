"""The adapter contract (kesoku.testing.adapters.check_adapter_contract) over the first-party chat
adapters: Discord against the loopback fake of Discord (REST and gateway websocket), Google Chat
against the in-process Pub/Sub fake and the loopback Chat fake. Nothing is mocked.

What only one platform does (threads, headers, cards, reactions, Pub/Sub retries) stays in
test_discord_*.py and test_gchat_*.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from fakes.chat_api import ChatFake
from fakes.discord_api import BOT_ID, FakeDiscord, FakeUser, serve_discord
from fakes.server import serve_app
from test_discord_adapter import config_for, restore_endpoints
from test_gchat_support import SUBSCRIPTION, FakePubSub, click_event, message_event, texts

from kesoku.config.settings import GChatConfig
from kesoku.host.adapters import AdapterContext
from kesoku.testing.adapters import PlatformDriver, check_adapter_contract

# -- Discord --------------------------------------------------------------------------------------


@dataclass
class DiscordDriver:
    """One user (allow-listed) in a channel where the bot answers without a thread."""

    fake: FakeDiscord
    channel: int
    user: FakeUser

    async def send_user_message(self, text: str) -> str:
        await trio.lowlevel.checkpoint()
        return str(self.fake.user_says(self.channel, self.user, text)["id"])

    async def redeliver(self, message_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self.fake.replay(self.fake.messages[int(message_id)])

    async def answer_question(self, prompt: str, choice: str) -> bool:
        await trio.lowlevel.checkpoint()
        for message in self.fake.bot_messages(self.channel):
            if prompt not in message["content"]:
                continue
            for row in message.get("components") or []:
                for button in row["components"]:
                    if button.get("label") == choice and not button.get("disabled"):
                        self.fake.click(int(message["id"]), button["custom_id"], self.user)
                        return True
        return False

    def sent_texts(self) -> list[str]:
        return [
            m["content"] for m in self.fake.messages.values() if m["author"]["id"] == str(BOT_ID)
        ]

    def sent_files(self) -> list[bytes]:
        return [data for files in self.fake.uploads.values() for _, data in files]


async def test_the_discord_adapter_keeps_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kesoku_discord.adapter import DiscordAdapter

    async def no_restart() -> None:
        await trio.lowlevel.checkpoint()

    restore_endpoints(monkeypatch)
    async with serve_discord() as fake:
        config = config_for(
            tmp_path, api_base_url=f"{fake.base_url}/api/v10", gateway_url=fake.ws_url
        )

        async def start(ctx: AdapterContext, *, task_status: trio.TaskStatus[None]) -> None:
            adapter = DiscordAdapter(ctx, config, restart=no_restart, guild_ready_timeout=0.05)
            await adapter.serve(task_status=task_status)

        fake.add_channel("general")
        quiet = fake.add_channel("quiet")  # config_for: answered in the channel, no thread
        alice = fake.add_user(5001, "alice")  # config_for: the allow-listed user
        driver: PlatformDriver = DiscordDriver(fake, quiet, alice)
        await check_adapter_contract(
            start, driver, adapter=config.discord.chatbot_id, folder=tmp_path / "contract"
        )
        assert fake.identifies == 2, "the restarted adapter logged in anew"


# -- Google Chat ----------------------------------------------------------------------------------


@dataclass
class GChatDriver:
    """One user in one thread of a space: MESSAGE and CARD_CLICKED events through Pub/Sub."""

    pubsub: FakePubSub
    chat: ChatFake
    published: dict[str, bytes] = field(default_factory=dict)

    async def send_user_message(self, text: str) -> str:
        await trio.lowlevel.checkpoint()
        n = len(self.published) + 1
        name = f"spaces/AAAA/messages/C{n}.C{n}"
        self.published[name] = message_event(text, name=name)
        self.pubsub.publish(self.published[name])
        return name

    async def redeliver(self, message_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self.pubsub.publish(self.published[message_id])

    async def answer_question(self, prompt: str, choice: str) -> bool:
        await trio.lowlevel.checkpoint()
        for request in self.chat.created():
            if not any(prompt in t for t in _markdown(request.body)):
                continue
            for button in _buttons(request.body):
                if button.get("text") == choice:
                    action = button["onClick"]["action"]
                    parameters = {p["key"]: p["value"] for p in action["parameters"]}
                    self.pubsub.publish(click_event(action["function"], **parameters))
                    return True
        return False

    def sent_texts(self) -> list[str]:
        return [t for r in self.chat.created() for t in texts(r.body)]

    def sent_files(self) -> list[bytes]:
        return []  # the app sends no files to Chat


def _widgets(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        widget
        for card in body.get("cardsV2", [])
        for section in card["card"]["sections"]
        for widget in section["widgets"]
    ]


def _markdown(body: dict[str, Any]) -> list[str]:
    return [w["textParagraph"]["text"] for w in _widgets(body) if "textParagraph" in w]


def _buttons(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for w in _widgets(body) if "buttonList" in w for b in w["buttonList"]["buttons"]]


async def test_the_google_chat_adapter_keeps_the_contract(
    tmp_path: Path, pubsub: FakePubSub
) -> None:
    from google.auth.credentials import AnonymousCredentials
    from kesoku_gchat.adapter import GChatAdapter
    from kesoku_gchat.chat_api import ChatApi
    from kesoku_gchat.pubsub import Puller, default_subscriber

    gchat = GChatConfig(enabled=True, subscription=SUBSCRIPTION, reaction_emoji=None)
    chat = ChatFake()
    async with serve_app(chat.app()) as base_url:

        async def start(ctx: AdapterContext, *, task_status: trio.TaskStatus[None]) -> None:
            credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
            api = await ChatApi.connect(credentials, endpoint=base_url, user=None)
            puller = Puller(SUBSCRIPTION, default_subscriber(None))
            adapter = GChatAdapter(ctx, gchat, api, puller, card_interval_s=0.05)
            await adapter.serve(task_status=task_status)

        driver: PlatformDriver = GChatDriver(pubsub, chat)
        await check_adapter_contract(
            start, driver, adapter=gchat.chatbot_id, folder=tmp_path / "contract"
        )
