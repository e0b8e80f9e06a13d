-- The stripe-billing handler's tables, migration 0001_billing (SQLite), recorded in
-- hookledger_handler_migrations. Run when a source's `handlers` names stripe-billing, before the
-- app's migrations. Times are integer Unix seconds.
--
-- Until this migration, hookledger's first migration (schema.sql, as released) made these
-- tables in every database. A database made then keeps them, rows and all: each is created
-- only if it is missing, with the columns and types of that release, so that this migration
-- changes nothing there and makes the same tables in a new database.

-- Snapshot state: written only by the guarded upsert of src/stripe/billing.rs, which keeps the
-- row with the greatest (provider_updated_at, event_rank).
CREATE TABLE IF NOT EXISTS subscriptions (
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
CREATE TABLE IF NOT EXISTS invoice_payments (
    stripe_invoice_id TEXT PRIMARY KEY,
    account_id        TEXT NOT NULL,
    amount_paid       INTEGER NOT NULL,
    event_id          TEXT NOT NULL
);

-- The app's accounts, created on first use.
CREATE TABLE IF NOT EXISTS accounts (
    id         TEXT PRIMARY KEY,
    credits    INTEGER NOT NULL DEFAULT 0,
    plan_until INTEGER
);
