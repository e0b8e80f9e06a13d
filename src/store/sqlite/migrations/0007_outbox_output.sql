-- Migration 7: the last 4 KiB of a `[[delivery]]` command's stdout and stderr, on its row.
ALTER TABLE outbox ADD COLUMN output TEXT;
