-- 0001: sessions, the message log, listener cursors and compaction view states.
-- Migrations are append-only: never edit a released file, add 0002_*.sql instead.

CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    adapter     TEXT NOT NULL,                 -- the adapter's chatbot_id
    channel_id  TEXT NOT NULL,                 -- the platform's thread or space
    created_at  REAL NOT NULL,                 -- UNIX seconds
    title       TEXT,
    llm         TEXT,
    workspace   TEXT NOT NULL,
    parent_id   TEXT REFERENCES sessions (id) ON DELETE SET NULL,
    metadata    BLOB NOT NULL,                 -- msgspec JSON
    UNIQUE (adapter, channel_id)
) STRICT;

-- AUTOINCREMENT: an id is never reused, even after the newest row is deleted, so a listener's
-- cursor (the last id it saw) can never skip a later message.
CREATE TABLE messages (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    role        TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'system')),
    kind        TEXT NOT NULL CHECK (kind IN ('text', 'thought', 'tool_call', 'tool_result')),
    status      TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'done', 'interrupted', 'failed')),
    sender      TEXT NOT NULL,
    content     TEXT NOT NULL,
    root_id     INTEGER NOT NULL,
    parent_id   INTEGER,
    ts          REAL NOT NULL,
    root_ts     REAL NOT NULL,
    metadata    BLOB NOT NULL,                 -- msgspec JSON, defaults omitted
    adapter     TEXT NOT NULL,                 -- copied from the session: dedupe key with external_id
    external_id TEXT
) STRICT;

-- History is read in logical order: a turn's messages stay together (DESIGN §4).
CREATE INDEX messages_history ON messages (session_id, root_ts, ts, id);
CREATE UNIQUE INDEX messages_external ON messages (adapter, external_id) WHERE external_id IS NOT NULL;

CREATE TABLE cursors (
    name        TEXT PRIMARY KEY,              -- e.g. 'dispatcher', 'adapter:discord'
    message_id  INTEGER NOT NULL,
    updated_at  REAL NOT NULL
) STRICT;

-- Compaction views: append-only, the newest row per session wins.
CREATE TABLE view_states (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    created_at  REAL NOT NULL,
    data        BLOB NOT NULL                  -- msgspec JSON
) STRICT;
CREATE INDEX view_states_session ON view_states (session_id, id);
