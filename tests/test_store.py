import threading
from pathlib import Path

import msgspec
import pytest
import trio

from kesoku.store import MessageFilter, Store, UnknownSessionError, schema_version
from kesoku.store.db import PAGE_SIZE, migrations
from kesoku.vocab.errors import StoreError
from kesoku.vocab.model import Kind, Metadata, Outcome, Role, Status, in_turn, user_text


def test_a_new_database_is_migrated_to_the_newest_schema(store: Store, db_path: Path) -> None:
    newest = migrations()[-1].version
    assert schema_version(store._conn) == newest
    again = Store(db_path)  # opening again applies nothing twice
    assert schema_version(again._conn) == newest
    again.close()


def test_open_user_messages_read_only_the_open_ones_index(store: Store, tmp_path: Path) -> None:
    a = store.create_session("terminal", "a", workspace_root=tmp_path)
    b = store.create_session("terminal", "b", workspace_root=tmp_path)
    posted = [i.message for i in store.insert_messages([user_text(s.id, "q") for s in (a, b, a)])]
    store.insert_messages([in_turn(posted[0], Role.ASSISTANT, Kind.TEXT, "answer")])
    store.set_status([posted[0].id], Status.DONE)
    store.set_status([posted[1].id], Status.PROCESSING)
    last = store.last_message_id()
    assert store.open_user_messages(up_to=last) == [store.get_message(m.id) for m in posted[1:]]
    assert store.open_user_messages(up_to=last, session_id=a.id) == [posted[2]]
    assert store.open_user_messages(up_to=posted[1].id) == [store.get_message(posted[1].id)]
    # Neither reads the table or a session along another index: only the open messages' entries.
    where = "role = 'user' AND status IN ('pending', 'processing') AND id <= ?"
    for query, bindings in (
        (f"SELECT id FROM messages WHERE {where} ORDER BY id", (last,)),
        (f"SELECT id FROM messages WHERE session_id = ? AND {where} ORDER BY id", (a.id, last)),
    ):
        plan = [row[-1] for row in store._conn.execute(f"EXPLAIN QUERY PLAN {query}", bindings)]
        assert "USING COVERING INDEX messages_open" in plan[0], plan
    entries = store._conn.execute(
        "SELECT count(*) FROM messages INDEXED BY messages_open"
        " WHERE role = 'user' AND status IN ('pending', 'processing')"
    ).fetchone()
    assert entries == (2,)  # the answer and the done question are not in it


def test_the_connection_is_wal_with_foreign_keys(store: Store) -> None:
    pragmas = {
        name: next(store._conn.execute(f"PRAGMA {name}"))[0]
        for name in ("journal_mode", "foreign_keys")
    }
    assert pragmas == {"journal_mode": "wal", "foreign_keys": 1}


def test_a_database_from_a_newer_kesoku_is_refused(store: Store, db_path: Path) -> None:
    store._conn.execute("PRAGMA user_version = 999")
    with pytest.raises(
        StoreError, match=r"newer Kesoku \(schema version 999; this one knows up to \d+\)"
    ):
        Store(db_path)


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "junk.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"junk\.db: not a Kesoku database"):
        Store(bad)


def test_sessions_are_unique_per_adapter_and_channel(store: Store, tmp_path: Path) -> None:
    a = store.create_session(
        "discord", "thread-1", workspace_root=tmp_path, created_at=5.0, title="t"
    )
    b = store.create_session("discord", "thread-1", workspace_root=tmp_path)
    c = store.create_session("gchat", "thread-1", workspace_root=tmp_path)
    assert a == b
    assert a.id != c.id
    assert a.workspace == str(tmp_path / a.id)
    assert a.created_at == 5.0
    assert store.get_session(a.id) == a
    assert store.find_session("gchat", "thread-1") == c
    assert [s.id for s in store.list_sessions(adapter="discord")] == [a.id]
    store.set_session_title(a.id, "new")
    assert store.get_session(a.id).title == "new"  # type: ignore[union-attr]


