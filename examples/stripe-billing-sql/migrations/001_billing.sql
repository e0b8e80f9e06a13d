-- The app's billing tables. hookledger's own schema has created these same tables since its
-- first release (for the built-in stripe-billing handler), so each is created only if missing.

-- Snapshot state, guarded by (provider_updated_at, event_rank): the newest event wins.
CREATE TABLE IF NOT EXISTS subscriptions (
    id                  TEXT PRIMARY KEY,
    customer_id         TEXT NOT NULL,
    account_id          TEXT,
    status              TEXT NOT NULL,
    provider_updated_at INTEGER NOT NULL,
    event_rank          INTEGER NOT NULL,
    event_id            TEXT NOT NULL
);

-- The second guard: one row per invoice, whichever event reports the payment first.
CREATE TABLE IF NOT EXISTS invoice_payments (
    stripe_invoice_id TEXT PRIMARY KEY,
    account_id        TEXT NOT NULL,
    amount_paid       INTEGER NOT NULL,
    event_id          TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS accounts (
    id         TEXT PRIMARY KEY,
    credits    INTEGER NOT NULL DEFAULT 0,
    plan_until INTEGER
);

CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
