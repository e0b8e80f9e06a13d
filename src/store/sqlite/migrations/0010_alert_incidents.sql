-- Migration 10: `[[alert]]` incidents. One row per incident (an alert's cause on one
-- subject: the kind whose rows go dead, the source refused too often, '' for the backlog);
-- it is inserted with the outbox row of its message, and cleared with the other, so a
-- restart does not send either again.
CREATE TABLE alert_incidents (
    id         INTEGER PRIMARY KEY,
    alert      TEXT NOT NULL,
    cause      TEXT NOT NULL,
    subject    TEXT NOT NULL,
    opened_at  INTEGER NOT NULL,
    -- Last time an instance saw the cause still there (refusals: each keeps its own count).
    seen_at    INTEGER NOT NULL,
    cleared_at INTEGER
);
-- One open incident per alert, cause and subject: a second instance that sees the same
-- incident inserts nothing, and so queues no second message.
CREATE UNIQUE INDEX alert_incidents_open ON alert_incidents (alert, cause, subject)
    WHERE cleared_at IS NULL;
