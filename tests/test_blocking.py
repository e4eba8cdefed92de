"""The blocking detector every trio test runs under: it must catch a step that hogs the loop."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

import trio

from kesoku.host.blocking import BlockingDetector


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
    # The watchdog saw where the step waited (state S: a sleep, not the disk).
    assert "main (" in detector.where[0]
    assert f"{__file__}:" in detector.report()


class DiskStalled(BlockingDetector):
    """A detector told by a fake /proc that the trio thread is in disk sleep (state D) all along."""

    def thread_state(self) -> str:
        assert super().thread_state() in "RSD"  # the real file is readable and parsed
        return "D"


def test_a_step_stalled_by_the_disk_is_not_blamed() -> None:
    async def main() -> None:
        select.select([], [], [], 0.5)  # what an fsync on a loaded disk looks like, but in state D
        await trio.lowlevel.checkpoint()

    stalled = DiskStalled()
    trio.run(main, instruments=[stalled])
    assert stalled.violations == []


class Unseen(BlockingDetector):
    """A detector whose watchdog never sees the thread wait (starved, as on a loaded machine)."""

    def __init__(self, io_per_read: int) -> None:
        super().__init__()
        self.io = 0
        self.io_per_read = io_per_read

    def thread_state(self) -> str:
        assert super().thread_state() in "RSD"
        return "R"

    def disk_io(self) -> int:
        assert super().disk_io() >= 0  # getrusage(RUSAGE_THREAD) answers
        self.io += self.io_per_read
        return self.io


def test_an_unseen_step_that_used_the_disk_is_not_blamed_and_one_that_did_not_is() -> None:
    async def main() -> None:
        select.select([], [], [], 0.3)
        await trio.lowlevel.checkpoint()

    disk, no_disk = Unseen(io_per_read=1), Unseen(io_per_read=0)
    trio.run(main, instruments=[disk])
    trio.run(main, instruments=[no_disk])
    assert disk.violations == []
    assert len(no_disk.violations) == 1  # no disk operation: the wait is the step's own


def test_a_step_held_off_by_another_threads_gil_is_not_blamed() -> None:
    steps: list[float] = []

    async def main() -> None:
        wall = time.perf_counter()
        # One long C call keeps the GIL from the trio thread and the watchdog alike (as a library's
        # dlopen in a client's thread did in CI): the step waits, but it is not its doing.
        other = threading.Thread(target=sum, args=(range(30_000_000),))
        other.start()  # waits for the thread to start, then for the GIL it keeps
        steps.append(time.perf_counter() - wall)
        await trio.lowlevel.checkpoint()
        other.join()

    detector = BlockingDetector()
    trio.run(main, instruments=[detector])
    assert steps[0] > 0.25  # the step's wall time alone would have been a violation
    assert detector.violations == []


# Runs in a child process pinned to one CPU at the lowest priority, next to a busy process on the
# same CPU: the step gets a small share of the CPU, so its wall time is mostly run-queue delay.
DESCHEDULED_STEP = """
import os, subprocess, sys, time
import trio
from kesoku.host.blocking import BlockingDetector

cpu = int(sys.argv[1])
os.sched_setaffinity(0, {cpu})
# Started before this process lowers its priority (a child inherits it); it spins once told to.
spin = "import sys; sys.stdin.read(1)\\nwhile True: pass"
rival = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE)
os.sched_setaffinity(rival.pid, {cpu})
os.nice(19)
steps = []

async def main() -> None:
    rival.stdin.write(b"go")
    rival.stdin.flush()
    await trio.sleep(0.05)  # the rival is spinning
    wall, end = time.perf_counter(), time.thread_time() + 0.01
    while time.thread_time() < end:  # 10 ms of CPU in one step
        pass
    steps.append(time.perf_counter() - wall)
    rival.kill()
    await trio.lowlevel.checkpoint()

detector = BlockingDetector()
try:
    trio.run(main, instruments=[detector])
finally:
    rival.kill()
print(f"{steps[0]:.3f} {len(detector.violations)}")
"""


def test_a_step_descheduled_by_another_process_is_not_blamed() -> None:
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", DESCHEDULED_STEP, str(cpu)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    wall_s, violations = out.stdout.split()
    assert float(wall_s) > 0.25  # the step's wall time alone would have been a violation
    assert violations == "0"
