"""Start-up benchmark: the CLI as a user starts it, end to end, next to a bare interpreter.

Run: .venv/bin/python bench/startup_bench.py [--rounds R] [--only TEXT] [--importtime [CASE]]

Each case is a fresh subprocess (cold interpreter; the OS file cache warm after the first round):

- ``python -c pass``: the floor every command pays;
- ``kesoku --help`` (through the console script, as a user types it);
- ``kesoku chat --help``;
- a one-shot ``kesoku chat "..."`` with the scripted model (a temp kesoku.toml with
  ``[agent] llm = "scripted"`` and a one-step scenario): config, store, gateway, runtime, one turn;
- the same one-shot with each cloud backend (``--local --llm claude``, ``gemini``, ``openai``): the
  real SDK against its loopback wire fake (kesoku.testing.fakes, served by a child process,
  ``base_url`` in the temp kesoku.toml), so the figure is the cold path of a real model call: the
  SDK's import, its client, one streamed request;
- the same one-shots while ``kesoku start`` runs on that kesoku.toml: the chat is answered by the
  daemon (its control socket), so the figure is the client's (the daemon's SDK is loaded); and
  ``kesoku chat "..."`` alone, in a folder whose ./kesoku.toml is the daemon's (claude): the form
  ``kesoku`` runs without cyclopts.

Kesoku's own sources are compiled to bytecode first (``compileall``), as Python does by itself on a
first run: where ``PYTHONDONTWRITEBYTECODE`` is set (these machines set it) an editable install
would otherwise compile every module on every start, about 130 ms of a one-shot chat here.

Wall time (median, min), the CPU time of the child (user + system, median) and its peak resident
memory (``ru_maxrss`` of that child, from ``wait4``; the largest of the rounds): the CPU figure is
the one to trust on a busy machine. ``--importtime`` adds the slowest imports of one one-shot chat
(``python -X importtime``, cumulative): ``claude`` (default), ``gemini``, ``openai`` or
``scripted``. ``--only`` runs the cases whose name contains a text.

Targets: ``kesoku --help`` <= 100 ms and a one-shot scripted chat <= 400 ms (issue 5); a one-shot
chat with a cloud backend <= 700 ms cold, and <= 100 ms and 30 MB with a daemon running (issue 24).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

from _util import median

VENV_BIN = Path(sys.executable).parent
SOURCES = [Path(__file__).resolve().parent.parent / name for name in ("kesoku", "adapters")]
KESOKU = VENV_BIN / "kesoku"


class Run(msgspec.Struct, frozen=True):
    """The figures of one case: seconds, and kilobytes of peak resident memory."""

    wall_s: float
    fastest_s: float
    cpu_s: float
    max_rss_kb: int


def measure(argv: list[str], cwd: Path, rounds: int, env: dict[str, str]) -> Run:
    """Median wall, min wall, median child CPU and the largest peak RSS of ``rounds`` runs.

    One warm-up run comes first (it warms the file cache). Each child is reaped with ``wait4``, so
    its own ``ru_maxrss`` is read (``RUSAGE_CHILDREN`` keeps the largest of all children so far).
    """
    walls: list[float] = []
    cpus: list[float] = []
    rss_kb = 0
    for i in range(rounds + 1):
        with tempfile.TemporaryFile() as err:
            started = time.perf_counter()
            child = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - started
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode != 0:
                err.seek(0)
                raise SystemExit(
                    f"{' '.join(argv)} failed ({child.returncode}): {err.read().decode()[-500:]}"
                )
        if i:  # the first run warms the file cache
            walls.append(wall)
            cpus.append(usage.ru_utime + usage.ru_stime)
            rss_kb = max(rss_kb, usage.ru_maxrss)
    return Run(median(walls), min(walls), median(cpus), rss_kb)


def serve_fakes() -> None:
    """Serve the loopback wire fakes of the cloud APIs until stdin closes (``--serve-fakes``).

    Every request is answered "Paris.". The base URL of each backend's fake, by backend name
    (``claude``, ``gemini``, ``openai``), is printed first, as one JSON line.
    """
    import trio
    from kesoku.testing.fakes import anthropic_api, gemini_api, gemini_replies, openai_api
    from kesoku.testing.fakes.server import serve_app

    claude = anthropic_api.AnthropicFake()
    claude.handler = lambda _body: anthropic_api.text_reply("Paris.")
    gemini = gemini_api.GeminiFake(handler=lambda _body: gemini_replies.answer("Paris."))
    openai = openai_api.OpenAIFake()
    openai.handler = lambda _body: openai_api.text_reply("Paris.")

    async def serve() -> None:
        async with claude.serve() as a, serve_app(gemini.app) as g, openai.serve() as o:
            print(json.dumps({"claude": a, "gemini": g, "openai": o}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)

    trio.run(serve)


@contextlib.contextmanager
def fakes() -> Iterator[dict[str, str]]:
    """The fakes of :func:`serve_fakes`, served by a child process (so this one stays small).

    A child's peak RSS counts the memory of the process it was forked from: the fakes (starlette,
    hypercorn) in this process would raise every figure's floor.

    Yields:
        The base URL of each backend's fake by backend name.
    """
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve-fakes"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    try:
        line = child.stdout.readline()
        if not line:
            raise SystemExit("the loopback fakes did not start (see above)")
        yield json.loads(line)
    finally:
        child.stdin.close()
        child.wait(timeout=10)


def cloud_config(folder: Path, urls: dict[str, str]) -> Path:
    """A kesoku.toml whose three cloud backends talk to the fakes (keys the fakes accept)."""
    path = folder / "cloud.toml"
    path.write_text(
        "[workspace]\n"
        'db_path = "cloud.db"\n'
        f'[claude]\napi_key = "sk-ant-test"\nbase_url = "{urls["claude"]}"\n'
        f'[gemini]\napi_key = "test-key"\nbase_url = "{urls["gemini"]}"\n'
        f'[openai]\napi_key = "sk-test"\nbase_url = "{urls["openai"]}"\n'
        'model_name = "served-model"\n'
    )
    return path


def show(name: str, run: Run, target: str) -> None:
    """One case's line."""
    suffix = f"   (target {target})" if target else ""
    print(
        f"{name:<58} {run.wall_s * 1e3:>6.0f} ms {run.fastest_s * 1e3:>6.0f} ms "
        f"{run.cpu_s * 1e3:>6.0f} ms {run.max_rss_kb / 1024:>6.0f} MB{suffix}"
    )


