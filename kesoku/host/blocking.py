"""A trio Instrument that catches task steps holding the event loop too long (about 20 ms).

Each step is timed twice: by the CPU time of the trio thread, which a busy machine does not inflate,
and by the wall clock, which also sees blocking calls (a sleep, an fsync, a socket read). A step is
a violation when its CPU time exceeds ``cpu_threshold_s`` or its wall time exceeds
``wall_threshold_s``.

Three things are left out of the wall time, as no task's doing: garbage-collector pauses (they stop
every thread alike); on Linux, the time the thread waited for a CPU while runnable (the run-queue
delay, ``/proc/thread-self/schedstat``, field 2: Documentation/scheduler/sched-stats.rst); and a
loaded disk's stalls. A watchdog thread looks at a step that runs long: time it finds the thread in
uninterruptible disk sleep (state ``D`` in ``/proc/self/task/TID/stat``, proc(5)) is the disk's, and
so is the whole wait of a step it never saw waiting elsewhere that read or wrote the disk (block
operations or major page faults, ``getrusage(RUSAGE_THREAD)``, getrusage(2)): on a loaded machine
the watchdog itself waits for a CPU, or for the GIL a page fault holds, and sees little. A step that
slept, or waited on a socket or a lock (state ``S``), is blamed, and the report says where the
watchdog saw it waiting; one that touched no disk is blamed even when the watchdog saw nothing.
A step the watchdog never once looked at although it ran for many of its periods is not blamed
beyond its CPU time: the watchdog was held off the whole time, and what holds off a Python thread
that long is another thread keeping the GIL in one long C call (a library's ``dlopen``, a parse) or
a starved machine, neither the step's doing (a blocking call of the step's own releases the GIL).
"""

from __future__ import annotations

import gc
import os
import resource
import sys
import threading
import time
import traceback
from typing import Any

import trio

CPU_THRESHOLD_S = 0.025
"""CPU time one task step may take: about 20 ms, with a margin because CPU time itself grows by a
few ms on a loaded 2-core machine (shared caches, frequency), and a flaky gate protects nothing."""
WALL_THRESHOLD_S = 0.250
"""Wall time one task step may take (blocking I/O shows here, not in CPU time). Looser than the CPU
bound: on a fresh install a step that merely waits on a cold disk cache (a module's first import)
took 175 ms with 7.5 ms of CPU; a sleep or an fsync storm on the loop still shows."""
SAMPLE_S = 0.025
"""How often the watchdog looks at a step that has run longer than this.

It looks at the step's thread state and stack.
"""


