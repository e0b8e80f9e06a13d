-- Migration 8: coalescing. A kind with `coalesce = true` keeps only its newest queued row of a
-- source (and `coalesce_key`, when the effect that queued the row set one); the older queued
-- ones are kept with status `superseded`. SQLite cannot change a CHECK constraint, so the
-- table is rebuilt, in this migration's transaction, keeping every row; its index and the
-- triggers of migration 6 go with the old table and are made again.
CREATE TABLE outbox_v8 (
    id              INTEGER PRIMARY KEY,
    kind            TEXT NOT NULL,
    source          TEXT NOT NULL,
    key             TEXT NOT NULL,
    event_type      TEXT,             -- of the event a `forward` row delivers
    payload         BLOB NOT NULL,
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'done', 'dead', 'superseded')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL DEFAULT (unixepoch()),
    last_error      TEXT,
    created_at      INTEGER NOT NULL DEFAULT (unixepoch()),
    done_at         INTEGER,          -- delivered, or superseded, at
    queued          INTEGER NOT NULL DEFAULT 0,
    leased_until    INTEGER,
    output          TEXT,
    coalesce_key    TEXT,             -- rows of a coalescing kind coalesce per source and this
    UNIQUE (kind, source, key)
);
INSERT INTO outbox_v8 (id, kind, source, key, event_type, payload, status, attempts,
                       next_attempt_at, last_error, created_at, done_at, queued, leased_until,
                       output)
    SELECT id, kind, source, key, event_type, payload, status, attempts, next_attempt_at,
           last_error, created_at, done_at, queued, leased_until, output
    FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_v8 RENAME TO outbox;
CREATE INDEX outbox_due ON outbox (status, next_attempt_at);
CREATE TRIGGER outbox_text_identity_insert BEFORE INSERT ON outbox
WHEN typeof(new.kind) = 'blob' OR typeof(new.source) = 'blob' OR typeof(new.key) = 'blob'
  OR typeof(new.event_type) = 'blob'
BEGIN
    SELECT RAISE(ABORT, 'outbox: kind, source, key and event_type must be text, not a blob');
END;
CREATE TRIGGER outbox_text_identity_update BEFORE UPDATE OF kind, source, key, event_type ON outbox
WHEN typeof(new.kind) = 'blob' OR typeof(new.source) = 'blob' OR typeof(new.key) = 'blob'
  OR typeof(new.event_type) = 'blob'
BEGIN
    SELECT RAISE(ABORT, 'outbox: kind, source, key and event_type must be text, not a blob');
END;
