-- Migration 5: refused webhook requests, kept so that /status can say why a source's requests
-- are refused after a restart too. Written by the refusal recorder (src/refusals.rs) once a
-- second at most, a row per source, reason and message with how many it stands for; pruned
-- by age and capped per source in the same write. Never a secret nor a body: the message is
-- hookledger's own text about the refusal.
CREATE TABLE hookledger_refusals (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source  TEXT NOT NULL,
    reason  TEXT NOT NULL,
    at      BIGINT NOT NULL,
    count   BIGINT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX hookledger_refusals_source_at ON hookledger_refusals (source, at);
-- /status (a source's last event, its events per minute) and the events browser (a source's
-- events, newest first) read by source and time.
CREATE INDEX webhook_events_source_received ON webhook_events (source, received_at);
