"""Waking listeners of other processes (kesoku.store.wakeup): real processes, FIFOs, SQLite files.

The listening gateways here poll once an hour, so a message from another process can only arrive by
a wake-up; each wait has a hang guard far below the hour.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.store.wakeup import Wakeups
from kesoku.vocab.model import Message, user_text

POSTER = Path(__file__).parent / "data" / "poster.py"
HOUR_S = 3600.0

# Posts one message, truncates the WAL (a checkpoint that resets it to zero bytes), posts another.
POST_CHECKPOINT_POST = """
import sys, trio
from kesoku.gateway import Gateway
from kesoku.store import Store
from kesoku.vocab.model import user_text

async def main(db, sessions):
    gateway = Gateway(Store(db), sessions)
    session = gateway.open_session("proc", "reset")
    await gateway.post(user_text(session.id, "before the reset"))
    busy, _, _ = gateway.store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    print(busy, flush=True)
    await gateway.post(user_text(session.id, "after the reset"))
    gateway.store.close()

trio.run(main, sys.argv[1], sys.argv[2])
"""


def inboxes(db_path: Path) -> list[str]:
    return sorted(p.name for p in Path(f"{db_path}-wake").iterdir())


async def listen_until_parked(
    gateway: Gateway, nursery: trio.Nursery, got: list[Message], n: int
) -> None:
    """Start a listener of the "proc" adapter; return once it waits (its inbox is open)."""

    async def listen() -> None:
        async for msg in gateway.listen(adapter="proc"):
            got.append(msg)
            if len(got) == n:
                return

    nursery.start_soon(listen)
    await trio.testing.wait_all_tasks_blocked()
    await trio.sleep(0.01)  # past the look after the inbox opened: what follows needs a wake-up


async def test_another_process_wakes_the_listener_without_the_poll(
    store: Store, db_path: Path, tmp_path: Path
) -> None:
    gateway = Gateway(store, tmp_path / "sessions", poll_interval_s=HOUR_S)
    n = 30
    got: list[Message] = []
    with trio.fail_after(60):  # a hang guard: without a wake-up, the next look is an hour away
        async with trio.open_nursery() as nursery:
            await listen_until_parked(gateway, nursery, got, n)
            [ours] = inboxes(db_path)
            assert ours.startswith(f"{os.getpid()}-")
            argv = [sys.executable, str(POSTER), str(db_path), str(tmp_path / "sessions")]
            await trio.run_process([*argv, "there", str(n), "1"], stdout=subprocess.DEVNULL)
    assert [m.content for m in got] == [f"there-{i}" for i in range(n)]


async def test_a_wal_reset_between_commits_loses_no_wake_up(
    store: Store, db_path: Path, tmp_path: Path
) -> None:
    gateway = Gateway(store, tmp_path / "sessions", poll_interval_s=HOUR_S)
    got: list[Message] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await listen_until_parked(gateway, nursery, got, 2)
            argv = [sys.executable, "-c", POST_CHECKPOINT_POST, str(db_path), str(tmp_path / "s")]
            done = await trio.run_process(argv, capture_stdout=True)
    assert done.stdout.split() == [b"0"]  # the checkpoint did reset the WAL
    assert [m.content for m in got] == ["before the reset", "after the reset"]


async def test_the_inbox_is_removed_when_the_run_ends(store: Store, db_path: Path) -> None:
    wakeups = store.wakeups
    assert wakeups is not None
    inbox = wakeups.open_inbox()
    assert inbox is not None
    assert inboxes(db_path) == [inbox.name]
    mode = stat.S_IMODE(os.stat(wakeups.folder).st_mode)
    assert mode == 0o700
    inbox.close()
    assert inboxes(db_path) == []
    await trio.lowlevel.checkpoint()


async def test_own_commits_do_not_wake_the_own_inbox(store: Store, db_path: Path) -> None:
    session = store.create_session("t", "c", workspace_root=db_path.parent)
    assert store.wakeups is not None
    inbox = store.wakeups.open_inbox()
    assert inbox is not None
    other = Store(db_path)  # another connection with its own wake-ups, as another process has
    try:
        store.insert_messages([user_text(session.id, "mine")])
        assert not inbox.take()
        other.insert_messages([user_text(session.id, "theirs")])
        assert inbox.take()
        assert not inbox.take()  # read once
        # A duplicate writes nothing and wakes no one.
        dup = user_text(session.id, "again", external_id="e1")
        other.insert_messages([dup])
        inbox.take()
        assert not other.insert_messages([dup])[0].new
        assert not inbox.take()
    finally:
        other.close()
        inbox.close()
    await trio.lowlevel.checkpoint()


async def test_an_inbox_left_by_a_dead_process_is_removed(store: Store, db_path: Path) -> None:
    session = store.create_session("t", "c", workspace_root=db_path.parent)
    listening = Store(db_path)
    assert listening.wakeups is not None and store.wakeups is not None
    inbox = listening.wakeups.open_inbox()
    assert inbox is not None
    # What kill -9 leaves: an inbox no process reads.
    os.mkfifo(f"{listening.wakeups.folder}/999999999-dead.fifo", 0o600)
    try:
        store.insert_messages([user_text(session.id, "hello")])
        assert inbox.take()  # the live one still gets its byte
        assert inboxes(db_path) == [inbox.name]
    finally:
        inbox.close()
        listening.close()
    await trio.lowlevel.checkpoint()


async def test_a_folder_others_can_enter_turns_wake_ups_off_with_one_warning(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkdir(f"{db_path}-wake", 0o755)
    os.chmod(f"{db_path}-wake", 0o755)  # past the umask
    wakeups = Wakeups(db_path)
    with caplog.at_level(logging.WARNING, logger="kesoku.store.wakeup"):
        assert wakeups.open_inbox() is None
        assert wakeups.open_inbox() is None
        wakeups.notify()
    assert len(caplog.records) == 1
    assert "not private" in caplog.records[0].getMessage()
    wakeups.close()
    await trio.lowlevel.checkpoint()


async def test_a_sender_finds_an_inbox_made_after_a_steady_listing(db_path: Path) -> None:
    sender, receiver = Wakeups(db_path), Wakeups(db_path)
    first = receiver.open_inbox()
    assert first is not None
    sender.notify()  # lists the folder: one inbox
    assert first.take()
    # The folder's modification time is pushed into the past, as if unchanged for a while: the
    # sender stops listing it...
    os.utime(receiver.folder, ns=(0, 0))
    await trio.sleep(0.002)
    sender.notify()
    assert first.take()
    # ...until an inbox comes: making it moves the folder's time, and the next look lists it.
    second = receiver.open_inbox()
    assert second is not None
    await trio.sleep(0.002)
    sender.notify()
    assert first.take() and second.take()
    first.close()
    second.close()
    sender.close()
    receiver.close()
