"""Turn logs: indexes across restarts and writers, YAML content, render cache, writer process."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import yaml

from kesoku.observe import turnlog
from kesoku.observe.turnlog import (
    FRAME_HEADER,
    TurnLogEntry,
    TurnLogRenderer,
    _dump,
    _dump_all,
    make_job,
    serve_jobs,
    write_turn_log,
)
from kesoku.observe.turnlog_writer import TurnLogWriter
from kesoku.vocab.ir import (
    ImageBlock,
    LLMRequest,
    LLMResponse,
    LLMTurn,
    TextBlock,
    ToolCallBlock,
    ToolSpec,
)
from kesoku.vocab.model import Usage


def entry(
    folder: Path, *turns: LLMTurn, session_id: str = "s", error: str | None = None
) -> TurnLogEntry:
    request = LLMRequest(
        system="You are\nKesoku.",
        turns=turns or (LLMTurn("user", (TextBlock("hi"),)),),
        tools=(
            ToolSpec(
                "echo", "Repeat.", {"type": "object", "properties": {"text": {"type": "string"}}}
            ),
        ),
    )
    response = LLMResponse(
        text="answer",
        thoughts="because",
        tool_calls=(ToolCallBlock("c1", "echo", {"text": "x"}),),
        usage=Usage(input_tokens=10, output_tokens=2),
    )
    return TurnLogEntry(
        folder=str(folder),
        session_id=session_id,
        provider="scripted",
        model="m",
        started_at=1_700_000_000.0,
        duration_s=0.25,
        request=request,
        response=None if error else response,
        error=error,
    )


def test_indexes_start_at_one_and_continue_after_a_restart(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    paths = [write_turn_log(entry(folder)).name for _ in range(3)]
    assert paths == ["llm-turn-1.log.yaml", "llm-turn-2.log.yaml", "llm-turn-3.log.yaml"]
    (folder / "llm-turn-9.log.yaml.bak").write_text("not a log")
    (folder / "notes.txt").write_text("x")
    turnlog._next_idx.clear()  # a new process: nothing cached
    (folder / "llm-turn-7.log.yaml").write_text("left by another process")
    assert write_turn_log(entry(folder)).name == "llm-turn-8.log.yaml"


def test_two_threads_never_share_an_index(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    folder.mkdir()
    names: list[str] = []
    lock = threading.Lock()

    def write_many() -> None:
        for _ in range(50):
            name = write_turn_log(entry(folder)).name
            with lock:
                names.append(name)

    threads = [threading.Thread(target=write_many) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(names)) == 100
    assert sorted(int(n.split("-")[2].split(".")[0]) for n in names) == list(range(1, 101))


def test_the_yaml_holds_metadata_request_tools_and_response(tmp_path: Path) -> None:
    big = ImageBlock("/tmp/p.png", "image/png", b"x" * 5000)
    path = write_turn_log(entry(tmp_path, LLMTurn("user", (TextBlock("line one\nline two"), big))))
    text = path.read_text()
    assert "|-" in text or "|\n" in text  # multi-line strings as literal blocks
    doc = yaml.safe_load(text)
    meta = doc["metadata"]
    assert (meta["idx"], meta["session_id"], meta["provider"], meta["model"]) == (
        1,
        "s",
        "scripted",
        "m",
    )
    assert meta["iso_time"].startswith("2023-11-14T22:13:20")
    assert doc["request"]["system"] == "You are\nKesoku."
    blocks = doc["request"]["turns"][0]["blocks"]
    assert blocks[0] == {"type": "text", "text": "line one\nline two"}
    assert blocks[1]["data"] == "<5000 bytes>"
    assert doc["tools"][0]["parameters"]["properties"]["text"]["type"] == "string"
    response = doc["response"]
    assert (response["text"], response["thoughts"]) == ("answer", "because")
    assert response["tool_calls"][0]["arguments"] == {"text": "x"}
    assert response["usage"]["input_tokens"] == 10
    failed = yaml.safe_load(write_turn_log(entry(tmp_path, error="boom")).read_text())
    assert failed["metadata"]["error"] == "boom"
    assert failed["response"] is None


def test_the_renderer_reuses_earlier_turns_and_changes_nothing(tmp_path: Path) -> None:
    renderer = TurnLogRenderer()
    first = LLMTurn("user", (TextBlock("line one\nline two"),))
    turns = [first, LLMTurn("assistant", (TextBlock("ok"),)), LLMTurn("user", (TextBlock("more"),))]
    renderer.body(make_job(entry(tmp_path, *turns[:1])))
    cached = renderer._sessions["s"].texts[0]
    body = renderer.body(make_job(entry(tmp_path, *turns), keep=1, system=False, tools=False))
    assert renderer._sessions["s"].texts[0] is cached  # not rendered again
    assert body == TurnLogRenderer().body(make_job(entry(tmp_path, *turns)))
    doc = yaml.safe_load(body)
    assert [t["blocks"][0]["text"] for t in doc["request"]["turns"]] == [
        "line one\nline two",
        "ok",
        "more",
    ]
    assert doc["request"]["system"] == "You are\nKesoku."
    assert doc["tools"][0]["name"] == "echo"


def frames(*jobs: object) -> bytes:
    encoder = msgspec.msgpack.Encoder()
    return b"".join(FRAME_HEADER.pack(len(data)) + data for data in map(encoder.encode, jobs))


def test_the_writer_process_answers_each_job_and_a_job_out_of_step_fails_alone(
    tmp_path: Path,
) -> None:
    turns = (LLMTurn("user", (TextBlock("hi"),)), LLMTurn("assistant", (TextBlock("yes"),)))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    answers = io.BytesIO()
    # keeps what it never sent
    serve_jobs(
        io.BytesIO(
            frames(
                make_job(entry(tmp_path / "a", *turns), keep=1, system=False),
                make_job(entry(tmp_path / "a", *turns)),
                make_job(
                    entry(tmp_path / "a", *turns, LLMTurn("user", (TextBlock("more"),))),
                    keep=2,
                    tools=False,
                ),
                make_job(entry(not_a_folder)),
            )
        ),
        answers,
    )
    lines = answers.getvalue().decode().splitlines()
    assert lines[0].startswith("failed s TurnLogOutOfStep: session s:")
    assert lines[1:3] == ["ok", "ok"]
    assert lines[3].startswith("failed s ")
    second = yaml.safe_load((tmp_path / "a" / "llm-turn-2.log.yaml").read_text())
    assert [t["blocks"][0]["text"] for t in second["request"]["turns"]] == ["hi", "yes", "more"]
    assert second["tools"][0]["name"] == "echo"


def test_large_attachment_data_is_not_sent_to_the_writer(tmp_path: Path) -> None:
    small = ImageBlock("a.png", "image/png", b"x" * 10)
    big = ImageBlock("b.png", "image/png", b"x" * 5000)
    job = make_job(entry(tmp_path, LLMTurn("user", (TextBlock("look"), small, big))))
    assert job.omitted == ((0, 2, 5000),)
    assert job.turns[0].blocks[2].data == b""  # type: ignore[union-attr]
    assert job.turns[0].blocks[1] is small


async def test_the_writer_drains_on_cancel_and_counts_failures(tmp_path: Path) -> None:
    writer = TurnLogWriter(buffer=8)
    with pytest.raises(RuntimeError, match="before serve"):
        await writer.submit(entry(tmp_path / "a"))
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.serve)
        for _ in range(3):
            await writer.submit(entry(tmp_path / "a"))
        await writer.submit(entry(not_a_folder))
        nursery.cancel_scope.cancel()  # the queued entries are still written
    assert (writer.written, writer.failed, writer.dropped) == (3, 1, 0)
    assert len(list((tmp_path / "a").glob("llm-turn-*.log.yaml"))) == 3
    assert writer.process is not None and writer.process.returncode == 0  # it ended by itself
    await writer.submit(entry(tmp_path / "a"))  # after serve stopped: dropped, counted
    assert writer.dropped == 1


async def test_an_integer_msgpack_cannot_hold_is_logged_as_its_text(tmp_path: Path) -> None:
    # A model wrote {"max_lines": 1e23 as an integer}: the turn must go on, and the log show it.
    huge, negative = 10**23, -(10**20)
    call = ToolCallBlock("c9", "read_file", {"path": "a", "max_lines": huge, "n": [negative, 7]})
    turns = (LLMTurn("user", (TextBlock("go"),)), LLMTurn("assistant", (call,)))
    writer = TurnLogWriter()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.serve)
        await writer.submit(entry(tmp_path / "a", *turns, LLMTurn("user", (TextBlock("more"),))))
        nursery.cancel_scope.cancel()
    assert (writer.written, writer.failed, writer.dropped) == (1, 0, 0)
    [log] = (tmp_path / "a").glob("llm-turn-*.log.yaml")
    text = log.read_text()
    assert str(huge) in text and str(negative) in text


async def test_a_writer_process_that_dies_is_replaced_and_sessions_start_afresh(
    tmp_path: Path,
) -> None:
    turns = [LLMTurn("user", (TextBlock("hi"),))]
    writer = TurnLogWriter()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.serve)
        await writer.submit(entry(tmp_path / "a", *turns))
        with trio.fail_after(10):
            while writer.written < 1:  # noqa: ASYNC110 - the writer process's answers are counted
                await trio.sleep(0.01)
        first = writer.process
        assert first is not None
        first.kill()
        with trio.fail_after(10):
            while writer.restarts < 1 or writer.process is first:  # noqa: ASYNC110
                await trio.sleep(0.01)
        turns.append(LLMTurn("assistant", (TextBlock("yes"),)))
        # the new process never saw the first turn
        await writer.submit(entry(tmp_path / "a", *turns))
        nursery.cancel_scope.cancel()
    assert (writer.written, writer.failed, writer.restarts) == (2, 0, 1)
    second = yaml.safe_load((tmp_path / "a" / "llm-turn-2.log.yaml").read_text())
    assert [t["blocks"][0]["text"] for t in second["request"]["turns"]] == ["hi", "yes"]
    assert second["request"]["system"] == "You are\nKesoku."


@pytest.mark.parametrize(
    "docs",
    [
        [{"a": "x\n---\ny"}, ["---"], {"---": "--- x"}, {"b": []}],
        [{"metadata": None}, [{"role": "user", "blocks": [{"text": "...\n---"}]}]],
        [{"a": 1}, [], {"b": 2}],  # an empty list is written "--- []": each doc on its own instead
    ],
)
def test_one_emitter_for_several_docs_writes_what_one_each_would(docs: list[object]) -> None:
    assert _dump_all(docs) == [_dump(doc) for doc in docs]


async def test_a_writer_process_that_cannot_start_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_open_process = trio.lowlevel.open_process
    attempts: list[object] = []

    async def out_of_processes(*args: Any, **kwargs: Any) -> trio.Process:
        attempts.append(args)
        if len(attempts) == 1:
            # what fork says under a pid limit
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return await real_open_process(*args, **kwargs)

    monkeypatch.setattr(trio.lowlevel, "open_process", out_of_processes)
    monkeypatch.setattr("kesoku.observe.turnlog_writer.RESTART_DELAY_S", 0.05)
    writer = TurnLogWriter()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.serve)
        with trio.fail_after(10):
            while writer.process is None:  # noqa: ASYNC110 - set by the writer's own task
                await trio.sleep(0.01)
        await writer.submit(entry(tmp_path / "a"))
        nursery.cancel_scope.cancel()
    assert len(attempts) == 2 and writer.written == 1
    assert "could not start: [Errno 11]" in caplog.text


def test_the_writer_process_outlives_its_daemon_writes_what_it_got_and_ends(tmp_path: Path) -> None:
    jobs = [
        make_job(entry(tmp_path / "a", LLMTurn("user", (TextBlock(f"question {i}"),))))
        for i in range(20)
    ]
    process = subprocess.Popen(
        [sys.executable, "-P", "-m", "kesoku.observe.turnlog"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdout.close()  # the daemon is gone: every answer meets a broken pipe
    cut = frames(jobs[0])[:-3]  # and it died while sending one more job
    try:
        process.stdin.write(frames(*jobs) + cut)
        process.stdin.close()
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
    assert len(list((tmp_path / "a").glob("llm-turn-*.log.yaml"))) == 20


async def test_a_session_whose_logs_keep_failing_is_logged_once_until_a_log_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    writer = TurnLogWriter()

    async def settle(count: int) -> None:
        with trio.fail_after(10):
            while writer.written + writer.failed < count:  # noqa: ASYNC110 - the writer process's answers
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.serve)
        for _ in range(3):
            await writer.submit(entry(not_a_folder))
        await settle(3)
        await writer.submit(entry(tmp_path / "a"))  # written: the next failure is news again
        await writer.submit(entry(not_a_folder))
        await settle(5)
        nursery.cancel_scope.cancel()
    assert (writer.written, writer.failed) == (1, 4)
    errors = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(errors) == 2
    assert "the same failure again is counted, not logged" in errors[0]
