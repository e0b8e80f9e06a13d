//! Retention's SQL, the same on every store: deletes in small batches, each a job of the
//! writer.

use crate::sql::{Dialect, Session, StoreError};

/// Rows deleted per writer job: small enough that one job takes milliseconds.
pub(crate) const BATCH_ROWS: i64 = 500;

/// How a batch names the ledger rows it picked: by the key on PostgreSQL, by `id` on SQLite
/// (where `(source, event_id)` alone is no index: the key index is by day first).
fn ledger_row(tx: &dyn Session) -> (&'static str, &'static str) {
    match tx.dialect() {
        Dialect::Postgres => ("(source, event_id)", "source, event_id"),
        Dialect::Sqlite => ("id", "id"),
    }
}

/// Deletes up to [`BATCH_ROWS`] ledger rows received before `cutoff`.
pub(crate) fn delete_events_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    let (row, columns) = ledger_row(tx);
    tx.execute(
        &format!(
            "DELETE FROM webhook_events WHERE {row} IN
                 (SELECT {columns} FROM webhook_events WHERE received_at < $1 LIMIT $2)"
        ),
        &[&cutoff, &BATCH_ROWS],
    )
}

/// Clears the payloads of up to [`BATCH_ROWS`] ledger rows received before `cutoff`; the
/// claims stay.
pub(crate) fn clear_payloads_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    let (row, columns) = ledger_row(tx);
    tx.execute(
        &format!(
            "UPDATE webhook_events SET payload = NULL WHERE {row} IN
                 (SELECT {columns} FROM webhook_events
                  WHERE received_at < $1 AND payload IS NOT NULL LIMIT $2)"
        ),
        &[&cutoff, &BATCH_ROWS],
    )
}

/// Deletes up to [`BATCH_ROWS`] outbox rows delivered (or superseded) before `cutoff`.
pub(crate) fn delete_outbox_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    tx.execute(
        "DELETE FROM outbox WHERE id IN
             (SELECT id FROM outbox WHERE status IN ('done', 'superseded') AND done_at < $1
                  LIMIT $2)",
        &[&cutoff, &BATCH_ROWS],
    )
}
