from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing
from runtime_harness import close_store

from kesoku.gateway import Gateway
from kesoku.store import Store, UnknownSessionError
from kesoku.vocab.model import (
    Kind,
    Message,
    MessageError,
    Metadata,
    Role,
    Session,
    in_turn,
    user_text,
)


async def collect(listener: object, n: int, into: list[Message]) -> None:
    async for msg in listener:  # type: ignore[attr-defined]
        into.append(msg)
        if len(into) == n:
            return


async def test_post_persists_and_wakes_a_listener(gateway: Gateway, session: Session) -> None:
    got: list[Message] = []
    async with trio.open_nursery() as nursery:
        listener = gateway.listen(role="user")
        nursery.start_soon(collect, listener, 2, got)
        await trio.lowlevel.checkpoint()
        a = await gateway.post(user_text(session.id, "one"))
        b = await gateway.post(user_text(session.id, "two"))
    assert got == [a, b]
    assert gateway.store.get_message(a.id) == a


async def test_listen_tails_by_default_and_replays_from_zero(
    gateway: Gateway, session: Session
) -> None:
    old = await gateway.post(user_text(session.id, "before"))
    tail = gateway.listen()
    replay = gateway.listen(after=0)
    new = await gateway.post(user_text(session.id, "after"))
    assert [await anext(replay), await anext(replay)] == [old, new]
    assert await anext(tail) == new


async def test_filters_pick_messages(gateway: Gateway, session: Session) -> None:
    other = gateway.open_session("discord", "x")
    root = await gateway.post(user_text(session.id, "q"))
    users = gateway.listen(after=0, role=Role.USER, adapter="discord")
    thoughts = gateway.listen(after=0, session_id=session.id, kind=[Kind.THOUGHT, Kind.TOOL_CALL])
    await gateway.post(in_turn(root, Role.ASSISTANT, Kind.THOUGHT, "hmm"))
    theirs = await gateway.post(user_text(other.id, "hi"))
    assert (await anext(users)).id == theirs.id
    assert (await anext(thoughts)).content == "hmm"


def test_unknown_filters_are_refused(gateway: Gateway) -> None:
    with pytest.raises(TypeError, match="unknown message filter"):
        gateway.listen(rol="user")
    with pytest.raises(ValueError, match="no role called"):
        gateway.listen(role="admin")
    with pytest.raises(ValueError, match="empty collection"):
        gateway.listen(session_id=[])


async def test_a_duplicate_external_id_wakes_no_one(gateway: Gateway, session: Session) -> None:
    listener = gateway.listen()
    first = await gateway.post(user_text(session.id, "hi", external_id="d-1"))
    again = await gateway.post(user_text(session.id, "hi (replayed)", external_id="d-1"))
    last = await gateway.post(user_text(session.id, "next"))
    assert again == first
    assert [await anext(listener), await anext(listener)] == [first, last]


async def test_post_many_is_all_or_nothing(gateway: Gateway, session: Session) -> None:
    root = await gateway.post(user_text(session.id, "q"))
    calls = [
        in_turn(root, Role.ASSISTANT, Kind.TOOL_CALL, "", metadata=Metadata(tool_name=f"t{i}"))
        for i in range(3)
    ]
    stored = await gateway.post_many(calls)
    assert [m.id for m in stored] == list(range(root.id + 1, root.id + 4))
    with pytest.raises(MessageError):
        await gateway.post_many(
            [
                user_text(session.id, "fine"),
                Message(session_id=session.id, role=Role.USER, sender=""),
            ]
        )
    with pytest.raises(UnknownSessionError):
        await gateway.post_many([user_text(session.id, "fine"), user_text("ghost", "x")])
    assert len(gateway.store.history(session.id)) == 4


async def test_a_cancelled_post_writes_nothing(gateway: Gateway, session: Session) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await gateway.post(user_text(session.id, "never"))
    assert scope.cancelled_caught
    assert gateway.store.history(session.id) == []


