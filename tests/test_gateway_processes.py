"""The gateway across real processes sharing one SQLite file."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.vocab.model import Message, user_text

POSTER = Path(__file__).parent / "data" / "poster.py"


async def test_a_second_process_posting_while_we_listen_loses_nothing(
    gateway: Gateway, db_path: Path
) -> None:
    session = gateway.open_session("terminal", "here")
    theirs_n, ours_n = 1_500, 1_500
    got: list[Message] = []

    async def listen_all() -> None:
        async for msg in gateway.listen(after=0):
            got.append(msg)
            if len(got) == theirs_n + ours_n:
                return

    results: list[subprocess.CompletedProcess[bytes]] = []

    async def other_process() -> None:
        argv = [
            sys.executable,
            str(POSTER),
            str(db_path),
            str(gateway.sessions_dir),
            "there",
            str(theirs_n),
            "50",
        ]
        results.append(
            await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False)
        )

    with trio.fail_after(60):  # a hang guard, not a speed goal
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen_all)
            nursery.start_soon(other_process)
            for i in range(ours_n):
                await gateway.post(user_text(session.id, f"here-{i}"))
                if i % 50 == 0:
                    await trio.sleep(0.001)
    [proc] = results
    assert proc.returncode == 0, proc.stderr.decode()
    ids = [m.id for m in got]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    contents = {m.content for m in got}
    assert contents == {f"there-{i}" for i in range(theirs_n)} | {
        f"here-{i}" for i in range(ours_n)
    }


def test_a_posted_message_survives_kill_9(tmp_path: Path) -> None:
    db_path = tmp_path / "kesoku.db"
    argv = [
        sys.executable,
        str(POSTER),
        str(db_path),
        str(tmp_path / "sessions"),
        "doomed",
        "1000000",
    ]
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        acknowledged = [int(proc.stdout.readline()) for _ in range(300)]
        os.kill(proc.pid, signal.SIGKILL)  # no chance to close, checkpoint or flush anything
    assert proc.returncode == -signal.SIGKILL
    store = Store(db_path)
    try:
        for message_id in acknowledged:
            stored = store.get_message(message_id)
            assert stored is not None, f"message {message_id} was acknowledged but is gone"
        session = store.find_session("proc", "doomed")
        assert session is not None
        assert len(store.history(session.id)) >= len(acknowledged)
    finally:
        store.close()
