"""The event hub (kesoku.vocab.events.EventHub): who gets an event, and what it keeps alive."""

from __future__ import annotations

import gc
import weakref

import trio

from kesoku.vocab.events import EventHub, ModelDelta, TurnEvent
from kesoku.vocab.ir import TextDelta


def delta(session_id: str, text: str) -> ModelDelta:
    return ModelDelta(session_id, TextDelta(text))


def drain(events: trio.MemoryReceiveChannel[TurnEvent]) -> list[str]:
    out: list[str] = []
    while True:
        try:
            event = events.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):  # none queued, or none queued and closed
            return out
        assert isinstance(event, ModelDelta) and isinstance(event.event, TextDelta)
        out.append(f"{event.session_id}:{event.event.text}")


async def test_each_subscriber_gets_its_sessions_events_until_it_closes() -> None:
    hub = EventHub()
    everything = hub.subscribe()
    one = hub.subscribe("a")
    with hub.subscribe("b") as other:
        hub.publish(delta("a", "1"))
        hub.publish(delta("b", "2"))
        assert drain(other._receive) == ["b:2"]
    one.close()
    hub.publish(delta("a", "3"))  # after two closed: only the catch-all gets it
    assert drain(everything._receive) == ["a:1", "b:2", "a:3"]
    assert drain(one._receive) == ["a:1"]
    assert drain(other._receive) == []
    # a subscription that comes later gets what is published from then on
    late = hub.subscribe("a")
    hub.publish(delta("a", "4"))
    assert drain(late._receive) == ["a:4"]
    assert drain(everything._receive) == ["a:4"]


async def test_the_hub_does_not_keep_a_forgotten_subscription_alive() -> None:
    hub = EventHub()
    kept = hub.subscribe("a")
    forgotten = weakref.ref(hub.subscribe("a"))
    gc.collect()
    assert forgotten() is None
    hub.publish(delta("a", "1"))  # the forgotten one is gone; the kept one still gets events
    assert drain(kept._receive) == ["a:1"]
    kept.close()
    kept.close()  # closing twice is harmless
    hub.publish(delta("a", "2"))
    assert drain(kept._receive) == []