async def test_a_post_that_started_completes_despite_cancellation(
    gateway: Gateway, session: Session
) -> None:
    stored: list[Message] = []

    async def poster(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        stored.append(await gateway.post(user_text(session.id, "kept")))

    async with trio.open_nursery() as nursery:
        await nursery.start(poster)
        # the post already ran synchronously up to its final checkpoint
        nursery.cancel_scope.cancel()
    assert [m.content for m in gateway.store.history(session.id)] == ["kept"]
    assert stored
    assert stored[0].content == "kept"


async def test_a_slow_listener_gets_everything_in_order_with_bounded_memory(
    store: Store, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    gateway = Gateway(store, tmp_path / "sessions", listener_buffer=64)
    session = gateway.open_session("terminal", "slow")
    total = 3_000
    got: list[Message] = []

    async def slow_reader(listener: object) -> None:
        async for msg in listener:  # type: ignore[attr-defined]
            got.append(msg)
            await trio.sleep(0.01)  # 100 messages/s against a poster that never waits
            if len(got) == total:
                return

    listener = gateway.listen()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_reader, listener)
        posted = [(await gateway.post(user_text(session.id, str(i)))).id for i in range(total)]
    assert [m.id for m in got] == posted
    assert listener.max_buffered <= 64
    assert listener.store_reads > total // 64  # it fell behind and caught up from the store


async def test_a_fast_listener_keeps_up_in_memory(gateway: Gateway, session: Session) -> None:
    got: list[Message] = []
    listener = gateway.listen()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, listener, 500, got)
        for i in range(500):
            await gateway.post(user_text(session.id, str(i)))
    assert [m.content for m in got] == [str(i) for i in range(500)]
    assert listener.store_reads == 1  # the first read only: every post was handed over in memory


async def test_a_restarted_listener_gets_exactly_what_it_missed(
    gateway: Gateway, session: Session
) -> None:
    first = [await gateway.post(user_text(session.id, f"a{i}")) for i in range(5)]
    seen: list[Message] = []
    with trio.move_on_after(1):
        async for msg in gateway.listen(after=0):
            seen.append(msg)
            gateway.store.set_cursor("adapter:test", msg.id)
            if len(seen) == 3:
                break  # the listener "crashes" after handling three
    missed = first[3:] + [await gateway.post(user_text(session.id, f"b{i}")) for i in range(4)]
    cursor = gateway.store.get_cursor("adapter:test")
    assert cursor == seen[-1].id
    resumed: list[Message] = []
    with gateway.listen(after=cursor) as listener:
        await collect(listener, len(missed), resumed)
    assert resumed == missed


async def test_cancelling_a_waiting_listener_loses_nothing(
    gateway: Gateway, session: Session
) -> None:
    listener = gateway.listen()
    with trio.move_on_after(0.01):
        await anext(listener)
    msg = await gateway.post(user_text(session.id, "after the cancel"))
    assert await anext(listener) == msg


async def test_close_ends_iteration(gateway: Gateway, session: Session) -> None:
    ended = trio.Event()

    async def reader(listener: object) -> None:
        async for _ in listener:  # type: ignore[attr-defined]
            pass
        ended.set()

    listener = gateway.listen()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, listener)
        await trio.sleep(0.001)
        listener.close()
    assert ended.is_set()
    assert listener not in gateway._listeners


