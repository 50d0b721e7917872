-- Links of the example service and the audit trail written in the same
-- transaction as each link (so a cancellation can fall between the two).
CREATE TABLE links (
    code       TEXT PRIMARY KEY,
    url        TEXT NOT NULL,
    hits       BIGINT NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);

CREATE TABLE link_audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    code   TEXT NOT NULL,
    action TEXT NOT NULL,
    at     TEXT NOT NULL
);
