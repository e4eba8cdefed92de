-- 0003: the spend ledger. One row per model call of any kind (a turn's step, a subagent's, a
-- compaction summary), written by the process that made it, so spend caps count every process on
-- the database and survive restarts. No foreign key: deleting a session must not give back what it
-- spent today (a day cap would reset).
CREATE TABLE spend (
    id                  INTEGER PRIMARY KEY,
    ts                  REAL NOT NULL,             -- UNIX seconds, when the call ended
    session_id          TEXT NOT NULL,
    adapter             TEXT NOT NULL,             -- the session's adapter (chatbot_id)
    budget_group        TEXT NOT NULL,             -- the channel entry whose caps apply, or ''
    kind                TEXT NOT NULL,             -- 'turn', 'subagent', 'compaction'
    provider            TEXT NOT NULL,
    model               TEXT NOT NULL,
    input_tokens        INTEGER NOT NULL,          -- cached and cache-written tokens included
    output_tokens       INTEGER NOT NULL,          -- thinking included
    cached_tokens       INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    thinking_tokens     INTEGER NOT NULL,
    cost_usd            REAL                       -- NULL: no price known for the model
) STRICT;
CREATE INDEX spend_session ON spend (session_id);
CREATE INDEX spend_ts ON spend (ts);

-- Calls made before the ledger existed, from the usage stored on messages (model unknown).
INSERT INTO spend (ts, session_id, adapter, budget_group, kind, provider, model, input_tokens,
                   output_tokens, cached_tokens, cache_write_tokens, thinking_tokens, cost_usd)
SELECT m.ts, m.session_id, m.adapter, '', 'turn', '', '',
       coalesce(json_extract(m.metadata, '$.usage.input_tokens'), 0),
       coalesce(json_extract(m.metadata, '$.usage.output_tokens'), 0),
       coalesce(json_extract(m.metadata, '$.usage.cached_tokens'), 0),
       0,
       coalesce(json_extract(m.metadata, '$.usage.thinking_tokens'), 0),
       NULL
FROM messages AS m
WHERE json_extract(m.metadata, '$.usage') IS NOT NULL;
