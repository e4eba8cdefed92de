"""A trio Instrument that catches task steps holding the event loop too long (DESIGN §3: about 20 ms).

Each step is timed twice: by the CPU time of the trio thread, which a busy machine does not inflate,
and by the wall clock, which also sees blocking calls (a sleep, an fsync, a socket read). A step is a
violation when its CPU time exceeds ``cpu_threshold_s`` or its wall time exceeds ``wall_threshold_s``.
Two things are subtracted from both: garbage-collector pauses (they stop every thread alike and are no
task's doing) and, on Linux, the time the thread waited for a CPU while runnable (the run-queue delay,
``/proc/thread-self/schedstat``, field 2: Documentation/scheduler/sched-stats.rst). A step merely
descheduled by other processes' load is then not blamed, and one that blocked in the kernel still is.
"""

from __future__ import annotations

import gc
import os
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

    ``wall_s`` leaves out garbage-collector pauses and the time spent waiting for a CPU.

    Use it as ``trio.run(main, instruments=[detector])``; the test suite runs every trio test under one.
    """

    def __init__(self, cpu_threshold_s: float = CPU_THRESHOLD_S, wall_threshold_s: float = WALL_THRESHOLD_S) -> None:
        self.cpu_threshold_s = cpu_threshold_s
        self.wall_threshold_s = wall_threshold_s
        self.violations: list[tuple[str, float, float]] = []
        self._cpu = self._wall = self._waited = self._gc_s = 0.0
        self._gc_started = 0.0
        self._schedstat: int | None = None

    def before_run(self) -> None:
        """Start watching garbage-collector pauses and the trio thread's run-queue delay."""
        gc.callbacks.append(self._on_gc)
        try:  # opened here: "thread-self" is the thread that opens it, and this runs in trio's
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._schedstat = None  # not Linux (or no scheduler statistics): wall time counts whole

    def after_run(self) -> None:
        """Stop watching."""
        gc.callbacks.remove(self._on_gc)
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None

    def _run_queue_delay(self) -> float:
        """Seconds the trio thread has spent runnable but waiting for a CPU, since it started."""
        if self._schedstat is None:
            return 0.0
        # "<ns on a CPU> <ns waiting on a run queue> <time slices>". The first lags behind the running
        # thread until the next tick, so CPU time comes from time.thread_time instead.
        return int(os.pread(self._schedstat, 96, 0).split()[1]) / 1e9

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_started

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        """Start the clocks."""
        self._gc_s = 0.0
        self._waited = self._run_queue_delay()
        self._cpu = time.thread_time()
        self._wall = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        """Stop the clocks; record the step if it took too long."""
        wall = time.perf_counter() - self._wall - self._gc_s
        cpu = time.thread_time() - self._cpu - self._gc_s
        if wall > self.wall_threshold_s:  # only then is the run-queue delay worth a read
            wall -= self._run_queue_delay() - self._waited
        if cpu > self.cpu_threshold_s or wall > self.wall_threshold_s:
            self.violations.append((task.name, cpu, wall))

    def report(self) -> str:
        """One line per violation."""
        return "; ".join(
            f"{name} held the event loop for {cpu * 1000:.1f} ms CPU, {wall * 1000:.1f} ms wall"
            " (not counting time spent waiting for a CPU)"
            for name, cpu, wall in self.violations
        )