def test_insert_fills_ids_times_and_roots(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    [inserted] = store.insert_messages([user_text(s.id, "hi", ts=0)])
    root = inserted.message
    assert root.id > 0
    assert root.root_id == root.id
    assert root.ts > 0
    assert root.root_ts == root.ts
    assert store.get_message(root.id) == root


def test_a_duplicate_external_id_returns_the_stored_message(store: Store, tmp_path: Path) -> None:
    s = store.create_session("discord", "c", workspace_root=tmp_path)
    first, again = store.insert_messages(
        [user_text(s.id, "a", external_id="m1"), user_text(s.id, "b", external_id="m1")]
    )
    assert first.new
    assert not again.new
    assert again.message == first.message
    other = store.create_session("gchat", "c", workspace_root=tmp_path)
    [elsewhere] = store.insert_messages([user_text(other.id, "a", external_id="m1")])
    assert elsewhere.new  # unique per adapter, not globally


def test_a_batch_naming_an_unknown_session_writes_nothing(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    with pytest.raises(UnknownSessionError, match="no session 'ghost'"):
        store.insert_messages([user_text(s.id, "kept?"), user_text("ghost", "x")])
    assert store.history(s.id) == []


def test_history_keeps_a_turn_together(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    [a] = [i.message for i in store.insert_messages([user_text(s.id, "turn A", ts=10.0)])]
    call = in_turn(
        a, Role.ASSISTANT, Kind.TOOL_CALL, "", metadata=Metadata(tool_name="sh"), ts=11.0
    )
    [call] = [i.message for i in store.insert_messages([call])]
    [b] = [i.message for i in store.insert_messages([user_text(s.id, "turn B", ts=20.0)])]
    result_meta = Metadata(tool_name="sh", outcome=Outcome.COMPLETED)
    late = in_turn(
        a, Role.TOOL, Kind.TOOL_RESULT, "done", parent_id=call.id, metadata=result_meta, ts=30.0
    )
    [late] = [i.message for i in store.insert_messages([late])]
    assert late.id > b.id
    assert [m.content for m in store.history(s.id)] == ["turn A", "", "done", "turn B"]


def test_messages_after_filters_in_sql(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    t = store.create_session("discord", "c", workspace_root=tmp_path)
    ids = [i.message.id for i in store.insert_messages([user_text(s.id, str(n)) for n in range(5)])]
    store.insert_messages([user_text(t.id, "other")])
    only_s = MessageFilter.from_kwargs({"session_id": s.id, "role": Role.USER})
    assert [m.id for m in store.messages_after(ids[1], only_s, limit=2)] == ids[2:4]
    assert [
        m.content
        for m in store.messages_after(0, MessageFilter.from_kwargs({"adapter": "discord"}), limit=9)
    ] == ["other"]


def test_status_cursor_and_view_state(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    [m] = [i.message for i in store.insert_messages([user_text(s.id, "x")])]
    store.set_status([m.id], Status.PROCESSING)
    assert store.get_message(m.id).status is Status.PROCESSING  # type: ignore[union-attr]
    assert store.get_cursor("dispatcher") is None
    store.set_cursor("dispatcher", 3)
    store.set_cursor("dispatcher", m.id)
    assert store.get_cursor("dispatcher") == m.id
    assert store.latest_view_state(s.id) is None
    store.add_view_state(s.id, msgspec.json.encode({"evict_before": 1}))
    store.add_view_state(s.id, msgspec.json.encode({"evict_before": 2}))
    assert msgspec.json.decode(store.latest_view_state(s.id) or b"") == {"evict_before": 2}


def test_deleting_a_session_cascades(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    store.insert_messages([user_text(s.id, "x")])
    store.add_view_state(s.id, b"{}")
    assert store.delete_session(s.id) == s
    assert store.get_session(s.id) is None
    assert store.history(s.id) == []
    assert store.latest_view_state(s.id) is None
    assert store.delete_session(s.id) is None


def test_ids_are_never_reused_after_a_delete(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    [m] = [i.message for i in store.insert_messages([user_text(s.id, "x")])]
    store.delete_session(s.id)
    s2 = store.create_session("terminal", "c2", workspace_root=tmp_path)
    [n] = [i.message for i in store.insert_messages([user_text(s2.id, "y")])]
    assert n.id > m.id
    assert store.last_message_id() >= n.id


def test_a_write_waits_for_another_connections_lock(
    store: Store, db_path: Path, tmp_path: Path
) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    holder = Store(db_path)
    holder._conn.execute("BEGIN IMMEDIATE")  # another writer holds the write lock...
    release = threading.Timer(0.3, holder._conn.execute, ("COMMIT",))
    release.start()  # ...for 0.3 s; the busy timeout (5 s) makes our insert wait instead of failing
    try:
        [inserted] = store.insert_messages([user_text(s.id, "waited")])
    finally:
        release.join()
        holder.close()
    assert inserted.new


def test_self_rooted_messages_read_back_their_own_id_as_root(store: Store, tmp_path: Path) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    batch = store.insert_messages([user_text(s.id, "a"), user_text(s.id, "b", external_id="x")])
    [again] = store.insert_messages([user_text(s.id, "b again", external_id="x")])  # consumes an id
    [single] = store.insert_messages([user_text(s.id, "c")])
    assert not again.new
    for stored in [*(i.message for i in batch), single.message]:
        assert stored.root_id == stored.id
        assert store.get_message(stored.id) == stored


def test_a_self_root_stays_right_after_sqlite_sequence_was_edited(
    store: Store, tmp_path: Path
) -> None:
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    store.insert_messages([user_text(s.id, str(i)) for i in range(5)])
    store._conn.execute("UPDATE sqlite_sequence SET seq = 1 WHERE name = 'messages'")  # by hand
    [m] = [i.message for i in store.insert_messages([user_text(s.id, "after")])]
    assert m.id == 6  # AUTOINCREMENT takes the larger of the sequence and the largest id
    assert m.root_id == m.id
    assert store.get_message(m.id) == m


def test_a_new_database_uses_small_pages(store: Store, db_path: Path) -> None:
    assert store._pragma_int("page_size") == PAGE_SIZE
    assert store._checkpointer is not None
    store._checkpointer.close()  # leaving WAL mode needs the only connection
    store._conn.execute("PRAGMA journal_mode = DELETE")  # outside WAL a VACUUM could change it...
    store._conn.execute("PRAGMA page_size = 4096")
    store._conn.execute("VACUUM")
    store._conn.execute("PRAGMA journal_mode = WAL")
    store.close()
    again = Store(db_path)  # ...but opening an existing database keeps its page size
    assert again._pragma_int("page_size") == 4096
    again.close()


async def test_the_wal_is_checkpointed_in_the_background(store: Store, tmp_path: Path) -> None:
    checkpointer = store._checkpointer
    assert checkpointer is not None
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    store.insert_messages([user_text(s.id, str(i)) for i in range(3)])
    with trio.fail_after(10):  # a hang guard: the thread checkpoints about 50 ms after a write
        # Polling: the checkpoint thread has no way to set a trio.Event.
        while not (checkpointer.runs and checkpointer.last[0] == checkpointer.last[1] > 0):  # noqa: ASYNC110
            await trio.sleep(0.01)


def test_the_wal_stays_bounded_under_sustained_writes(db_path: Path, tmp_path: Path) -> None:
    limit = 200  # pages; a commit here writes 3 or 4, so 3,000 commits would make some 10,000
    store = Store(db_path, wal_limit_pages=limit)
    assert store._checkpointer is not None
    # Only the safety net: a background checkpoint in progress would let the WAL overshoot by a
    # timing-dependent amount (the commits written meanwhile), which this test could not bound.
    store._checkpointer.close()
    wal = Path(f"{db_path}-wal")
    s = store.create_session("terminal", "c", workspace_root=tmp_path)
    frame = store._pragma_int("page_size") + 24  # a WAL frame is a page and its header
    largest = 0
    try:
        for i in range(3_000):
            store.insert_messages([user_text(s.id, f"message {i}")])
            largest = max(largest, wal.stat().st_size)
    finally:
        store.close()
    # the limit plus the frames of the commit that reached it
    assert largest <= 32 + (limit + 10) * frame
    assert not wal.exists()  # the last connection to close checkpoints and removes it


def test_close_stops_the_checkpoint_thread(db_path: Path) -> None:
    store = Store(db_path)
    checkpointer = store._checkpointer
    assert checkpointer is not None
    assert checkpointer.alive
    store.close()
    assert not checkpointer.alive


def test_an_in_memory_store_has_no_checkpoint_thread() -> None:
    store = Store(":memory:")
    assert store._checkpointer is None
    store.close()
