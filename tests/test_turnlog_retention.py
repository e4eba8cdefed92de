"""The per-session cap on turn logs: the oldest go first, the newest stays, indexes never repeat."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import trio
from test_turnlog import entry, frames

from kesoku.agent.runtime import Runtime
from kesoku.config.settings import Config, ScriptedConfig, TurnLogsConfig, load_config
from kesoku.gateway import Gateway
from kesoku.observe.turnlog import make_job, serve_jobs
from kesoku.observe.turnlog_writer import TurnLogWriter
from kesoku.store import Store
from kesoku.vocab.errors import ConfigError
from kesoku.vocab.ir import LLMTurn, TextBlock


def logs(folder: Path) -> list[int]:
    return sorted(
        int(p.name.split("-")[2].split(".")[0]) for p in folder.glob("llm-turn-*.log.yaml")
    )


def write(folder: Path, count: int, max_session_bytes: int) -> list[str]:
    """``count`` logs of the same size through one writer process's loop; its answers."""
    answers = io.BytesIO()
    jobs = frames(
        *(make_job(entry(folder, LLMTurn("user", (TextBlock("x" * 2000),)))) for _ in range(count))
    )
    serve_jobs(io.BytesIO(jobs), answers, max_session_bytes=max_session_bytes)
    return answers.getvalue().decode().splitlines()


def test_past_the_cap_the_oldest_logs_go_and_indexes_continue_after_a_restart(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "s"
    assert write(folder, 1, 0) == ["ok"]
    size = (folder / "llm-turn-1.log.yaml").stat().st_size
    cap = int(size * 3.5)  # room for three logs
    assert write(folder, 9, cap) == ["ok"] * 9
    assert logs(folder) == [8, 9, 10]
    # A new writer process (a restart) counts what the folder already holds, and goes on from 10.
    assert write(folder, 2, cap) == ["ok"] * 2
    assert logs(folder) == [10, 11, 12]
    assert sum(p.stat().st_size for p in folder.iterdir()) <= cap
    assert write(tmp_path / "other", 2, cap) == ["ok"] * 2  # each session folder has its own cap
    assert logs(tmp_path / "other") == [1, 2]


def test_the_newest_log_stays_even_alone_over_the_cap(tmp_path: Path) -> None:
    assert write(tmp_path / "s", 3, 1) == ["ok"] * 3
    assert logs(tmp_path / "s") == [3]


def test_no_cap_keeps_every_log(tmp_path: Path) -> None:
    assert write(tmp_path / "s", 5, 0) == ["ok"] * 5
    assert logs(tmp_path / "s") == [1, 2, 3, 4, 5]


async def test_the_daemons_writer_passes_the_cap_to_its_process(tmp_path: Path) -> None:
    writer = TurnLogWriter(max_session_bytes=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.serve)
        for _ in range(4):
            await writer.submit(entry(tmp_path / "s"))
        nursery.cancel_scope.cancel()  # drains: every queued log is written first
    assert (writer.written, writer.failed) == (4, 0)
    assert logs(tmp_path / "s") == [4]


def test_the_config_section_sets_the_writer_or_turns_logs_off(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("steps:\n  - text: hi\n")
    scripted = ScriptedConfig(path=str(script))
    store = Store(tmp_path / "kesoku.db")
    try:
        gateway = Gateway(store, tmp_path / "sessions")
        capped = Config(scripted=scripted, turn_logs=TurnLogsConfig(max_mb_per_session=1.5))
        on = Runtime.from_config(capped, gateway, llm_name="scripted")
        assert on.turnlog is not None and on.turnlog.max_session_bytes == 1_500_000
        no_logs = Config(scripted=scripted, turn_logs=TurnLogsConfig(enabled=False))
        off = Runtime.from_config(no_logs, gateway, llm_name="scripted")
        assert off.turnlog is None
    finally:
        store.close()
    # still a cap: the newest stays
    assert TurnLogsConfig(max_mb_per_session=1e-7).max_bytes_per_session == 1
    assert TurnLogsConfig(max_mb_per_session=0).max_bytes_per_session == 0
    bad = tmp_path / "bad.toml"
    for value in ("-1", "inf", "1e400", "nan"):
        bad.write_text(f"[turn_logs]\nmax_mb_per_session = {value}\n")
        with pytest.raises(
            ConfigError, match=r"bad\.toml:2: turn_logs\.max_mb_per_session: expected float"
        ):
            load_config(bad, env={})
