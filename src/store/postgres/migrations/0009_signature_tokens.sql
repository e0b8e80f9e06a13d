-- Migration 9: single-use tokens of signatures that sign no event (Mailgun signs only a
-- timestamp and a token). A token is claimed in the event's transaction, after the event's
-- own claim: a second event carrying a token already used is a replayed signature, refused.
-- Pruned with the claims (store/retention.rs).
CREATE TABLE hookledger_signature_tokens (
    source  TEXT NOT NULL,
    token   TEXT NOT NULL,
    seen_at BIGINT NOT NULL,
    PRIMARY KEY (source, token)
);
CREATE INDEX hookledger_signature_tokens_seen ON hookledger_signature_tokens (seen_at);
