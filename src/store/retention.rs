//! Retention's SQL: deletes in small batches, each a job of the writer.

use rusqlite::{params, Connection};

use crate::retention::BATCH_ROWS;

/// Deletes up to [`BATCH_ROWS`] ledger rows received before `cutoff`.
pub(super) fn delete_events_batch(tx: &Connection, cutoff: i64) -> rusqlite::Result<u64> {
    let n = tx
        .prepare_cached(
            "DELETE FROM webhook_events WHERE rowid IN
                 (SELECT rowid FROM webhook_events WHERE received_at < ?1 LIMIT ?2)",
        )?
        .execute(params![cutoff, BATCH_ROWS])?;
    Ok(n as u64)
}

/// Clears the payloads of up to [`BATCH_ROWS`] ledger rows received before `cutoff`; the
/// claims stay.
pub(super) fn clear_payloads_batch(tx: &Connection, cutoff: i64) -> rusqlite::Result<u64> {
    let n = tx
        .prepare_cached(
            "UPDATE webhook_events SET payload = NULL WHERE rowid IN
                 (SELECT rowid FROM webhook_events
                  WHERE received_at < ?1 AND payload IS NOT NULL LIMIT ?2)",
        )?
        .execute(params![cutoff, BATCH_ROWS])?;
    Ok(n as u64)
}

/// Deletes up to [`BATCH_ROWS`] done outbox rows delivered before `cutoff`.
pub(super) fn delete_outbox_batch(tx: &Connection, cutoff: i64) -> rusqlite::Result<u64> {
    let n = tx
        .prepare_cached(
            "DELETE FROM outbox WHERE id IN
                 (SELECT id FROM outbox WHERE status = 'done' AND done_at < ?1 LIMIT ?2)",
        )?
        .execute(params![cutoff, BATCH_ROWS])?;
    Ok(n as u64)
}