async def test_writes_by_another_connection_reach_listeners(
    gateway: Gateway, session: Session, db_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    other = Gateway(Store(db_path), gateway.sessions_dir)
    listener = gateway.listen()
    mine_1 = await gateway.post(user_text(session.id, "mine 1"))
    # no post of ours follows: found by polling
    theirs = await other.post(user_text(session.id, "theirs"))
    assert [await anext(listener), await anext(listener)] == [mine_1, theirs]
    theirs_2 = await other.post(user_text(session.id, "theirs 2"))
    # id gap: the listener reads the store
    mine_2 = await gateway.post(user_text(session.id, "mine 2"))
    assert [await anext(listener), await anext(listener)] == [theirs_2, mine_2]
    await close_store(other.store)


async def test_deleting_a_session_removes_its_workspace(gateway: Gateway, session: Session) -> None:
    workspace = Path(session.workspace)
    assert workspace.is_dir()
    (workspace / "notes.txt").write_text("x")
    await gateway.post(user_text(session.id, "x"))
    assert await gateway.delete_session(session.id)
    assert not workspace.exists()
    assert gateway.store.history(session.id) == []
    assert not await gateway.delete_session(session.id)


async def test_a_listener_drains_its_buffer_without_starving_other_tasks(
    store: Store, tmp_path: Path
) -> None:
    gateway = Gateway(store, tmp_path / "sessions", listener_buffer=64)
    session = gateway.open_session("terminal", "backlog")
    backlog = [user_text(session.id, str(i)) for i in range(1_000)]
    # Written in a worker thread: a 1,000-row transaction is setup here, not the step under test.
    posted = [r.message for r in await trio.to_thread.run_sync(store.insert_messages, backlog)]
    steps = 0  # how many times another task got to run

    async def other_task() -> None:
        nonlocal steps
        while True:
            steps += 1
            await trio.lowlevel.checkpoint()

    longest = run = 0
    seen_at = -1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        async for msg in gateway.listen(after=0):  # a consumer that never awaits anything itself
            run = run + 1 if steps == seen_at else 1
            seen_at = steps
            longest = max(longest, run)
            if msg.id == posted[-1].id:
                break
        nursery.cancel_scope.cancel()
    # It yields before every store read (one buffer's worth); trio may run the two tasks of one
    # batch in either order, so the other task can see two buffers go by between two of its own
    # steps.
    assert longest <= 2 * 64
    assert longest >= 64  # a buffer is drained without a trip through the scheduler per message


async def test_a_cancelled_caller_gets_cancelled_and_the_buffered_message_stays(
    gateway: Gateway, session: Session
) -> None:
    listener = gateway.listen()
    first = await gateway.post(user_text(session.id, "one"))
    assert await anext(listener) == first  # now on the fast path: posts land in its buffer
    second = await gateway.post(user_text(session.id, "two"))
    with trio.CancelScope() as scope:
        scope.cancel()
        await anext(listener)
    assert scope.cancelled_caught
    assert await anext(listener) == second


async def test_idle_listeners_all_get_another_connections_writes(
    gateway: Gateway, session: Session, db_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    other = Store(db_path)
    listeners = [
        gateway.listen(),
        gateway.listen(role="user"),
        gateway.listen(session_id=session.id),
    ]
    got: list[list[Message]] = [[], [], []]
    async with trio.open_nursery() as nursery:
        for listener, into in zip(listeners, got, strict=True):
            nursery.start_soon(collect, listener, 2, into)
        await trio.sleep(1)  # all three wait, and the poll timer has run many times
        [theirs] = [i.message for i in other.insert_messages([user_text(session.id, "theirs")])]
        await trio.sleep(1)
        [again] = [i.message for i in other.insert_messages([user_text(session.id, "again")])]
    await close_store(other)
    assert got == [[theirs, again]] * 3


def test_a_gateway_polls_in_every_trio_run(
    gateway: Gateway, session: Session, db_path: Path
) -> None:
    other = Store(db_path)

    async def a_run(text: str) -> Message:
        with gateway.listen() as listener:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep, 1)
                await trio.sleep(0.5)  # the listener is not waiting yet: the poll finds it later
                other.insert_messages([user_text(session.id, text)])
                with trio.fail_after(5):
                    return await anext(listener)

    try:
        for text in ("first run", "second run"):  # the first run's poll timer died with that run
            clock = trio.testing.MockClock(autojump_threshold=0)
            assert trio.run(a_run, text, clock=clock).content == text
    finally:
        other.close()


async def test_a_posting_loop_yields_once_per_slice(store: Store, tmp_path: Path) -> None:
    steps = 0  # how many times another task got to run

    async def other_task() -> None:
        nonlocal steps
        while True:
            steps += 1
            await trio.lowlevel.checkpoint()

    async def steps_during_posts(gateway: Gateway, n: int) -> int:
        session = gateway.open_session("terminal", f"slice-{gateway.post_yield_s}")
        await gateway.post(user_text(session.id, "first"))  # yields: no post did before
        before = steps
        for i in range(n):
            await gateway.post(user_text(session.id, str(i)))
        return steps - before

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        await trio.lowlevel.checkpoint()
        every = Gateway(store, tmp_path / "sessions", post_yield_s=0)
        # Every post a schedule point (give or take one: trio may run a batch's tasks in either
        # order).
        assert await steps_during_posts(every, 50) >= 49
        never = Gateway(store, tmp_path / "sessions", post_yield_s=3600)
        listener = never.listen()
        got: list[Message] = []
        nursery.start_soon(collect, listener, 51, got)
        while listener._task is None:  # until it waits for messages
            await trio.lowlevel.checkpoint()
        assert await steps_during_posts(never, 50) == 0  # ...a slice longer than the test
        while len(got) < 51:
            await trio.lowlevel.checkpoint()
        assert listener.max_buffered >= 50  # handed over in memory, and taken in one step
        default = Gateway(store, tmp_path / "sessions")
        assert await steps_during_posts(default, 2_000) > 0  # 2,000 posts take longer than 0.5 ms
        nursery.cancel_scope.cancel()


async def test_a_cancelled_post_writes_nothing_even_within_a_slice(
    store: Store, tmp_path: Path
) -> None:
    gateway = Gateway(store, tmp_path / "sessions", post_yield_s=3600)
    session = gateway.open_session("terminal", "slice")
    kept = await gateway.post(user_text(session.id, "kept"))  # yields; the next would not
    with trio.CancelScope() as scope:
        scope.cancel()
        await gateway.post(user_text(session.id, "never"))
    assert scope.cancelled_caught
    assert gateway.store.history(session.id) == [kept]
