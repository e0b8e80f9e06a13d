//! The claim: one row per `(source, event id)` in `webhook_events`, and the one way to read a
//! claim back by that key.
//!
//! On PostgreSQL, `INSERT … ON CONFLICT DO NOTHING` on the primary key decides whether an
//! event is new. It runs inside the writer's transaction, before the effects, so a crash or an
//! error anywhere in the event's apply rolls the claim back too and the provider's retry starts
//! clean. There is never a "check, then insert" in code: the key decides. A second instance
//! claiming the same event waits on the first one's uncommitted row, then sees it: one
//! `processed`, one `duplicate`.
//!
//! On SQLite the key is unique within a block of 65,536 ids (`webhook_events_key`, on
//! `(id >> 16, source, event_id)`, so that a claim with a random id touches only the newest
//! block's pages, however the ledger was filled); its claim path is `store/sqlite/claims.rs`,
//! and a read by key seeks that index once for each block the ledger holds ([`by_key`]),
//! never scans.

use crate::event::Event;
use crate::payload::Stored;
use crate::sql::{Dialect, Row, Session, StoreError};

/// Claims `event` (PostgreSQL); true if it is new (and its effects must now be applied), false
/// if the id was already in the ledger (a duplicate: nothing else may run). `stored` is its
/// body as it is stored (`crate::payload`).
pub(crate) fn claim(
    tx: &dyn Session,
    event: &Event,
    stored: &Stored,
    received_at: i64,
) -> Result<bool, StoreError> {
    let inserted = tx.execute(
        "INSERT INTO webhook_events
             (event_id, event_type, source, created, received_at, payload, payload_codec,
              payload_dict)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (source, event_id) DO NOTHING",
        &[
            &event.id,
            &event.kind,
            &event.source,
            &event.created,
            &received_at,
            &stored.bytes,
            &stored.codec,
            &stored.dict,
        ],
    )?;
    Ok(inserted == 1)
}

/// Claims the signature's single-use `token` of `source` at `now`, in the event's transaction:
/// false when it was used before (by another event: a replayed signature), and the event must
/// be refused. Runs only for a new event, so a resend of the same event is a duplicate first.
pub(crate) fn claim_token(
    tx: &dyn Session,
    source: &str,
    token: &str,
    now: i64,
) -> Result<bool, StoreError> {
    let inserted = tx.execute(
        "INSERT INTO hookledger_signature_tokens (source, token, seen_at) VALUES ($1, $2, $3)
         ON CONFLICT (source, token) DO NOTHING",
        &[&source, &token, &now],
    )?;
    Ok(inserted == 1)
}

/// The ids of a block of `webhook_events_key`: `id >> BLOCK_BITS` (65,536 claims a block).
pub(crate) const BLOCK_BITS: u32 = 16;

/// The block of the claim with row id `id`, as `webhook_events_key` orders it (an arithmetic
/// shift, as SQLite's `>>`).
pub(crate) fn block_of(id: i64) -> i64 {
    id >> BLOCK_BITS
}

/// On SQLite, whether the ledger has the claim `(?2, ?3)` in block `?1`: one seek of
/// `webhook_events_key`.
pub(crate) const SQLITE_CLAIMED_IN: &str =
    "SELECT 1 FROM webhook_events INDEXED BY webhook_events_key
     WHERE id >> 16 = ?1 AND source = ?2 AND event_id = ?3";

/// On SQLite, the blocks the ledger holds claims of, lowest first: a loose scan of the table's
/// ids, one seek a block (ids far apart, written by other code, cost no more). It stops below
/// the last block an i64 holds, where `(b + 1) << 16` would wrap.
pub(crate) const SQLITE_BLOCKS: &str = "WITH RECURSIVE blocks(b) AS (
         SELECT min(id) >> 16 FROM webhook_events
         UNION ALL
         SELECT (SELECT min(id) FROM webhook_events WHERE id >= (b + 1) << 16) >> 16
         FROM blocks WHERE b IS NOT NULL AND b < 9223372036854775807 >> 16)
     SELECT b FROM blocks WHERE b IS NOT NULL";

