"""Start-up benchmark: the CLI as a user starts it, end to end, next to a bare interpreter.

Run: .venv/bin/python bench/startup_bench.py [--rounds R] [--importtime]

Each case is a fresh subprocess (cold interpreter; the OS file cache warm after the first round):

- ``python -c pass``: the floor every command pays;
- ``kesoku --help`` (through the console script, as a user types it);
- ``kesoku chat --help``;
- a one-shot ``kesoku chat "..."`` with the scripted model (a temp kesoku.toml with
  ``[agent] llm = "scripted"`` and a one-step scenario): config, store, gateway, runtime, one turn.

Kesoku's own sources are compiled to bytecode first (``compileall``), as Python does by itself on a
first run: where ``PYTHONDONTWRITEBYTECODE`` is set (these machines set it) an editable install
would otherwise compile every module on every start, about 130 ms of a one-shot chat here.

Wall time (median, min) and the CPU time of the child (user + system, median): the CPU figure is the
one to trust on a busy machine. ``--importtime`` adds the slowest imports of the one-shot chat
(``python -X importtime``, cumulative).

Targets (issue 5): ``kesoku --help`` <= 100 ms, a one-shot scripted chat <= 400 ms.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _util import median

VENV_BIN = Path(sys.executable).parent
SOURCES = [Path(__file__).resolve().parent.parent / name for name in ("kesoku", "adapters")]
KESOKU = VENV_BIN / "kesoku"


def measure(
    argv: list[str], cwd: Path, rounds: int, env: dict[str, str]
) -> tuple[float, float, float]:
    """Median wall, min wall and median child CPU seconds of ``rounds`` runs (after one warm-up)."""
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(rounds + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(
                f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}"
            )
        if i:  # the first run warms the file cache
            walls.append(wall)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return median(walls), min(walls), median(cpus)


def importtime(
    argv: list[str], cwd: Path, env: dict[str, str], top: int = 15
) -> list[tuple[int, str]]:
    """The ``top`` slowest imports (cumulative microseconds) of one run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    rows: list[tuple[int, str]] = []
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = (part.strip() for part in line.split("|"))
            rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--importtime", action="store_true", help="show the slowest imports of a one-shot chat"
    )
    args = parser.parse_args()

    env = {
        k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "KESOKU_CONFIG"
    }
    for source in SOURCES:
        compileall.compile_dir(source, quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "scenario.yaml").write_text("loop: true\nsteps: [{text: 'Paris.'}]\n")
        (folder / "kesoku.toml").write_text(
            '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n'
        )
        chat = [
            str(KESOKU),
            "chat",
            "-c",
            str(folder / "kesoku.toml"),
            "What is the capital of France?",
        ]
        cases = [
            ("python -c pass", [sys.executable, "-c", "pass"], ""),
            ("kesoku --help", [str(KESOKU), "--help"], "100 ms"),
            ("kesoku chat --help", [str(KESOKU), "chat", "--help"], ""),
            ("kesoku chat 'What is the capital of France?' (scripted)", chat, "400 ms"),
        ]
        print(
            f"{args.rounds} rounds each, after a warm-up; {os.cpu_count()} CPUs; "
            f"load {os.getloadavg()[0]:.2f}"
        )
        print(f"{'case':<58} {'median':>9} {'min':>9} {'cpu':>9}")
        for name, argv, target in cases:
            wall, fastest, cpu = measure(argv, folder, args.rounds, env)
            suffix = f"   (target {target})" if target else ""
            print(
                f"{name:<58} {wall * 1e3:>6.0f} ms {fastest * 1e3:>6.0f} ms "
                f"{cpu * 1e3:>6.0f} ms{suffix}"
            )
        if args.importtime:
            print("\nslowest imports of the one-shot chat (cumulative):")
            for micros, module in importtime(["-m", "kesoku", *chat[1:]], folder, env):
                print(f"  {micros / 1e3:>7.1f} ms  {module}")


if __name__ == "__main__":
    main()
