-- hookledger schema, migration 1 (PRAGMA user_version = 1): the core's tables.
-- Later migrations are appended in src/store/sqlite/migrations/ (and listed in
-- src/store/sqlite/mod.rs). Times are integer Unix seconds unless a name says otherwise.
--
-- The tables of a built-in handler are not here: the handler owns them, in migrations of its
-- own run when a source names it (stripe-billing's subscriptions, invoice_payments and
-- accounts: src/stripe/migrations/sqlite/). This file as released also created those three;
-- a database made then keeps them (migrations are keyed by number and never run again, and no
-- later one touches them), and the handler's migration finds them there. That text is
-- tests/fixtures/db/released-sqlite-0001-schema.sql. Apart from taking them out, this file
-- never changes: every later migration expects exactly what it makes.

-- The dedupe ledger. The primary key is the claim: INSERT OR IGNORE decides whether an
-- event is new, in the same transaction as its effects.
CREATE TABLE webhook_events (
    event_id    TEXT PRIMARY KEY,
    event_type  TEXT NOT NULL,
    source      TEXT NOT NULL,
    created     INTEGER,
    received_at INTEGER NOT NULL,
    payload     BLOB              -- the verified raw body, for inspection and replay
);
-- Retention deletes by age.
CREATE INDEX webhook_events_received_at ON webhook_events (received_at);

-- External effects, written in the same transaction as the claim and delivered after commit.
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY,
    kind            TEXT NOT NULL,
    key             TEXT NOT NULL,
    payload         BLOB NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'done', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    done_at         INTEGER,
    UNIQUE (kind, key)
);
-- The worker polls pending rows that are due; retention deletes old done rows.
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);

-- Counters for events that are worth knowing about but change no state (e.g. two
-- subscription updates in the same second: the first one wins, the tie is counted).
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
