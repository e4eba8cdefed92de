"""Many sessions: `kesoku start` drains N sessions (1 pending message each) under `ulimit -n 1024`.

Run: .venv/bin/python bench/sessions_bench.py [--sessions N] [--open-files F] [--idle S]

The database is seeded with N sessions (one pending user message each), then the real daemon starts
(`python -m kesoku start`, the scripted model answering "noted.") with its soft *and* hard
``RLIMIT_NOFILE`` set to F (1024 by default: the common soft limit; hard too, so the daemon's raise
of its soft limit at start cannot help). Every worker stays live for ``--idle`` seconds
(``agent.worker_idle_s``), so all N sessions are held at once. Printed: the time from the daemon's
start to the last message answered, the rate, the most descriptors the daemon had open (sampled from
/proc), and its peak RSS (getrusage of the reaped child).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kesoku.store import Store
from kesoku.vocab.model import Status, user_text

from _util import report

SCENARIO = Path(__file__).resolve().parent.parent / "tests" / "data" / "scenarios" / "echo.yaml"


def seed(folder: Path, count: int) -> None:
    store = Store(folder / "kesoku.db")
    try:
        sessions = [
            store.create_session("bench", f"c{i}", workspace_root=folder / "sessions")
            for i in range(count)
        ]
        store.insert_messages([user_text(s.id, f"hello {i}") for i, s in enumerate(sessions)])
    finally:
        store.close()


def open_messages(store: Store) -> int:
    return len(store.open_user_messages(up_to=1 << 62))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--open-files", type=int, default=1024)
    parser.add_argument(
        "--idle", type=float, default=600.0, help="agent.worker_idle_s of the daemon"
    )
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kesoku-sessions-bench-"))
    try:
        shutil.copy(SCENARIO, folder / "scenario.yaml")
        (folder / "kesoku.toml").write_text(
            f'[agent]\nllm = "scripted"\nworker_idle_s = {args.idle}\n'
            '[scripted]\npath = "scenario.yaml"\n'
        )
        t0 = time.perf_counter()
        seed(folder, args.sessions)
        seeded_s = time.perf_counter() - t0
        limit = args.open_files

        def low_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        env = {k: v for k, v in os.environ.items() if k != "KESOKU_CONFIG"}
        with open(folder / "daemon.log", "w+") as log:
            started = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "kesoku", "start", "-c", str(folder / "kesoku.toml")],
                cwd=folder,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                preexec_fn=low_limit,
            )
            store = Store(folder / "kesoku.db")
            peak_fds = 0
            try:
                while proc.poll() is None and open_messages(store):
                    peak_fds = max(peak_fds, len(os.listdir(f"/proc/{proc.pid}/fd")))
                    threading.Event().wait(0.1)
                drained_s = time.perf_counter() - started
                left = open_messages(store)
                live_fds = len(os.listdir(f"/proc/{proc.pid}/fd")) if proc.poll() is None else 0
                done = sum(
                    1
                    for s in store.list_sessions()
                    for m in store.history(s.id)[:1]
                    if m.status is Status.DONE
                )
            finally:
                store.close()
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                code = proc.wait(120)
            log.seek(0)
            text = log.read()
        rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
        print(
            f"{args.sessions:,} sessions, RLIMIT_NOFILE {limit} (soft and hard), "
            f"worker_idle_s {args.idle:g}"
        )
        report("seeding the database", seeded_s, "s")
        report("daemon start → last message answered", drained_s, "s")
        report("rate", args.sessions / drained_s if drained_s else 0.0, "sessions/s")
        report("messages answered", done, "")
        report("messages left open", left, "")
        report("descriptors open, most sampled", max(peak_fds, live_fds), "")
        report("descriptors open with every session held", live_fds, "")
        report("daemon peak RSS", rss_kib / 1024, "MiB")
        report("daemon exit code after SIGTERM", code, "")
        bad = [ln for ln in text.splitlines() if "Too many open files" in ln or "Traceback" in ln]
        report("log lines naming EMFILE or a traceback", len(bad), "")
        for line in bad[:3]:
            print("  " + line[:200])
        return 0 if not left and code == 0 and not bad else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
