//! The outbox's SQL: rows queued in the event's transaction, read by the worker, updated by
//! the writer (attempts) and the CLI (retry, replay).

use rusqlite::{params, Connection};

use crate::event::Event;
use crate::outbox::{Attempt, PendingRow, FORWARD};

/// Queues an effect inside the caller's transaction. `(kind, source, key)` is unique, so a
/// replayed enqueue of the same effect adds nothing.
pub(crate) fn enqueue(
    tx: &Connection,
    kind: &str,
    event: &Event,
    payload: &[u8],
    now: i64,
) -> rusqlite::Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO outbox
                 (kind, source, key, event_type, payload, status, next_attempt_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)",
        )?
        .execute(params![
            kind,
            event.source,
            event.id,
            event.kind,
            payload,
            now
        ])?;
    Ok(inserted == 1)
}

/// Up to `limit` pending rows of `kinds` that are due at `now`, in id order.
/// `kinds` is a JSON array of the kinds that have somewhere to go; rows of other kinds wait.
pub(crate) fn due(
    conn: &Connection,
    kinds: &str,
    now: i64,
    limit: usize,
) -> rusqlite::Result<Vec<PendingRow>> {
    // An effect may have written its payload as text (json_object), or a key as a number or a
    // blob: each is read as the type the worker needs, so one odd row cannot stop the others.
    conn.prepare_cached(
        "SELECT id, CAST(kind AS TEXT), CAST(source AS TEXT), CAST(key AS TEXT),
                CAST(event_type AS TEXT), CAST(payload AS BLOB), attempts, queued
         FROM outbox
         WHERE status = 'pending' AND next_attempt_at <= ?1
           AND kind IN (SELECT value FROM json_each(?3))
         ORDER BY id LIMIT ?2",
    )?
    .query_map(params![now, limit as i64, kinds], |r| {
        Ok(PendingRow {
            id: r.get(0)?,
            kind: r.get(1)?,
            source: r.get(2)?,
            key: r.get(3)?,
            event_type: r.get(4)?,
            payload: r.get(5)?,
            attempts: r.get(6)?,
            queued: r.get(7)?,
        })
    })?
    .collect()
}

/// When the next pending row is due, if any.
/// When the next pending row of `kinds` (a JSON array) is due, if any.
pub(crate) fn next_due_at(conn: &Connection, kinds: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT min(next_attempt_at) FROM outbox
         WHERE status = 'pending' AND kind IN (SELECT value FROM json_each(?1))",
    )?
    .query_row([kinds], |r| r.get(0))
}

/// Records an attempt on row `id`, made on the row as it was when queued for the `queued`-th
/// time. Only that row, still pending, changes: a replay or retry that queued it again while
/// the attempt was in flight wins (the row is attempted again), as does a prune.
pub(crate) fn record(
    tx: &Connection,
    id: i64,
    queued: i64,
    attempt: &Attempt,
    now: i64,
) -> rusqlite::Result<u64> {
    let changed = match attempt {
        Attempt::Delivered => tx
            .prepare_cached(
                "UPDATE outbox SET status = 'done', attempts = attempts + 1, done_at = ?2,
                     last_error = NULL
                 WHERE id = ?1 AND status = 'pending' AND queued = ?3",
            )?
            .execute(params![id, now, queued])?,
        Attempt::Retry { at, error } => tx
            .prepare_cached(
                "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = ?2, last_error = ?3
                 WHERE id = ?1 AND status = 'pending' AND queued = ?4",
            )?
            .execute(params![id, at, error, queued])?,
        Attempt::Dead { error } => tx
            .prepare_cached(
                "UPDATE outbox SET status = 'dead', attempts = attempts + 1, last_error = ?2
                 WHERE id = ?1 AND status = 'pending' AND queued = ?3",
            )?
            .execute(params![id, error, queued])?,
    };
    Ok(changed as u64)
}

/// Puts row `id` back to pending with a fresh schedule. Returns whether a row changed.
pub(crate) fn retry(tx: &Connection, id: i64, now: i64) -> rusqlite::Result<bool> {
    let changed = tx
        .prepare_cached(
            "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = ?2,
                 done_at = NULL, queued = queued + 1
             WHERE id = ?1 AND status = 'dead'",
        )?
        .execute(params![id, now])?;
    Ok(changed == 1)
}

/// Puts every dead row back to pending with a fresh schedule. Returns how many.
pub(crate) fn retry_all_dead(tx: &Connection, now: i64) -> rusqlite::Result<usize> {
    tx.prepare_cached(
        "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = ?1, done_at = NULL,
             queued = queued + 1
         WHERE status = 'dead'",
    )?
    .execute([now])
}

/// Queues a new forward of a stored event of `source` (a replay), or puts its existing row
/// back to pending. Returns false if the event is not in the ledger or its payload is gone.
pub(crate) fn replay(
    tx: &Connection,
    source: &str,
    event_id: &str,
    now: i64,
) -> rusqlite::Result<bool> {
    let changed = tx
        .prepare_cached(
            "INSERT INTO outbox
                 (kind, source, key, event_type, payload, status, next_attempt_at, created_at)
             SELECT ?1, source, event_id, event_type, payload, 'pending', ?4, ?4 FROM webhook_events
             WHERE source = ?2 AND event_id = ?3 AND payload IS NOT NULL
             ON CONFLICT (kind, source, key) DO UPDATE SET
                 status = 'pending', attempts = 0, next_attempt_at = ?4, done_at = NULL,
                 payload = excluded.payload, queued = queued + 1",
        )?
        .execute(params![FORWARD, source, event_id, now])?;
    Ok(changed == 1)
}
