//! Refused webhook requests, kept in `hookledger_refusals` for `/status`: written in batches
//! by the refusal recorder (`crate::refusals`, through the writer), read by the console
//! (`console.rs`). The same SQL on every store.

use crate::sql::{Session, StoreError};

/// Refusals of one source for one reason with one message, between two flushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusalRow {
    pub(crate) source: String,
    /// The error kind the request was answered with (`invalid_signature`, …).
    pub(crate) reason: String,
    /// Unix seconds of the last of them.
    pub(crate) at: i64,
    /// How many requests this row stands for.
    pub(crate) count: i64,
    /// hookledger's own text about the refusal (never the body, never a secret).
    pub(crate) message: String,
}

/// Inserts `rows`, deletes the rows refused before `before`, and keeps the newest `cap` rows
/// of each source of `rows`. Returns the rows inserted.
pub(crate) fn record(
    tx: &dyn Session,
    rows: &[RefusalRow],
    before: i64,
    cap: i64,
) -> Result<u64, StoreError> {
    let mut inserted = 0;
    for r in rows {
        inserted += tx.execute(
            "INSERT INTO hookledger_refusals (source, reason, at, count, message)
             VALUES ($1, $2, $3, $4, $5)",
            &[&r.source, &r.reason, &r.at, &r.count, &r.message],
        )?;
    }
    // The table holds at most `cap` rows per source: a full scan of it is small.
    tx.execute("DELETE FROM hookledger_refusals WHERE at < $1", &[&before])?;
    let mut sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
    sources.sort_unstable();
    sources.dedup();
    for source in sources {
        // The id of the newest row past the cap, if any, and every older one.
        tx.execute(
            "DELETE FROM hookledger_refusals WHERE source = $1 AND id <= (
                 SELECT id FROM hookledger_refusals WHERE source = $1
                 ORDER BY id DESC LIMIT 1 OFFSET $2)",
            &[&source, &cap],
        )?;
    }
    Ok(inserted)
}
