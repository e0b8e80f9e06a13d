-- Migration 2: how many times an outbox row was queued. `replay` and `outbox retry` add one;
-- the worker records an attempt only if the row still has the count it read, so an attempt
-- that began before a replay cannot mark the replayed row done.
ALTER TABLE outbox ADD COLUMN queued INTEGER NOT NULL DEFAULT 0;
