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
//! On SQLite the key is unique within a day (`webhook_events_key`, on `(received_at / 86400,
//! source, event_id)`, so that a claim with a random id touches only today's pages); its claim
//! path is `store/sqlite/claims.rs`, and a read by key seeks that index once for each day the
//! ledger holds ([`by_key`]), never scans.

use crate::event::Event;
use crate::payload::Stored;
use crate::sql::{Dialect, Session, StoreError};

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

/// The day of a claim received at `received_at`, as `webhook_events_key` orders it (SQLite's
/// integer division: `received_at` is never negative).
pub(crate) fn day_of(received_at: i64) -> i64 {
    received_at / 86_400
}

/// On SQLite, whether the ledger has the claim `(?2, ?3)` received on day `?1`: one seek of
/// `webhook_events_key`.
pub(crate) const SQLITE_CLAIMED_ON: &str =
    "SELECT 1 FROM webhook_events INDEXED BY webhook_events_key
     WHERE received_at / 86400 = ?1 AND source = ?2 AND event_id = ?3";

/// On SQLite, the days the ledger holds claims of, oldest first: a loose scan of
/// `webhook_events_received_at`, one seek a day.
pub(crate) const SQLITE_DAYS: &str = "WITH RECURSIVE days(d) AS (
         SELECT min(received_at) / 86400 FROM webhook_events
         UNION ALL
         SELECT (SELECT min(received_at) FROM webhook_events
                 WHERE received_at >= (d + 1) * 86400) / 86400
         FROM days WHERE d IS NOT NULL)
     SELECT d FROM days WHERE d IS NOT NULL";

/// `SELECT {columns} FROM webhook_events` of the claim of event `id` from `source` (each a
/// placeholder such as `$1`), on the store of `dialect`: what every reader by key runs. On
/// PostgreSQL a lookup of the primary key; on SQLite one seek of `webhook_events_key` for each
/// day the ledger holds (the key is unique within a day; the claim path keeps it unique
/// across days). `INDEXED BY`: without statistics SQLite may prefer walking all of a source's
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
             WHERE received_at / 86400 IN ({SQLITE_DAYS}) AND source = {source} AND event_id = {id}"
        ),
    }
}

/// [`by_key`] for event `id` of any source, in source order: on SQLite one seek a day and
/// source (the sources found by a loose scan of `webhook_events_source_received`).
pub(crate) fn by_id(dialect: Dialect, columns: &str, id: &str) -> String {
    match dialect {
        Dialect::Postgres => {
            format!("SELECT {columns} FROM webhook_events WHERE event_id = {id} ORDER BY source")
        }
        Dialect::Sqlite => format!(
            "SELECT {columns} FROM webhook_events INDEXED BY webhook_events_key
             WHERE received_at / 86400 IN ({SQLITE_DAYS})
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
