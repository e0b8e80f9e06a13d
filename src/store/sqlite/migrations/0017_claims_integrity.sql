-- Migration 17: the saved filter of keys (migration 14) is checked, not trusted
-- (store/sqlite/claims.rs, "What a saved filter must match").
--
-- The ledger's identity: random bytes made with it (here, once), hashed into every filter
-- saved of it, so that a filter row copied from another database is refused. `rewrites`
-- counts the claims other code inserted below an id already used, or whose key it rewrote:
-- the writer reads it when another connection committed, and builds its filter again when
-- it moved.
CREATE TABLE hookledger_ledger (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    identity BLOB NOT NULL,
    rewrites INTEGER NOT NULL DEFAULT 0
);
INSERT INTO hookledger_ledger (id, identity) VALUES (1, randomblob(16));

-- A saved filter now carries a checksum (SHA-256 over the identity, its parameters, the
-- ledger's summary at the save and its bits) and `stale`: why a write since invalidated it
-- (set by the triggers below, NULL while it is whole). One saved by the release before has
-- neither: dropped, and the next start builds the filter.
DROP TABLE hookledger_claims_filter;
CREATE TABLE hookledger_claims_filter (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    seen           INTEGER NOT NULL,
    min_id         INTEGER NOT NULL,
    -- sqlite_sequence's value for the ledger at the save (the highest id ever used).
    sequence       INTEGER NOT NULL,
    schema_version INTEGER NOT NULL,
    format         INTEGER NOT NULL,
    hashes         INTEGER NOT NULL,
    size_bits      INTEGER NOT NULL,
    capacity       INTEGER NOT NULL,
    keys           INTEGER NOT NULL,
    bits           BLOB NOT NULL,
    checksum       BLOB NOT NULL,
    stale          TEXT,
    saved_at       INTEGER NOT NULL
);

-- Writes by any connection (the CLI, a `sqlite3` shell, another program) that a filter
-- catching up on ids past the highest it saw would miss. hookledger's own claims take the
-- next id (above sqlite_sequence's) and change no key: these triggers do nothing for them
-- but one look at sqlite_sequence.
--
-- A claim inserted with an id at or below the highest ever used (into a hole, or over a
-- deleted claim's id).
CREATE TRIGGER hookledger_claim_below_sequence AFTER INSERT ON webhook_events
WHEN NEW.id <= (SELECT seq FROM sqlite_sequence WHERE name = 'webhook_events')
BEGIN
    UPDATE hookledger_ledger SET rewrites = rewrites + 1;
    UPDATE hookledger_claims_filter
        SET stale = coalesce(stale, 'claim ' || NEW.id || ' inserted below an id used before');
END;
-- A claim's key or id rewritten in place.
CREATE TRIGGER hookledger_claim_rewritten AFTER UPDATE OF id, source, event_id ON webhook_events
WHEN NEW.id IS NOT OLD.id OR NEW.source IS NOT OLD.source OR NEW.event_id IS NOT OLD.event_id
BEGIN
    UPDATE hookledger_ledger SET rewrites = rewrites + 1;
    UPDATE hookledger_claims_filter
        SET stale = coalesce(stale, 'the key of claim ' || OLD.id || ' rewritten');
END;
-- A claim deleted while a filter is saved (harmless to the filter, a key it holds in vain, but
-- the ledger it describes is no longer the one it was saved of).
CREATE TRIGGER hookledger_claim_deleted AFTER DELETE ON webhook_events
WHEN EXISTS (SELECT 1 FROM hookledger_claims_filter)
BEGIN
    UPDATE hookledger_claims_filter
        SET stale = coalesce(stale, 'claim ' || OLD.id || ' deleted');
END;
