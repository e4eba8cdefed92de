-- 0002: taint sources. Content from outside the workspace's trust entered a session (a file outside
-- the workspace, an attachment, a URL, an MCP server); while a session has any, risky actions ask the
-- user first. Append-only and deduplicated by (kind, label); deleted with the session.
CREATE TABLE taint (
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    kind        TEXT NOT NULL,                 -- 'file', 'attachment', 'url', 'mcp'
    label       TEXT NOT NULL,                 -- the path, file name, URL or server name
    created_at  REAL NOT NULL,
    PRIMARY KEY (session_id, kind, label)
) STRICT;
