"""Sandbox benchmark: what the OS sandbox adds to one shell tool call (``true``), per mechanism.

Run: .venv/bin/python bench/sandbox_bench.py [--calls N]

Each call goes through the shell tool as the runtime calls it: the policy check, the sandbox's
command line (hidden paths looked up), the process started on the event loop, its output read and
its group killed. Figures are medians and 95th percentiles in milliseconds, with no sandbox, with
bubblewrap and with Landlock (a mechanism that cannot work here is reported as such), in a workspace
of 200 files, as a session folder with some work in it would be.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio
from kesoku.config.settings import SandboxConfig, ShellConfig
from kesoku.tools.base import ToolContext
from kesoku.tools.paths import PathGates
from kesoku.tools.sandbox import Sandbox
from kesoku.tools.shell import shell_tool
from kesoku.vocab.model import Session

from _util import median, pct, report


async def measure(mode: str, root: Path, calls: int) -> list[float] | None:
    config = SandboxConfig(mode=mode)  # type: ignore[arg-type]
    sandbox = Sandbox(config, PathGates(home=root / "home"), sessions_dir=root / "sessions")
    if sandbox.probe().mechanism != mode:
        print(f"{mode}: not available here ({sandbox.probe().detail})")
        return None
    workspace = root / "sessions" / "s1"
    session = Session(
        id="s1", adapter="bench", channel_id="c", created_at=0, workspace=str(workspace)
    )
    ctx = ToolContext(session=session, cwd=workspace, call_id="c")
    tool = shell_tool(ShellConfig(), sandbox)
    await tool.run({"command": "true"}, ctx)  # warm: the policy's parser import, the probe
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await tool.run({"command": "true"}, ctx)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        workspace = root / "sessions" / "s1"
        for i in range(20):
            (workspace / f"dir{i}").mkdir(parents=True)
            for j in range(10):
                (workspace / f"dir{i}" / f"file{j}.txt").write_text("x")
        (root / "home" / ".ssh").mkdir(parents=True)
        base: float | None = None
        for mode in ("off", "bwrap", "landlock"):
            times = trio.run(measure, mode, root, args.calls)
            if times is None:
                continue
            report(f"shell call `true`, sandbox {mode}: median", median(times), "ms")
            report(f"shell call `true`, sandbox {mode}: p95", pct(times, 95), "ms")
            if base is None:
                base = median(times)
            else:
                report(f"  overhead over no sandbox ({mode}), median", median(times) - base, "ms")


if __name__ == "__main__":
    main()
