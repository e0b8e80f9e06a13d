-- Migration 3: the ledger key becomes (source, event_id), so two sources may send the same
-- event id; outbox rows name their source and their event's type too, and an effect can queue
-- a row of its own with just (kind, source, key, payload): the rest has defaults. SQLite cannot alter a primary key or a
-- unique constraint, so both tables are rebuilt, in this migration's transaction, keeping
-- every row (all of them came from the one source of earlier versions, `stripe`).

CREATE TABLE webhook_events_v3 (
    source      TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    created     INTEGER,
    received_at INTEGER NOT NULL,
    payload     BLOB,             -- the verified raw body; cleared after retention.payload_days
    PRIMARY KEY (source, event_id)
);
INSERT INTO webhook_events_v3 (source, event_id, event_type, created, received_at, payload)
    SELECT source, event_id, event_type, created, received_at, payload FROM webhook_events;
DROP TABLE webhook_events;
ALTER TABLE webhook_events_v3 RENAME TO webhook_events;
CREATE INDEX webhook_events_received_at ON webhook_events (received_at);
-- Retention clears payloads by age; claims without one (kept far longer) are not in it.
CREATE INDEX webhook_events_payload_age ON webhook_events (received_at) WHERE payload IS NOT NULL;

CREATE TABLE outbox_v3 (
    id              INTEGER PRIMARY KEY,
    kind            TEXT NOT NULL,
    source          TEXT NOT NULL,
    key             TEXT NOT NULL,
    event_type      TEXT,             -- of the event a `forward` row delivers
    payload         BLOB NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'done', 'dead')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT (unixepoch()),
    last_error      TEXT,
    created_at      INTEGER NOT NULL DEFAULT (unixepoch()),
    done_at         INTEGER,
    queued          INTEGER NOT NULL DEFAULT 0,
    UNIQUE (kind, source, key)
);
INSERT INTO outbox_v3 (id, kind, source, key, event_type, payload, status, attempts,
                       next_attempt_at, last_error, created_at, done_at, queued)
    SELECT id, kind, 'stripe', key,
           (SELECT event_type FROM webhook_events e WHERE e.source = 'stripe' AND e.event_id = key),
           payload, status, attempts, next_attempt_at, last_error, created_at, done_at, queued
    FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_v3 RENAME TO outbox;
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);
