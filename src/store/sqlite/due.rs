//! Which outbox rows are due, on SQLite: one server per database file, so no lease is needed.

use rusqlite::types::{Type, ValueRef};
use rusqlite::{params, Connection, OptionalExtension};

use crate::outbox::PendingRow;
use crate::store::listings::blob_text;
use crate::store::payload::OutboxPayload;

/// Up to `limit` pending rows of `kinds` that are due at `now`, in id order, other than those
/// `in_flight` (a JSON array of ids: attempted now, and still due here), without their payloads
/// ([`payload`] reads the one attempted).
/// `kinds` is a JSON array of the kinds that have somewhere to go; rows of other kinds wait.
pub(crate) fn due(
    conn: &Connection,
    kinds: &str,
    now: i64,
    limit: usize,
    in_flight: &str,
) -> rusqlite::Result<Vec<PendingRow>> {
    // An effect may have written a key as a number or a blob: each is read as the text the
    // worker needs (see `text`), so one odd row cannot stop the others.
    conn.prepare_cached(
        "SELECT id, kind, source, key, event_type, attempts, queued
         FROM outbox
         WHERE status = 'pending' AND next_attempt_at <= ?1
           AND kind IN (SELECT value FROM json_each(?3))
           AND id NOT IN (SELECT value FROM json_each(?4))
         ORDER BY id LIMIT ?2",
    )?
    .query_map(params![now, limit as i64, kinds, in_flight], |r| {
        // NOT NULL in the schema.
        let required = |i| {
            text(r, i)?.ok_or(rusqlite::Error::InvalidColumnType(
                i,
                String::new(),
                Type::Null,
            ))
        };
        Ok(PendingRow {
            id: r.get(0)?,
            kind: required(1)?,
            source: required(2)?,
            key: required(3)?,
            event_type: text(r, 4)?,
            attempts: r.get(5)?,
            queued: r.get(6)?,
            // One server a file: nobody else to keep off the row.
            lease: None,
        })
    })?
    .collect()
}

/// Column `i` as text, whatever its type: a number in decimal (`1.0` for a real, as SQLite
/// writes it), text that is not UTF-8 with U+FFFD in place of its bad bytes, a blob as
/// [`blob_text`] shows it (the text it spells, or `x'…'`, as `outbox list` shows it too).
fn text(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<Option<String>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Null => None,
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(f) => Some(format!("{f:?}")),
        ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Some(blob_text(b)),
    })
}

/// The payload of row `id`, if it is still pending as queued for the `queued`-th time: its
/// own, or its event's for a row that refers to it.
pub(crate) fn payload(conn: &Connection, id: i64, queued: i64) -> anyhow::Result<Option<Vec<u8>>> {
    let row = conn
        .prepare_cached(
            "SELECT CAST(payload AS BLOB), payload_ref, source, key
             FROM outbox WHERE id = ?1 AND status = 'pending' AND queued = ?2",
        )?
        .query_row(params![id, queued], |r| {
            Ok(OutboxPayload {
                payload: r.get(0)?,
                refers: r.get::<_, Option<i64>>(1)? == Some(1),
                // As the worker reads them (an effect may have written a blob).
                source: text(r, 2)?.unwrap_or_default(),
                key: text(r, 3)?.unwrap_or_default(),
            })
        })
        .optional()?;
    row.map(|own| own.payload(conn)).transpose()
}

/// When the next pending row of `kinds` (a JSON array) is due, if any.
pub(crate) fn next_due_at(conn: &Connection, kinds: &str) -> rusqlite::Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT min(next_attempt_at) FROM outbox
         WHERE status = 'pending' AND kind IN (SELECT value FROM json_each(?1))",
    )?
    .query_row([kinds], |r| r.get(0))
}