class BlockingDetector(trio.abc.Instrument):
    """Records task steps over the thresholds in :attr:`violations`.

    Each violation is ``(task name, cpu_s, wall_s)``; ``wall_s`` leaves out garbage-collector
    pauses, the time spent waiting for a CPU and the time spent in disk sleep. :attr:`where` holds,
    per violation, the innermost frames the watchdog saw the step in (empty when it saw none).

    Use it as ``trio.run(main, instruments=[detector])``; the test suite runs every trio test under
    one.
    """

    def __init__(
        self, cpu_threshold_s: float = CPU_THRESHOLD_S, wall_threshold_s: float = WALL_THRESHOLD_S
    ) -> None:
        self.cpu_threshold_s = cpu_threshold_s
        self.wall_threshold_s = wall_threshold_s
        self.violations: list[tuple[str, float, float]] = []
        self.where: list[str] = []
        self._cpu = self._wall = self._waited = self._gc_s = 0.0
        self._gc_started = 0.0
        self._schedstat: int | None = None
        # Shared with the watchdog: the start of the step in progress (0.0 between steps), and what
        # it saw of that step. Plain attribute reads and rebinds are atomic under the GIL.
        self._step_started = 0.0
        self._disk_s = 0.0
        self._io = 0
        self._looks = 0
        self._seen_at = ""
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._ident = 0
        self._stat_path = ""

    def before_run(self) -> None:
        """Start watching garbage-collector pauses, the run-queue delay and long steps."""
        gc.callbacks.append(self._on_gc)
        try:  # opened here: "thread-self" is the thread that opens it, and this runs in trio's
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._schedstat = None  # not Linux (or no scheduler statistics): wall time counts whole
        self._ident = threading.get_ident()
        self._stat_path = f"/proc/self/task/{threading.get_native_id()}/stat"
        self._stop.clear()
        self._watchdog = threading.Thread(
            target=self._watch, name="kesoku-blocking-watchdog", daemon=True
        )
        self._watchdog.start()

    def after_run(self) -> None:
        """Stop watching."""
        gc.callbacks.remove(self._on_gc)
        if self._schedstat is not None:
            os.close(self._schedstat)
            self._schedstat = None
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join()
            self._watchdog = None

    def thread_state(self) -> str:
        """The trio thread's scheduler state (proc(5): ``R``, ``S``, ``D``…); ``?`` if unknown."""
        try:
            with open(self._stat_path, "rb") as f:
                stat = f.read()
        except OSError:
            return "?"
        # "pid (comm) state ...": comm may hold spaces and parentheses, so split after the last ")".
        return stat[stat.rfind(b")") + 2 :][:1].decode("ascii", "replace") or "?"

    def disk_io(self) -> int:
        """The calling thread's disk I/O so far: block reads and writes, major page faults."""
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        return usage.ru_inblock + usage.ru_oublock + usage.ru_majflt

    def _watch(self) -> None:
        last = 0.0
        while not self._stop.wait(SAMPLE_S):
            started, now = self._step_started, time.perf_counter()
            if not started or now - started < SAMPLE_S:
                continue
            # A loaded machine wakes the watchdog late: a sample in state D stands for the time
            # since the previous sample of the same step.
            since, last = max(last, started), now
            state = self.thread_state()
            if self._step_started != started:
                continue  # that step ended while we looked
            self._looks += 1
            if state == "D":
                self._disk_s += now - since
            # R: running, or waiting for a CPU (not blamed)
            elif state != "R" and not self._seen_at:
                self._seen_at = "?"  # blamed, even where the stack cannot be read
                frame = sys._current_frames().get(self._ident)
                if frame is not None:
                    top = traceback.extract_stack(frame)[-3:]
                    self._seen_at = " < ".join(
                        f"{f.name} ({f.filename}:{f.lineno})" for f in reversed(top)
                    )

    def _run_queue_delay(self) -> float:
        """Seconds the trio thread has spent runnable but waiting for a CPU, since it started."""
        if self._schedstat is None:
            return 0.0
        # "<ns on a CPU> <ns waiting on a run queue> <time slices>". The first lags behind the
        # running thread until the next tick, so CPU time comes from time.thread_time instead.
        return int(os.pread(self._schedstat, 96, 0).split()[1]) / 1e9

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_started

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        """Start the clocks."""
        self._gc_s = 0.0
        self._disk_s = 0.0
        self._looks = 0
        self._seen_at = ""
        self._io = self.disk_io()
        self._waited = self._run_queue_delay()
        self._cpu = time.thread_time()
        self._wall = self._step_started = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        """Stop the clocks; record the step if it took too long."""
        self._step_started = 0.0
        wall = time.perf_counter() - self._wall - self._gc_s
        cpu = time.thread_time() - self._cpu - self._gc_s
        # only then are the run-queue delay and disk sleep worth a look
        if wall > self.wall_threshold_s:
            wall -= self._run_queue_delay() - self._waited + self._disk_s
            if not self._seen_at and (self._disk_s or self.disk_io() > self._io):
                # Seen only in disk sleep or on a CPU, or not seen at all while it read or wrote the
                # disk: nothing was seen waiting on a sleep, a socket or a lock.
                wall = min(wall, cpu)
            elif not self._looks:
                wall = min(wall, cpu)  # the watchdog was held off all along (module docstring)
        if cpu > self.cpu_threshold_s or wall > self.wall_threshold_s:
            self.violations.append((task.name, cpu, wall))
            self.where.append(self._seen_at.strip("?"))

    def report(self) -> str:
        """One line per violation, with where the step was seen waiting when it was."""
        return "; ".join(
            f"{name} held the event loop for {cpu * 1000:.1f} ms CPU, {wall * 1000:.1f} ms wall"
            " (not counting time spent waiting for a CPU or the disk)"
            + (f", seen in {where}" if where else "")
            for (name, cpu, wall), where in zip(self.violations, self.where, strict=True)
        )
