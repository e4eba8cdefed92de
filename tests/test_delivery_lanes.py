"""Delivery lanes and cursor: order per channel, channels independent, bounds, restarts.

A real SQLite store and gateway; the platform is :class:`Platform`, whose channels can be made
unreachable (a delivery then retries with backoff, as Discord's send does). Time is trio's
autojump clock. The adapters' end-to-end tests are test_discord_lanes.py and test_gchat_lanes.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from kesoku.delivery_lanes import DeliveryLanes
from kesoku.gateway import DeliveryCursor, Gateway
from kesoku.store import Store
from kesoku.vocab.model import Message, Session, user_text

NAME = "adapter:lanes"
LANES_LOG = "kesoku.delivery_lanes"


class Unreachable(Exception):
    """The platform could not be reached, the retries ran out."""


@dataclass
class Platform:
    """The chat platform on the far side of the lanes: what each channel shows, in order."""

    gateway: Gateway
    down: set[str] = field(default_factory=set)
    """Channels that cannot be reached: a delivery there retries (1 s doubling, as ``send``)."""
    give_up_after: int | None = None
    """Tries after which a delivery to a channel that is down fails (``Unreachable``)."""
    shown: list[tuple[str, int | str]] = field(default_factory=list)
    """(channel, message id or notice text), in the order the platform took them."""
    failures: list[int] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    def channel(self, message: Message) -> str:
        session = self.gateway.get_session(message.session_id)
        assert session is not None
        return session.channel_id

    def lane_of(self, session: Session) -> str:
        return f"channel {session.channel_id}"

    def shown_in(self, channel: str) -> list[int | str]:
        return [what for where, what in self.shown if where == channel]

    def _show(self, channel: str, what: int | str) -> None:
        self.shown.append((channel, what))
        self._touch()

    def _touch(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def deliver(self, message: Message) -> None:
        channel, delay_s, tries = self.channel(message), 1.0, 0
        while channel in self.down:
            tries += 1
            if self.give_up_after is not None and tries >= self.give_up_after:
                raise Unreachable(channel)
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, 60.0)
        self._show(channel, message.id)

    def failed(self, message: Message, exc: Exception) -> bool:
        self.failures.append(message.id)
        self._touch()
        return not isinstance(exc, Unreachable)

    async def notify(self, message: Message, text: str) -> None:
        await trio.lowlevel.checkpoint()
        if self.channel(message) not in self.down:  # else lost, as a notice whose send failed
            self._show(self.channel(message), text)

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds: a test that waits in vain fails (virtual time)."""
        with trio.fail_after(600):
            while not predicate():
                await self.changed.wait()


@dataclass
class Running:
    cursor: DeliveryCursor
    lanes: DeliveryLanes
    scope: trio.CancelScope


def lanes_of(
    gateway: Gateway, platform: Platform, *, lane_limit: int = 256, total_limit: int = 1024
) -> DeliveryLanes:
    cursor = DeliveryCursor(gateway, NAME)
    return DeliveryLanes(
        cursor, platform, name="test", lane_limit=lane_limit, total_limit=total_limit
    )


@asynccontextmanager
async def lanes_running(
    gateway: Gateway,
    platform: Platform,
    *,
    lane_limit: int = 256,
    total_limit: int = 1024,
    again: DeliveryLanes | None = None,
) -> AsyncIterator[Running]:
    """The lanes of a fresh cursor (or ``again`` those of an earlier run) following the log."""
    lanes = again or lanes_of(gateway, platform, lane_limit=lane_limit, total_limit=total_limit)
    cursor = lanes.cursor
    async with trio.open_nursery() as nursery:
        with gateway.listen(after=cursor.start(), adapter="lanes") as messages:
            nursery.start_soon(lanes.run, messages)
            yield Running(cursor, lanes, nursery.cancel_scope)
            nursery.cancel_scope.cancel()


@dataclass
class World:
    """Two channels' sessions, A and B, and the platform, on which A cannot be reached."""

    gateway: Gateway
    a: Session
    b: Session
    platform: Platform


@pytest.fixture
def world(gateway: Gateway) -> World:
    # The adapter's first start begins after the newest message: start it before anything is said.
    DeliveryCursor(gateway, NAME).start()
    a, b = gateway.open_session("lanes", "A"), gateway.open_session("lanes", "B")
    return World(gateway, a, b, Platform(gateway, down={"A"}))


async def say(gateway: Gateway, session: Session, text: str) -> Message:
    return await gateway.post(user_text(session.id, text))


def interleaved(a: Session, b: Session) -> list[tuple[Session, str]]:
    return [(a, "a1"), (b, "b1"), (a, "a2"), (b, "b2")]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LANES_LOG]


def saved(store: Store) -> tuple[int | None, list[int]]:
    return store.get_cursor(NAME), store.cursor_done(NAME)


