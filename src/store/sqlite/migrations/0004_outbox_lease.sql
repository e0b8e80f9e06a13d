-- Migration 4: the lease column the PostgreSQL store uses to give a due row to one of several
-- instances. SQLite has one server per file and never sets it; the outbox's writes (the same
-- SQL on both stores) clear it.
ALTER TABLE outbox ADD COLUMN leased_until INTEGER;
