-- The app's billing tables, in PostgreSQL's dialect (../migrations/001_billing.sql is the
-- SQLite one). hookledger's own schema has created these same tables since its first release
-- (for the built-in stripe-billing handler), so each is created only if missing.

-- Snapshot state, guarded by (provider_updated_at, event_rank): the newest event wins.
CREATE TABLE IF NOT EXISTS subscriptions (
    id                  TEXT PRIMARY KEY,
    customer_id         TEXT NOT NULL,
    account_id          TEXT,
    status              TEXT NOT NULL,
    provider_updated_at BIGINT NOT NULL,
    event_rank          BIGINT NOT NULL,
    event_id            TEXT NOT NULL
);

-- The second guard: one row per invoice, whichever event reports the payment first.
CREATE TABLE IF NOT EXISTS invoice_payments (
    stripe_invoice_id TEXT PRIMARY KEY,
    account_id        TEXT NOT NULL,
    amount_paid       BIGINT NOT NULL,
    event_id          TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS accounts (
    id         TEXT PRIMARY KEY,
    credits    BIGINT NOT NULL DEFAULT 0,
    plan_until BIGINT
);

CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
