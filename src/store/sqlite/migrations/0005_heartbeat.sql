-- Migration 5: one row that /readyz rewrites through the writer, so "ready" means a write
-- just committed (the writer is alive, the database takes writes, the disk has room).
CREATE TABLE hookledger_heartbeat (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    at INTEGER NOT NULL
);
