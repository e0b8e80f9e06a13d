-- Migration 11: the ledger's key index is clustered by blocks of ids, so the pages a claim
-- touches are the newest block's, whatever its event id. With the key `(source, event_id)` a
-- random id (a GitHub delivery UUID, a Svix message id) landed on a random page of an index
-- that outgrows memory: every claim read a cold page. A block is 2^16 ids (65,536 claims in
-- arrival order, about 4 MB of this index): by ids, not by the day received, so that a
-- ledger filled by other code with one received time for every claim still has a small
-- newest block; and small, so that a prune (oldest ids first) deletes within a few pages at
-- a time, as the claims of a day did.
--
-- The table is ordered by `id` (the order claims arrived: the old rowids are kept). A claim is
-- unique within its block by `webhook_events_key`; across blocks the claim path (the writer's
-- in-memory filter, then one seek a block: `store/sqlite/claims.rs`) decides, and every
-- reader by key seeks the same index once a block (`store/ledger.rs`, `by_key`).
-- AUTOINCREMENT: ids are never reused, so the writer catches up on claims other connections
-- add by reading the ids past the last it saw.
--
-- SQLite cannot drop a primary key: the table is rebuilt, in this migration's transaction (a
-- kill midway rolls all of it back; the next start runs it again from the start).

CREATE TABLE webhook_events_v11 (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    source      TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    created     INTEGER,
    received_at INTEGER NOT NULL,
    payload     BLOB              -- the verified raw body; cleared after retention.payload_days
);
INSERT INTO webhook_events_v11 (id, source, event_id, event_type, created, received_at, payload)
    SELECT rowid, source, event_id, event_type, created, received_at, payload
    FROM webhook_events ORDER BY rowid;
DROP TABLE webhook_events;
-- An app's view on the ledger (made by its `[schema] migrations`) names a table that is gone
-- for a moment: without the legacy rename, SQLite refuses the rename for that view.
PRAGMA legacy_alter_table = ON;
ALTER TABLE webhook_events_v11 RENAME TO webhook_events;
PRAGMA legacy_alter_table = OFF;
-- The claim's key, by block: a block's claims are together, the newest block's are the hot
-- pages. `id >> 16` here, in `store/ledger.rs` (`BLOCK_BITS`) and wherever a key is sought.
CREATE UNIQUE INDEX webhook_events_key ON webhook_events (id >> 16, source, event_id);
-- What migrations 1, 3 and 9 made, again (dropped with the old table).
CREATE INDEX webhook_events_received_at ON webhook_events (received_at);
CREATE INDEX webhook_events_payload_age ON webhook_events (received_at) WHERE payload IS NOT NULL;
CREATE INDEX webhook_events_source_received ON webhook_events (source, received_at, event_id);
