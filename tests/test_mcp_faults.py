"""Misbehaving MCP servers: junk on stdout, a crash at start or mid-call, a hang, a missing program.

Each is reported in one line naming the server and why, its tools are withheld, the other servers
keep working, and it is tried again with backoff. Real subprocesses, so real time: timeouts are
short."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from test_mcp import call, manager, serving, stdio, wait_for

from kesoku.config.settings import McpHttpServer, McpStdioServer
from kesoku.vocab.model import Outcome, Session


async def test_junk_on_stdout_is_reported_and_the_server_still_works(
    session: Session, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = manager(stdio("banner", "--junk"))
    with caplog.at_level(logging.WARNING, logger="kesoku.mcp"):
        async with serving(mgr):
            assert mgr.statuses()[0].state == "connected"
            text, outcome, _ = await call(mgr, session, "banner__echo", {"text": "fine"})
    assert (text, outcome) == ("fine", Outcome.COMPLETED)
    assert (
        "MCP server banner: ignored a line on stdout that is not JSON-RPC: "
        "'Starting the test server" in caplog.text
    )
    assert "Traceback" not in caplog.text  # the SDK's own traceback per line is filtered out


async def test_a_server_that_never_answers_fails_clearly_without_holding_up_the_others(
    session: Session,
) -> None:
    # Two servers starting at once on a 2-core machine each take about 2 s to import the SDK.
    mgr = manager(
        stdio("mute", "--only-junk"), stdio("good"), connect_timeout_s=6.0, startup_wait_s=7.0
    )
    started = trio.current_time()
    async with serving(mgr):
        assert trio.current_time() - started < 7.5  # start-up waited for the first tries, no longer
        await wait_for(lambda: mgr.statuses()[0].state == "failed")
        mute, good = mgr.statuses()
        assert good.state == "connected"
        assert mute.error is not None
        assert mute.error.startswith("no answer to the MCP handshake within 6 s")
        assert "line(s) on stdout were not JSON-RPC, first: 'Starting the test server" in mute.error
        assert all(not t.name.startswith("mute__") for t in mgr.tools())
        text, outcome, _ = await call(mgr, session, "good__echo", {"text": "still here"})
        assert (text, outcome) == ("still here", Outcome.COMPLETED)


async def test_a_crash_at_start_names_the_stderr_line_and_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mgr = manager(stdio("broken", "--crash-at-start"), backoff_s=(0.1, 0.2))
    with caplog.at_level(logging.WARNING, logger="kesoku.mcp"):
        async with serving(mgr):
            [status] = mgr.statuses()
            assert status.state == "failed" and mgr.tools() == ()
            assert (
                status.error is not None
                and "stderr: RuntimeError: the server cannot start" in status.error
            )
            assert status.retry_in_s is not None and status.retry_in_s <= 0.2 * 1.2
            await wait_for(lambda: caplog.text.count("MCP server broken failed") >= 2)
    assert "its tools are withheld; retrying in" in caplog.text


async def test_a_crash_mid_call_fails_the_call_with_the_reason_then_the_server_is_back(
    session: Session,
) -> None:
    mgr = manager(stdio("fragile"), backoff_s=(0.1, 0.2))
    async with serving(mgr):
        text, outcome, _ = await call(mgr, session, "fragile__crash")
        assert outcome is Outcome.FAILED
        assert text == (
            "[failed] MCP server fragile went away during the call: the server process ended "
            "(stderr: fatal: the test server crashes on purpose)"
        )
        # withheld until it is back
        assert not any(t.name.startswith("fragile__") for t in mgr.tools())
        await wait_for(lambda: mgr.statuses()[0].state == "connected")
        text, outcome, _ = await call(mgr, session, "fragile__echo", {"text": "back"})
        assert (text, outcome) == ("back", Outcome.COMPLETED)


async def test_a_call_that_hangs_past_its_timeout_times_out_and_the_server_stays(
    session: Session,
) -> None:
    mgr = manager(stdio("slow", timeout_s=1.0))
    async with serving(mgr):
        started = trio.current_time()
        text, outcome, _ = await call(mgr, session, "slow__sleep", {"seconds": 30})
        assert outcome is Outcome.TIMED_OUT and trio.current_time() - started < 5.0
        assert text == "[timed_out] slow__sleep ran longer than 1 s and was cancelled."
        text, outcome, _ = await call(mgr, session, "slow__echo", {"text": "next"})
        assert (text, outcome) == ("next", Outcome.COMPLETED)
        assert mgr.statuses()[0].state == "connected"


async def test_a_server_that_hangs_at_start_is_cut_at_the_connect_timeout() -> None:
    mgr = manager(stdio("stuck", "--hang-at-start"), connect_timeout_s=1.0, startup_wait_s=1.5)
    async with serving(mgr):
        await wait_for(lambda: mgr.statuses()[0].error is not None)
        assert mgr.statuses()[0].error == "no answer to the MCP handshake within 1 s"


async def test_unknown_program_and_unreachable_url(tmp_path: Path) -> None:
    missing = McpStdioServer(name="ghost", command=str(tmp_path / "no-such-server"))
    with trio.socket.socket() as sock:  # a port nobody listens on
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mgr = manager(missing, McpHttpServer(name="far", url=f"http://127.0.0.1:{port}/mcp"))
    async with serving(mgr):
        ghost, far = mgr.statuses()
    assert (
        ghost.state == "failed"
        and ghost.error == f"cannot start {tmp_path / 'no-such-server'}: no such program"
    )
    assert (
        far.state == "failed" and far.error is not None and far.error.startswith("ConnectError: ")
    )


async def test_stopping_while_a_server_keeps_failing_never_raises(tmp_path: Path) -> None:
    # A spawn failing while the manager is cancelled used to escape as a group of the error and
    # Cancelled.
    missing = McpStdioServer(name="ghost", command=str(tmp_path / "no-such-server"))
    for i in range(30):
        mgr = manager(missing, backoff_s=(0.001, 0.001))
        with trio.move_on_after(0.002 * (i % 10)):
            async with serving(mgr):
                await trio.sleep_forever()
