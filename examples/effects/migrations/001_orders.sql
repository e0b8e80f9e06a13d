-- The app's tables that ../hookledger.toml's effects write (postgres/migrations/ is the same
-- in PostgreSQL's dialect). Applied once, at start-up, before the effects are checked.

-- One order per invoice: the second key, so that invoice.paid and invoice.payment_succeeded
-- for one invoice (two events, each claimed once) make one order.
CREATE TABLE orders (
    invoice_id TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL,
    amount     INTEGER NOT NULL
);

-- Running totals; the effect adds each new order's amount to 'paid'.
CREATE TABLE totals (
    name   TEXT PRIMARY KEY,
    amount INTEGER NOT NULL
);
INSERT INTO totals (name, amount) VALUES ('paid', 0);
