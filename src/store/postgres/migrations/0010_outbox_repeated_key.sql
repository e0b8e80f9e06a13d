-- Migration 10: an effect's outbox row whose (kind, source, key) is already in the outbox is
-- never refused (it failed the whole event with a unique violation: a 500 the provider's
-- retries cannot cure). Rows of `forward` are hookledger's own, one per event, and pass
-- untouched.
-- - Of a coalescing kind (the kinds the worker writes into hookledger_outbox_coalescing at
--   start): the newer row supersedes the one of that key. That row is queued again with the
--   newer payload, event type and coalesce_key, its attempts from 0: waiting, it is delivered
--   once, with the newer payload; done, dead or superseded, it is delivered again; being
--   attempted (leased), the attempt's result is not recorded (`queued` moved on, as with a
--   replay) and it is attempted again, with the newer payload, once its lease ended.
-- - Of any other kind: once per key, as `ON CONFLICT DO NOTHING` always made it; the insert
--   is ignored.
-- Two instances queueing one key at once: the second waits for the first one's commit (a
-- transaction-scoped lock on the key), then sees its row.
CREATE TABLE hookledger_outbox_coalescing (kind TEXT PRIMARY KEY);
CREATE FUNCTION hookledger_outbox_repeated_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended(NEW.kind || chr(1) || NEW.source || chr(1) || NEW.key, 0));
    IF NOT EXISTS (SELECT 1 FROM outbox
                   WHERE kind = NEW.kind AND source = NEW.source AND key = NEW.key) THEN
        RETURN NEW;
    END IF;
    UPDATE outbox SET payload = NEW.payload, payload_ref = NEW.payload_ref,
        event_type = NEW.event_type, coalesce_key = NEW.coalesce_key, status = 'pending',
        attempts = 0, next_attempt_at = NEW.next_attempt_at, last_error = NULL,
        done_at = NULL, queued = queued + 1
    WHERE kind = NEW.kind AND source = NEW.source AND key = NEW.key
      AND kind IN (SELECT kind FROM hookledger_outbox_coalescing);
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_repeated_key BEFORE INSERT ON outbox
    FOR EACH ROW WHEN (NEW.kind <> 'forward') EXECUTE FUNCTION hookledger_outbox_repeated_key();
-- A kind's concurrency holds across instances (store/postgres/due.rs): each poll counts the
-- kind's rows that live instances hold leased, a search of this index (the rows leased now,
-- few) rather than of every pending row.
CREATE INDEX IF NOT EXISTS outbox_leased ON outbox (kind)
    WHERE status = 'pending' AND leased_until IS NOT NULL;
