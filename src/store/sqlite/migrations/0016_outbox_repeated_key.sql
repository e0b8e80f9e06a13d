-- Migration 16: an effect's outbox row whose (kind, source, key) is already in the outbox is
-- never refused (it failed the whole event with a UNIQUE error: a 500 the provider's retries
-- cannot cure). Rows of `forward` are hookledger's own, one per event, and pass untouched.
-- - Of a coalescing kind (the kinds the worker writes into hookledger_outbox_coalescing at
--   start): the newer row supersedes the one of that key. That row is queued again with the
--   newer payload, event type and coalesce_key, its attempts from 0: waiting, it is delivered
--   once, with the newer payload; done, dead or superseded, it is delivered again; being
--   attempted, the attempt's result is not recorded (`queued` moved on, as with a replay)
--   and it is attempted again, with the newer payload, once the running attempt ended.
-- - Of any other kind: once per key, as `ON CONFLICT DO NOTHING` always made it; the insert
--   is ignored.
CREATE TABLE hookledger_outbox_coalescing (kind TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TRIGGER outbox_repeated_key BEFORE INSERT ON outbox
WHEN new.kind <> 'forward' AND EXISTS (
    SELECT 1 FROM outbox WHERE kind = new.kind AND source = new.source AND key = new.key)
BEGIN
    UPDATE outbox SET payload = new.payload, payload_ref = new.payload_ref,
        event_type = new.event_type, coalesce_key = new.coalesce_key, status = 'pending',
        attempts = 0, next_attempt_at = new.next_attempt_at, last_error = NULL,
        done_at = NULL, queued = queued + 1
    WHERE kind = new.kind AND source = new.source AND key = new.key
      AND kind IN (SELECT kind FROM hookledger_outbox_coalescing);
    SELECT RAISE(IGNORE);
END;