async def test_a_channel_that_cannot_be_reached_holds_up_only_itself(
    world: World, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, a, b, platform = world.gateway, world.a, world.b, world.platform
    a1, b1, a2, b2 = [await say(gateway, s, t) for s, t in interleaved(a, b)]
    async with lanes_running(gateway, platform) as run:
        await platform.wait_for(lambda: len(platform.shown) == 2)
        assert platform.shown == [("B", b1.id), ("B", b2.id)], "B goes on while A is down"
        assert run.cursor.position == a1.id - 1, "the watermark waits for a1"
        assert run.cursor.done == {b1.id, b2.id}
        assert saved(gateway.store) == (a1.id - 1, [b1.id, b2.id])
        with trio.fail_after(1):
            await run.cursor.delivered(b.id, timeout_s=60)  # B's turn can end
        with trio.move_on_after(1) as waited:
            await run.cursor.delivered(a.id, timeout_s=60)
        assert waited.cancelled_caught, "A's messages are not delivered yet"

        await trio.sleep(40)
        stuck = [w for w in warnings(caplog) if "still on its way" in w]
        assert stuck == [
            "test: a reply to channel A is still on its way after 30 s; later replies "
            "there wait, other channels go on"
        ]
        assert platform.shown_in("A") == []

        platform.down.clear()
        await platform.wait_for(lambda: a2.id in platform.shown_in("A"))
        # Retried at 0, 1, 3, … 31 s: through at 63 s, then the notice, then the rest in order.
        assert platform.shown_in("A") == [a1.id, "⏳ Replies here were delayed by 1m3s.", a2.id]
        assert len([w for w in warnings(caplog) if "still on its way" in w]) == 1, "one warning"
        assert any("channel A reached again" in w for w in warnings(caplog))
        assert run.cursor.position == b2.id
        assert run.cursor.done == set()
        assert saved(gateway.store) == (b2.id, [])
        assert run.lanes.lanes == {}, "a lane with nothing to deliver is gone"
    assert saved(gateway.store) == (b2.id, []), "the cancel at the end changed nothing"
    assert platform.failures == []


async def test_the_reader_waits_when_a_lane_is_full_and_drops_nothing(
    world: World, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, a, b, platform = world.gateway, world.a, world.b, world.platform
    sent = [await say(gateway, a, f"a{i}") for i in range(3)] + [await say(gateway, b, "b0")]
    async with lanes_running(gateway, platform, lane_limit=2, total_limit=3) as run:
        await trio.sleep(10)
        assert platform.shown == [], "b0 is behind a3, which waits for room in A's lane"
        assert [m.id for m in run.lanes.lanes["channel A"].queue] == [sent[0].id, sent[1].id]
        assert run.lanes.reader_waits >= 1
        assert (
            f"test: 2 replies wait for channel A; reading the log waits (message {sent[2].id})"
            in (warnings(caplog))
        )
        platform.down.clear()
        await platform.wait_for(lambda: len(platform.shown) == 4)
        assert platform.shown_in("A") == [m.id for m in sent[:3]]
        assert platform.shown_in("B") == [sent[3].id]
        assert saved(gateway.store) == (sent[-1].id, [])


async def test_the_reader_waits_when_too_many_are_read_past_the_oldest_and_drops_nothing(
    world: World, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, a, b, platform = world.gateway, world.a, world.b, world.platform
    a1 = await say(gateway, a, "a1")
    bs = [await say(gateway, b, f"b{i}") for i in range(4)]
    async with lanes_running(gateway, platform, lane_limit=3, total_limit=3) as run:
        await trio.sleep(10)
        # a1 and two of B's are read past the watermark: b2 waits until a1 is delivered.
        assert platform.shown == [("B", bs[0].id), ("B", bs[1].id)]
        assert saved(gateway.store) == (a1.id - 1, [bs[0].id, bs[1].id]), "bounded by 3"
        line = f"test: 3 messages read past message {a1.id}, still on its way to channel A; "
        assert line + "reading the log waits" in warnings(caplog)
        platform.down.clear()
        await platform.wait_for(lambda: len(platform.shown) == 5)
        assert platform.shown_in("A") == [a1.id]
        assert platform.shown_in("B") == [m.id for m in bs]
        assert saved(gateway.store) == (bs[-1].id, [])
        assert run.cursor.open == 0


@pytest.mark.parametrize("anew", [True, False], ids=["new-objects", "same-objects"])
async def test_a_restart_mid_flight_loses_nothing_and_repeats_nothing(
    world: World, autojump_clock: trio.testing.MockClock, anew: bool
) -> None:
    gateway, a, b, platform = world.gateway, world.a, world.b, world.platform
    a1, b1, a2, b2 = [await say(gateway, s, t) for s, t in interleaved(a, b)]
    async with lanes_running(gateway, platform) as run:
        await platform.wait_for(lambda: len(platform.shown) == 2)
        await trio.sleep(5)  # a1 is mid-way: its delivery retries
        run.scope.cancel()
    # The kill: B's were delivered out of order, above a watermark a1 holds.
    assert platform.shown == [("B", b1.id), ("B", b2.id)]
    assert saved(gateway.store) == (a1.id - 1, [b1.id, b2.id])

    b3 = await say(gateway, b, "b3")  # said while the adapter was down
    platform.down.clear()
    # Restarted as a new adapter does (new objects), or as the same one served again.
    after, again = (Platform(gateway), None) if anew else (platform, run.lanes)
    after.shown.clear()
    async with lanes_running(gateway, after, again=again) as run:
        assert run.cursor.position == a1.id - 1
        assert run.cursor.done == {b1.id, b2.id}
        await after.wait_for(lambda: len(after.shown) == 3)
        await trio.sleep(5)
        assert after.shown_in("A") == [a1.id, a2.id]
        assert after.shown_in("B") == [b3.id], "b1 and b2 are not sent again"
        assert saved(gateway.store) == (b3.id, [])
    assert saved(gateway.store) == (b3.id, [])


async def test_a_channel_given_up_on_gets_the_notice_with_the_next_message_through(
    world: World, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    gateway, a, platform = world.gateway, world.a, world.platform
    platform.give_up_after = 7  # 1+2+…+32 s: 63 s of retries, then 1 s more
    async with lanes_running(gateway, platform) as run:
        a1 = await say(gateway, a, "a1")
        await platform.wait_for(lambda: platform.failures == [a1.id])
        await trio.sleep(1)  # its notice (lost: A is down) and the cursor
        assert run.lanes.lanes == {}, "A's lane ended with a1"
        assert "channel A" in run.lanes.stuck, "still known as unreachable"
        assert saved(gateway.store) == (a1.id, []), "given up on for good: the cursor moved on"
        platform.down.clear()
        a2 = await say(gateway, a, "a2")
        await platform.wait_for(lambda: len(platform.shown) == 2)
        assert platform.shown_in("A") == [a2.id, "⏳ Replies here were delayed by 1m4s."]
        assert run.lanes.stuck == {}
        assert len([w for w in warnings(caplog) if "still on its way" in w]) == 1


async def test_a_cursor_advanced_in_order_saves_one_integer(
    gateway: Gateway, session: Session
) -> None:
    first = await say(gateway, session, "one")
    cursor = DeliveryCursor(gateway, NAME)
    assert cursor.start() == first.id, "a first start begins after the newest message"
    second, third = await say(gateway, session, "two"), await say(gateway, session, "three")
    cursor.advance(second.id)  # a reader that handles one message at a time calls advance alone
    cursor.advance(third.id)
    assert saved(gateway.store) == (third.id, [])
    assert cursor.open == 0


async def test_ids_saved_above_the_watermark_whose_messages_are_gone_are_let_go(
    world: World,
) -> None:
    gateway, a, b = world.gateway, world.a, world.b
    a1, b1 = await say(gateway, a, "a1"), await say(gateway, b, "b1")
    gateway.store.set_cursor(NAME, a1.id - 1, done=b1.id)  # killed: b1 out, a1 not
    await gateway.delete_session(b.id)  # ♻️: b1 is never read again
    a2 = await say(gateway, a, "a2")
    cursor = DeliveryCursor(gateway, NAME)
    assert (cursor.start(), cursor.done) == (a1.id - 1, {b1.id})
    with gateway.listen(after=cursor.position, adapter="lanes") as messages:
        assert [m.id for m in messages.take_ready()] == [a1.id, a2.id]
    for message_id in (a1.id, a2.id):
        assert cursor.begin(message_id)
        cursor.advance(message_id)
    assert (cursor.position, cursor.done) == (a2.id, set())
    assert saved(gateway.store) == (a2.id, [])


def test_the_ids_done_above_a_cursor_are_kept_apart_from_other_cursors(store: Store) -> None:
    store.set_cursor("adapter:a", 5, done=9)
    store.set_cursor("adapter:a", 5, done=7)
    store.set_cursor("adapter:ab", 3, done=8)
    store.set_cursor("adapter:a/x", 1)
    assert store.cursor_done("adapter:a") == [7, 9]
    assert store.cursor_done("adapter:ab") == [8]
    store.set_cursor("adapter:a", 7, done=12)
    assert store.cursor_done("adapter:a") == [9, 12], "the ids at or below the cursor are gone"
    store.set_cursor("adapter:a", 12)
    assert store.cursor_done("adapter:a") == []
    assert store.get_cursor("adapter:a") == 12
    assert store.get_cursor("adapter:ab") == 3
    assert store.cursor_done("adapter:ab") == [8]
    assert store.get_cursor("adapter:a/x") == 1


def test_limits_are_checked(gateway: Gateway) -> None:
    with pytest.raises(ValueError, match="lane_limit <= total_limit"):
        lanes_of(gateway, Platform(gateway), lane_limit=4, total_limit=2)
    with pytest.raises(ValueError, match="1 <= lane_limit"):
        lanes_of(gateway, Platform(gateway), lane_limit=0)
