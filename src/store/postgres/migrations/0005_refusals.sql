-- Migration 5: refused webhook requests, kept so that /status can say why a source's requests
-- are refused after a restart too. Written by the refusal recorder (src/refusals.rs) once a
-- second at most: a count per source, reason and minute (added to, so a flood is counted
-- exactly in a bounded number of rows), and apart from it the last few distinct messages per
-- source and reason. Pruned by age in the same write. Never a secret nor a body: a message is
-- hookledger's own text about a client's fault, or a server error's kind alone.
CREATE TABLE hookledger_refusals (
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,
    minute  BIGINT NOT NULL,   -- Unix seconds / 60
    count   BIGINT NOT NULL,
    last_at BIGINT NOT NULL,   -- Unix seconds of the last one counted
    PRIMARY KEY (source, reason, minute)
);
CREATE TABLE hookledger_refusal_messages (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,
    at      BIGINT NOT NULL,
    message TEXT NOT NULL,
    -- A message seen again moves forward instead of taking another row.
    UNIQUE (source, reason, message)
);
CREATE INDEX hookledger_refusal_messages_at ON hookledger_refusal_messages (source, reason, at);
-- /status (a source's last event, its events per minute) and the events browser (a source's
-- events, newest first, paged by (received_at, event_id)) read by source and time. Built in
-- this migration's transaction (the runner has no step outside one), which holds inserts into
-- webhook_events while it builds: on a large ledger, build it beforehand with CREATE INDEX
-- CONCURRENTLY and the same name and columns, and this is then a no-op.
CREATE INDEX IF NOT EXISTS webhook_events_source_received ON webhook_events (source, received_at, event_id);
