//! The outbox: external effects written in the event's transaction, delivered after commit.

use rusqlite::{params, Connection};

/// Outbox kind for "POST this event to the app".
pub const FORWARD: &str = "forward";

/// Queues an effect inside the caller's transaction. `(kind, key)` is unique, so a replayed
/// enqueue of the same effect adds nothing.
pub fn enqueue(
    tx: &Connection,
    kind: &str,
    key: &str,
    payload: &[u8],
    now: i64,
) -> rusqlite::Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO outbox (kind, key, payload, status, next_attempt_at, created_at)
             VALUES (?1, ?2, ?3, 'pending', ?4, ?4)",
        )?
        .execute(params![kind, key, payload, now])?;
    Ok(inserted == 1)
}
