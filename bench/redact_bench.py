"""Redaction benchmark: what masking secrets costs per gateway message (kesoku.config.redact).

Run: .venv/bin/python bench/redact_bench.py [--rounds R]

Target: a short message costs a few µs, a small fraction of the runtime's ~0.5 ms loop overhead
per tool round trip (bench/runtime_bench.py); a 32 KB tool output (the shell's cap) well under a
millisecond. The Redactor holds the literals of a typical config (three API keys, a bot token,
six secret environment variables) besides its shapes. Medians of R rounds.
"""

from __future__ import annotations

import argparse
import functools
import random
import string
import time
from pathlib import Path

import msgspec
from kesoku.config.redact import Redactor
from kesoku.vocab.model import Kind, Metadata, Role, in_turn, user_text

from _util import median, per_call, report

OUTPUT_CHARS = 32_000
SHORT = (
    "The tests pass now; I changed `parse_reply` in kesoku/vocab/markup.py and ran pytest again."
)


def _secrets(rng: random.Random) -> dict[str, str]:
    def token(n: int) -> str:
        return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))

    names = ["gemini.api_key", "claude.api_key", "openai.api_key", "discord.bot_token"]
    names += [f"${name}_TOKEN" for name in ("DEPLOY", "NPM", "PYPI", "SENTRY", "HF", "CI")]
    return {token(rng.randint(24, 72)): name for name in names}


def _outputs(rng: random.Random) -> dict[str, str]:
    """32 KB outputs as tools print them: source code, a log, prose."""
    root = Path(__file__).resolve().parent.parent / "kesoku"
    code = "".join(p.read_text() for p in sorted(root.glob("*.py")) if p.name != "redact.py")
    words = "the of and to in is that for it as was with be by on not he this are or his from at"
    log = "\n".join(
        f"2025-01-12T10:{i % 60:02d}:{i * 7 % 60:02d}Z INFO worker-{i % 8} GET /api/v1/items/{i}"
        f" 200 {rng.randint(1, 900)}ms user=ann@example.com trace={rng.getrandbits(64):016x}"
        for i in range(600)
    )
    prose = " ".join(rng.choice([*words.split(), "password", "token", "key"]) for _ in range(8000))
    return {"code": code[:OUTPUT_CHARS], "log": log[:OUTPUT_CHARS], "prose": prose[:OUTPUT_CHARS]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    rng = random.Random(17)
    secrets = _secrets(rng)
    outputs = _outputs(rng)
    leaky = outputs["log"][: OUTPUT_CHARS - 400] + "".join(f"\n{v}" for v in list(secrets)[:4])
    leaky += "\nDATABASE_URL=postgres://app:hunter2@db/app ghp_" + "a1B2" * 9
    texts = {**outputs, "a log with 6 secrets": leaky}
    builds: list[float] = []
    short: list[float] = []
    secret: list[float] = []
    message: list[float] = []
    big: dict[str, list[float]] = {name: [] for name in texts}
    root = msgspec.structs.replace(user_text("s", "go"), id=1)  # as posted
    call = in_turn(
        root,
        Role.ASSISTANT,
        Kind.TOOL_CALL,
        "shell(command='pytest -q tests/test_markup.py')",
        metadata=Metadata(tool_name="shell", tool_arguments={"command": "pytest -q tests/"}),
    )
    with_secret = f"{SHORT} The key is {next(iter(secrets))}."
    for _ in range(args.rounds):
        start = time.perf_counter()
        redactor = Redactor(secrets)
        builds.append(time.perf_counter() - start)
        short.append(per_call(functools.partial(redactor.mask, SHORT), 2000))
        secret.append(per_call(functools.partial(redactor.mask, with_secret), 2000))
        message.append(per_call(functools.partial(redactor.mask_message, call), 2000))
        for name, text in texts.items():
            big[name].append(per_call(functools.partial(redactor.mask, text), 20))
    assert redactor.mask(SHORT) is SHORT
    assert redactor.mask_message(call) is call
    assert all(redactor.mask(text) is text for text in outputs.values())  # no false positives
    assert "hunter2" not in redactor.mask(leaky)
    report(f"Redactor({len(secrets)} literals + shapes), built once", median(builds) * 1e3, "ms")
    report(f"mask(), a {len(SHORT)}-character message", median(short) * 1e6, "µs", "a few µs")
    report(f"mask(), a {len(with_secret)}-character message with a key", median(secret) * 1e6, "µs")
    report("mask_message(), a tool call (content + arguments)", median(message) * 1e6, "µs")
    for name, times in big.items():
        report(f"mask(), a 32 KB tool output: {name}", median(times) * 1e6, "µs", "under 1,000 µs")


if __name__ == "__main__":
    main()