/// On SQLite, `SELECT {columns}` of the claim of event `key` from `source`, sought newest
/// block first, one seek a block until found (each step down one seek of the table's ids):
/// for a reader that expects a recent claim.
pub(crate) fn sqlite_newest_first(
    conn: &dyn Session,
    columns: &str,
    source: &str,
    key: &str,
) -> Result<Vec<Row>, StoreError> {
    let below = |block: Option<i64>| -> Result<Option<i64>, StoreError> {
        let rows = match block {
            None => conn.query("SELECT max(id) >> 16 FROM webhook_events", &[])?,
            Some(b) => conn.query(
                "SELECT max(id) >> 16 FROM webhook_events WHERE id < $1 << 16",
                &[&b],
            )?,
        };
        rows.first().map_or(Ok(None), |r| r.get(0))
    };
    let seek = format!(
        "SELECT {columns} FROM webhook_events INDEXED BY webhook_events_key
         WHERE id >> 16 = $1 AND source = $2 AND event_id = $3"
    );
    let mut block = below(None)?;
    while let Some(b) = block {
        let rows = conn.query(&seek, &[&b, &source, &key])?;
        if !rows.is_empty() {
            return Ok(rows);
        }
        block = below(Some(b))?;
    }
    Ok(Vec::new())
}

/// `SELECT {columns} FROM webhook_events` of the claim of event `id` from `source` (each a
/// placeholder such as `$1`), on the store of `dialect`: what every reader by key runs. On
/// PostgreSQL a lookup of the primary key; on SQLite one seek of `webhook_events_key` for each
/// block the ledger holds (the key is unique within a block; the claim path keeps it unique
/// across blocks). `INDEXED BY`: without statistics SQLite may prefer walking all of a source's
/// claims in `webhook_events_source_received`.
pub(crate) fn by_key(dialect: Dialect, columns: &str, source: &str, id: &str) -> String {
    match dialect {
        Dialect::Postgres => {
            format!(
                "SELECT {columns} FROM webhook_events WHERE source = {source} AND event_id = {id}"
            )
        }
        Dialect::Sqlite => format!(
            "SELECT {columns} FROM webhook_events INDEXED BY webhook_events_key
             WHERE id >> 16 IN ({SQLITE_BLOCKS}) AND source = {source} AND event_id = {id}"
        ),
    }
}

/// [`by_key`] for event `id` of any source, in source order: on SQLite one seek a block and
/// source (the sources found by a loose scan of `webhook_events_source_received`).
pub(crate) fn by_id(dialect: Dialect, columns: &str, id: &str) -> String {
    match dialect {
        Dialect::Postgres => {
            format!("SELECT {columns} FROM webhook_events WHERE event_id = {id} ORDER BY source")
        }
        Dialect::Sqlite => format!(
            "SELECT {columns} FROM webhook_events INDEXED BY webhook_events_key
             WHERE id >> 16 IN ({SQLITE_BLOCKS})
               AND source IN (
                   WITH RECURSIVE sources(s) AS (
                       SELECT min(source) FROM webhook_events
                       UNION ALL
                       SELECT (SELECT min(source) FROM webhook_events WHERE source > s)
                       FROM sources WHERE s IS NOT NULL)
                   SELECT s FROM sources WHERE s IS NOT NULL)
               AND event_id = {id}
             ORDER BY source"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block's width is written out in SQL (the key index, its seeks): each says
    /// `id >> BLOCK_BITS`, and Rust's shift rounds as SQLite's does, negative ids too.
    #[test]
    fn every_seek_of_the_key_index_shifts_ids_by_block_bits() {
        let shift = format!(">> {BLOCK_BITS}");
        let migration = include_str!("sqlite/migrations/0011_claims_by_block.sql");
        assert!(migration.contains(&format!("webhook_events (id {shift}, source, event_id)")));
        for sql in [
            SQLITE_CLAIMED_IN.to_string(),
            SQLITE_BLOCKS.to_string(),
            by_key(Dialect::Sqlite, "1", "$1", "$2"),
            by_id(Dialect::Sqlite, "1", "$1"),
        ] {
            assert!(sql.contains(&shift), "{sql}");
        }
        assert!(SQLITE_BLOCKS.contains(&format!("<< {BLOCK_BITS}")));
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for id in [
            0,
            1,
            (1 << BLOCK_BITS) - 1,
            1 << BLOCK_BITS,
            -1,
            -(1 << BLOCK_BITS) - 1,
            i64::MAX,
            i64::MIN,
        ] {
            let sqlite: i64 = conn
                .query_row("SELECT ?1 >> 16", [id], |r| r.get(0))
                .unwrap();
            assert_eq!(block_of(id), sqlite, "{id}");
        }
    }
}
