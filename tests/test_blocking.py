"""The blocking detector every trio test runs under: it must catch a step that hogs the loop."""

from __future__ import annotations

import select
import time

import trio

from kesoku.blocking import BlockingDetector


def test_a_busy_step_is_caught_and_a_yielding_task_is_not() -> None:
    async def main() -> None:
        async def hog() -> None:
            end = time.thread_time() + 0.06
            while time.thread_time() < end:
                pass

        async def polite() -> None:
            for _ in range(20):
                await trio.sleep(0.001)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hog, name="hog")
            nursery.start_soon(polite, name="polite")

    detector = BlockingDetector()
    trio.run(main, instruments=[detector])
    assert [name for name, _, _ in detector.violations] == ["hog"]
    assert "hog held the event loop for" in detector.report()


def test_blocking_io_is_caught_by_the_wall_clock() -> None:
    async def main() -> None:
        # A blocking wait: no CPU, only wall time (what an fsync or a sync socket read looks like).
        select.select([], [], [], 0.3)
        await trio.lowlevel.checkpoint()

    detector = BlockingDetector()
    trio.run(main, instruments=[detector])
    assert len(detector.violations) == 1
    _, cpu_s, wall_s = detector.violations[0]
    assert cpu_s < 0.02 < 0.25 < wall_s
