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

/// A ledger row whose payload an outbox row still needs: a `forward` row that refers to it
/// (`payload_ref`) and is not delivered yet (pending, leased, or dead and waiting for `outbox
/// retry`). Retention keeps such a row's payload, and so the row, until it is delivered or
/// deleted: the body must still arrive byte for byte.
const NEEDED: &str = "EXISTS (SELECT 1 FROM outbox
                        WHERE outbox.kind = 'forward' AND outbox.source = webhook_events.source
                          AND outbox.key = webhook_events.event_id AND outbox.payload_ref = 1
                          AND outbox.status IN ('pending', 'dead'))";

/// Deletes up to [`BATCH_ROWS`] ledger rows received before `cutoff`, but for those whose
/// payload an outbox row still needs.
pub(crate) fn delete_events_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    let (row, columns) = ledger_row(tx);
    tx.execute(
        &format!(
            "DELETE FROM webhook_events WHERE {row} IN
                 (SELECT {columns} FROM webhook_events
                  WHERE received_at < $1 AND NOT {NEEDED} LIMIT $2)"
        ),
        &[&cutoff, &BATCH_ROWS],
    )
}

/// Clears the payloads of up to [`BATCH_ROWS`] ledger rows received before `cutoff`, but for
/// those an outbox row still needs; the claims stay.
pub(crate) fn clear_payloads_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    let (row, columns) = ledger_row(tx);
    tx.execute(
        &format!(
            "UPDATE webhook_events SET payload = NULL, payload_codec = NULL, payload_dict = NULL
             WHERE {row} IN
                 (SELECT {columns} FROM webhook_events
                  WHERE received_at < $1 AND payload IS NOT NULL AND NOT {NEEDED} LIMIT $2)"
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
