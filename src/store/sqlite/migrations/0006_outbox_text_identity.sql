-- Migration 6: an outbox row's kind, source, key and event type are text. SQLite stores what it
-- is given, and an effect that queued a row with a BLOB there (`x'00'`) made the listings
-- (/metrics, /status, `outbox list`) fail. A CHECK cannot be added to a column without
-- rebuilding the table; these triggers refuse such a row instead (the effect's event fails, and
-- is undone alone). A number stays allowed: `json_extract` of a numeric id is one, and it is
-- read as its decimal text. Rows written before this migration are read defensively.
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
