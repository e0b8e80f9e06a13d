-- Migration 13: indexes for two reads of the pending rows that scanned the outbox.
-- Coalescing (store/outbox.rs `coalesce`) looks for a kind's pending rows and, for each, a
-- newer pending row of the same kind and source: both are a search of this index (the rowid,
-- the row's id, ends every SQLite index, so `newer.id > outbox.id` is a range of it).
CREATE INDEX outbox_coalesce ON outbox (kind, status, source);
-- The backlog alert (store/alerts.rs `oldest_pending`) reads the oldest pending row: the
-- first entry of this index, in (created_at, id) order with no sort.
CREATE INDEX outbox_pending_age ON outbox (status, created_at);
