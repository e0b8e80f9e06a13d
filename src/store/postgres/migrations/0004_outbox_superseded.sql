-- Migration 4: coalescing. A kind with `coalesce = true` keeps only its newest queued row of a
-- source (and `coalesce_key`, when the effect that queued the row set one); the older queued
-- ones are kept with status `superseded`.
ALTER TABLE outbox DROP CONSTRAINT IF EXISTS outbox_status_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_status_check
    CHECK (status IN ('pending', 'done', 'dead', 'superseded'));
ALTER TABLE outbox ADD COLUMN coalesce_key TEXT;
