-- hookledger schema, migration 1 (PRAGMA user_version = 1).
-- Later migrations are appended in src/db.rs; this file never changes once released.
-- Times are integer Unix seconds unless a name says otherwise.

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

-- Snapshot state: written only by the guarded upsert in src/state.rs, which keeps the row
-- with the greatest (provider_updated_at, event_rank).
CREATE TABLE subscriptions (
    id                  TEXT PRIMARY KEY,
    customer_id         TEXT NOT NULL,
    account_id          TEXT,
    status              TEXT NOT NULL,
    provider_updated_at INTEGER NOT NULL,
    event_rank          INTEGER NOT NULL,
    event_id            TEXT NOT NULL
);

-- The second guard: one row per invoice, whichever event (invoice.paid or
-- invoice.payment_succeeded, any event id) reports the payment first.
CREATE TABLE invoice_payments (
    stripe_invoice_id TEXT PRIMARY KEY,
    account_id        TEXT NOT NULL,
    amount_paid       INTEGER NOT NULL,
    event_id          TEXT NOT NULL
);

-- The app's accounts, created on first use.
CREATE TABLE accounts (
    id         TEXT PRIMARY KEY,
    credits    INTEGER NOT NULL DEFAULT 0,
    plan_until INTEGER
);

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
