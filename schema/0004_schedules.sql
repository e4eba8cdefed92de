-- 0004: schedules. Each run posts its prompt as a user message whose external id is the schedule's
-- name and planned time, so the message log's dedupe makes a run happen once across restarts and
-- processes (ARCHITECTURE.md, "Schedules").
CREATE TABLE schedules (
    name             TEXT PRIMARY KEY,
    kind             TEXT NOT NULL CHECK (kind IN ('every', 'cron', 'at')),
    spec             TEXT NOT NULL,       -- seconds (every), the expression (cron), UNIX time (at)
    tz               TEXT NOT NULL,       -- IANA zone of a cron; '' = local
    prompt           TEXT NOT NULL,
    target           TEXT NOT NULL,       -- 'session:<id>', 'discord:<id>', 'gchat:<space>', 'new'
    llm              TEXT,
    missed           TEXT NOT NULL CHECK (missed IN ('catchup', 'skip')),
    enabled          INTEGER NOT NULL,
    created_at       REAL NOT NULL,
    created_by       TEXT NOT NULL,       -- 'cli', 'config' or the session of the agent that made it
    next_run         REAL,                -- NULL: no run left
    last_run         REAL,
    last_message_id  INTEGER,
    last_note        TEXT NOT NULL
) STRICT;
CREATE INDEX schedules_due ON schedules (next_run) WHERE enabled AND next_run IS NOT NULL;
