-- Migration 12: payloads compressed and stored once. Columns added, no table rebuilt: a row
-- written before has NULLs here and reads as it did.
-- How `payload` is stored: NULL or 0 the body as it came, 1 a zstd frame.
ALTER TABLE webhook_events ADD COLUMN payload_codec INTEGER;
-- The dictionary the frame was made with (hookledger_payload_dicts.id), if any.
ALTER TABLE webhook_events ADD COLUMN payload_dict INTEGER;
-- 1: the row delivers its event's payload, read from webhook_events when it is attempted
-- (`payload` is empty); NULL: `payload` is the row's own.
ALTER TABLE outbox ADD COLUMN payload_ref INTEGER;
-- One zstd dictionary per source, trained on its first payloads; never changed or deleted,
-- so every row that names one can be read. `id` is zstd's own id of the dictionary.
CREATE TABLE hookledger_payload_dicts (
    id         INTEGER PRIMARY KEY,
    source     TEXT NOT NULL UNIQUE,
    dict       BLOB NOT NULL,
    created_at INTEGER NOT NULL
);
