-- Migration 14: the writer's in-memory filter of the ledger's keys (store/sqlite/claims.rs),
-- saved at a clean stop so the next start need not read every claim to build it again. At
-- most one row; the start that loads it deletes it in the same transaction, so a filter is
-- never loaded twice (after a crash the next start builds it from the ledger).
CREATE TABLE hookledger_claims_filter (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    -- The highest webhook_events.id in the filter: every claim up to it was added.
    seen           INTEGER NOT NULL,
    -- The lowest webhook_events.id at the save (0: none): a lower one at the load was
    -- inserted with an explicit id, unseen, and the filter is built again.
    min_id         INTEGER NOT NULL,
    -- PRAGMA user_version at the save: a migration since (which may rewrite the ledger)
    -- means building again.
    schema_version INTEGER NOT NULL,
    -- How keys become bits (bloom.rs FORMAT), the probes a key, the filter's size in bits,
    -- the keys it was sized for and the keys added: all must match this release's filter.
    format         INTEGER NOT NULL,
    hashes         INTEGER NOT NULL,
    size_bits      INTEGER NOT NULL,
    capacity       INTEGER NOT NULL,
    keys           INTEGER NOT NULL,
    -- The bits: 64-bit words, each little-endian, in order.
    bits           BLOB NOT NULL,
    saved_at       INTEGER NOT NULL
);
