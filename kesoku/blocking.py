"""A trio Instrument that catches task steps holding the event loop too long (DESIGN §3: about 20 ms).

Each step is timed twice: by the CPU time of the trio thread, which a busy machine does not inflate,
and by the wall clock, which also sees blocking calls (a sleep, an fsync, a socket read). A step is a
violation when its CPU time exceeds ``cpu_threshold_s`` or its wall time exceeds ``wall_threshold_s``
(set higher, so a step merely descheduled by another process's load is not blamed). Garbage-collector
pauses are subtracted from both: they stop every thread alike and are no task's doing.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import trio

CPU_THRESHOLD_S = 0.025
"""CPU time one task step may take: DESIGN's "about 20 ms", with a margin because CPU time itself grows
by a few ms on a loaded 2-core machine (shared caches, frequency), and a flaky gate protects nothing."""
WALL_THRESHOLD_S = 0.250
"""Wall time one task step may take (blocking I/O shows here, not in CPU time). Looser than the CPU bound:
on a fresh install a step that merely waits on a cold disk cache (a module's first import) took 175 ms
with 7.5 ms of CPU; a sleep or an fsync storm on the loop still shows."""


class BlockingDetector(trio.abc.Instrument):
    """Records task steps over the thresholds in :attr:`violations` as ``(task name, cpu_s, wall_s)``.

    Use it as ``trio.run(main, instruments=[detector])``; the test suite runs every trio test under one.
    """

    def __init__(self, cpu_threshold_s: float = CPU_THRESHOLD_S, wall_threshold_s: float = WALL_THRESHOLD_S) -> None:
        self.cpu_threshold_s = cpu_threshold_s
        self.wall_threshold_s = wall_threshold_s
        self.violations: list[tuple[str, float, float]] = []
        self._cpu = self._wall = self._gc_s = 0.0
        self._gc_started = 0.0

    def before_run(self) -> None:
        """Start watching garbage-collector pauses."""
        gc.callbacks.append(self._on_gc)

    def after_run(self) -> None:
        """Stop watching garbage-collector pauses."""
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_started

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        """Start the clocks."""
        self._gc_s = 0.0
        self._cpu = time.thread_time()
        self._wall = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        """Stop the clocks; record the step if it took too long."""
        wall = time.perf_counter() - self._wall - self._gc_s
        cpu = time.thread_time() - self._cpu - self._gc_s
        if cpu > self.cpu_threshold_s or wall > self.wall_threshold_s:
            self.violations.append((task.name, cpu, wall))

    def report(self) -> str:
        """One line per violation."""
        return "; ".join(
            f"{name} held the event loop for {cpu * 1000:.1f} ms CPU, {wall * 1000:.1f} ms wall"
            for name, cpu, wall in self.violations
        )
