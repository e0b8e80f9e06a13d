//! Which outbox rows are due, on SQLite: one server per database file, so no lease is needed.

use rusqlite::{params, Connection, OptionalExtension};

use crate::outbox::PendingRow;

/// Up to `limit` pending rows of `kinds` that are due at `now`, in id order, without their
/// payloads ([`payload`] reads the one attempted).
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
                CAST(event_type AS TEXT), attempts, queued
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
            attempts: r.get(5)?,
            queued: r.get(6)?,
        })
    })?
    .collect()
}

/// The payload of row `id`, if it is still pending as queued for the `queued`-th time.
pub(crate) fn payload(
    conn: &Connection,
    id: i64,
    queued: i64,
) -> rusqlite::Result<Option<Vec<u8>>> {
    conn.prepare_cached(
        "SELECT CAST(payload AS BLOB) FROM outbox
         WHERE id = ?1 AND status = 'pending' AND queued = ?2",
    )?
    .query_row(params![id, queued], |r| r.get(0))
    .optional()
}

/// When the next pending row of `kinds` (a JSON array) is due, if any.
pub(crate) fn next_due_at(conn: &Connection, kinds: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT min(next_attempt_at) FROM outbox
         WHERE status = 'pending' AND kind IN (SELECT value FROM json_each(?1))",
    )?
    .query_row([kinds], |r| r.get(0))
}
