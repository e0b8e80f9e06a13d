-- Migration 2: one row that /readyz rewrites through the writer, so "ready" means a write
-- just committed (the writer is alive, the database takes writes, the disk has room).
CREATE TABLE hookledger_heartbeat (
    id BIGINT PRIMARY KEY CHECK (id = 1),
    at BIGINT NOT NULL
);