@contextlib.contextmanager
def daemon(config: Path, folder: Path, env: dict[str, str]) -> Iterator[None]:
    """``kesoku start`` on ``config`` until the block ends; a chat then goes through it."""
    from kesoku.host.control import socket_path

    log = (folder / "daemon.log").open("wb")
    child = subprocess.Popen(
        [str(KESOKU), "start", "-c", str(config)], cwd=folder, env=env, stdout=log, stderr=log
    )
    try:
        sock = socket_path(folder / "cloud.db")
        deadline = time.monotonic() + 30
        while not sock.exists():
            with contextlib.suppress(subprocess.TimeoutExpired):  # a 50 ms wait for the socket
                child.wait(timeout=0.05)
            if child.returncode is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start: {(folder / 'daemon.log').read_text()}")
        yield
    finally:
        child.terminate()
        child.wait(timeout=30)
        log.close()


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
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-500:]}")
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
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument(
        "--importtime",
        nargs="?",
        const="claude",
        choices=("claude", "gemini", "openai", "scripted"),
        help="show the slowest imports of a one-shot chat with this backend (default claude)",
    )
    parser.add_argument("--serve-fakes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fakes:
        serve_fakes()
        return

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.endswith("_API_KEY") and k not in ("KESOKU_CONFIG", "GOOGLE_API_KEY")
    }
    for source in SOURCES:
        compileall.compile_dir(source, quiet=1)
    with tempfile.TemporaryDirectory() as tmp, fakes() as urls:
        folder = Path(tmp)
        env["XDG_STATE_HOME"] = str(folder / "state")
        (folder / "scenario.yaml").write_text("loop: true\nsteps: [{text: 'Paris.'}]\n")
        (folder / "kesoku.toml").write_text(
            '[agent]\nllm = "scripted"\n[scripted]\npath = "scenario.yaml"\n'
        )
        question = "What is the capital of France?"
        chats = {"scripted": ["chat", "-c", str(folder / "kesoku.toml"), question]}
        cloud = cloud_config(folder, urls)
        for llm in urls:
            chats[llm] = ["chat", "-c", str(cloud), "--local", "--llm", llm, question]
        cases = [
            ("python -c pass", [sys.executable, "-c", "pass"], ""),
            ("kesoku --help", [str(KESOKU), "--help"], "100 ms"),
            ("kesoku chat --help", [str(KESOKU), "chat", "--help"], ""),
            (
                "kesoku chat 'What is the capital of France?' (scripted)",
                [str(KESOKU), *chats["scripted"]],
                "400 ms",
            ),
            *(
                (
                    f"kesoku chat --llm {llm} '...' (loopback fake)",
                    [str(KESOKU), *chats[llm]],
                    "700 ms",
                )
                for llm in urls
            ),
        ]
        print(
            f"{args.rounds} rounds each, after a warm-up; {os.cpu_count()} CPUs; "
            f"load {os.getloadavg()[0]:.2f}"
        )
        print(f"{'case':<58} {'median':>9} {'min':>9} {'cpu':>9} {'peak rss':>9}")
        for name, argv, target in cases:
            if args.only not in name:
                continue
            show(name, measure(argv, folder, args.rounds, env), target)
        # `kesoku chat "question"` alone, in a folder whose ./kesoku.toml is the daemon's (claude)
        plain = folder / "plain"
        plain.mkdir()
        (plain / "kesoku.toml").write_text(
            cloud.read_text().replace('db_path = "cloud.db"', f'db_path = "{folder / "cloud.db"}"')
            + '[agent]\nllm = "claude"\n'
        )
        served = [
            (
                f"kesoku chat --llm {llm} '...' (daemon running)",
                [str(KESOKU), *chats[llm][:3], *chats[llm][4:]],
                folder,
            )
            for llm in urls
        ]
        served.append(
            ("kesoku chat '...' (daemon running, claude)", [str(KESOKU), "chat", question], plain)
        )
        if any(args.only in name for name, _, _ in served):
            with daemon(cloud, folder, env):
                for name, argv, cwd in served:
                    if args.only in name:
                        show(name, measure(argv, cwd, args.rounds, env), "100 ms, 30 MB")
        if args.importtime:
            print(f"\nslowest imports of the one-shot chat ({args.importtime}, cumulative):")
            for micros, module in importtime(
                ["-m", "kesoku", *chats[args.importtime]], folder, env
            ):
                print(f"  {micros / 1e3:>7.1f} ms  {module}")


if __name__ == "__main__":
    main()
