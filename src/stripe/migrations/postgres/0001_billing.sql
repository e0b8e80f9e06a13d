-- The stripe-billing handler's tables, migration 0001_billing (PostgreSQL), recorded in
-- hookledger_handler_migrations: the same tables and guards as on SQLite
-- (../sqlite/0001_billing.sql). Run when a source's `handlers` names stripe-billing, before the
-- app's migrations, under the migration lock. Times are integer Unix seconds (BIGINT).
--
-- Until this migration, hookledger's migration 1 (0001_schema.sql, as released) made these
-- tables in every database. A database made then keeps them, rows and all: each is created
-- only if it is missing, with the columns and types of that release, so that this migration
-- changes nothing there and makes the same tables in a new database.

CREATE TABLE IF NOT EXISTS subscriptions (
    id                  TEXT PRIMARY KEY,
    customer_id         TEXT NOT NULL,
    account_id          TEXT,
    status              TEXT NOT NULL,
    provider_updated_at BIGINT NOT NULL,
    event_rank          BIGINT NOT NULL,
    event_id            TEXT NOT NULL
);
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
