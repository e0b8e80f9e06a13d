//! The CLI's commands on the database file: listing and showing events and outbox rows,
//! reviving dead rows, replaying events, pruning.
//!
//! These run in their own process, next to a running `serve` or without one. Reads use a
//! read-only view; writes use one short `BEGIN IMMEDIATE` transaction on this process's own
//! connection, so SQLite serialises them with the server's writer (which waits up to its busy
//! timeout). The server's outbox worker polls and picks revived rows up within a second.

use std::path::Path;

use anyhow::{bail, Context};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde_json::json;

use crate::cli::table;
use crate::retention::{self, Pruned};
use crate::unix_now;
use crate::writer::StoreError;

/// An outbox row for listing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OutboxRow {
    pub id: i64,
    pub kind: String,
    pub key: String,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub done_at: Option<i64>,
}

/// A ledger row for listing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EventRow {
    pub event_id: String,
    pub event_type: String,
    pub source: String,
    pub created: Option<i64>,
    pub received_at: i64,
    pub payload_bytes: i64,
}

pub fn outbox_list(conn: &Connection, status: Option<&str>) -> anyhow::Result<Vec<OutboxRow>> {
    if let Some(s) = status {
        if !matches!(s, "pending" | "done" | "dead") {
            bail!("--status must be pending, done or dead, not `{s}`");
        }
    }
    let mut stmt = conn.prepare(
        "SELECT id, kind, key, status, attempts, next_attempt_at, last_error, created_at, done_at
         FROM outbox WHERE ?1 IS NULL OR status = ?1 ORDER BY id",
    )?;
    let rows = stmt
        .query_map([status], |r| {
            Ok(OutboxRow {
                id: r.get(0)?,
                kind: r.get(1)?,
                key: r.get(2)?,
                status: r.get(3)?,
                attempts: r.get(4)?,
                next_attempt_at: r.get(5)?,
                last_error: r.get(6)?,
                created_at: r.get(7)?,
                done_at: r.get(8)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

pub fn events_list(
    conn: &Connection,
    since: Option<i64>,
    kind: Option<&str>,
    limit: usize,
) -> anyhow::Result<Vec<EventRow>> {
    let mut stmt = conn.prepare(
        "SELECT event_id, event_type, source, created, received_at, length(payload)
         FROM webhook_events
         WHERE (?1 IS NULL OR received_at >= ?1) AND (?2 IS NULL OR event_type = ?2)
         ORDER BY received_at DESC, rowid DESC LIMIT ?3",
    )?;
    let rows = stmt
        .query_map(params![since, kind, limit as i64], |r| {
            Ok(EventRow {
                event_id: r.get(0)?,
                event_type: r.get(1)?,
                source: r.get(2)?,
                created: r.get(3)?,
                received_at: r.get(4)?,
                payload_bytes: r.get::<_, Option<i64>>(5)?.unwrap_or(0),
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// One event with its payload parsed for pretty-printing.
pub fn event_show(conn: &Connection, id: &str) -> anyhow::Result<serde_json::Value> {
    let shown = conn
        .query_row(
            "SELECT event_type, source, created, received_at, payload FROM webhook_events
             WHERE event_id = ?1",
            [id],
            |r| {
                let payload: Option<Vec<u8>> = r.get(4)?;
                let payload = payload.map(|p| {
                    serde_json::from_slice::<serde_json::Value>(&p)
                        .unwrap_or_else(|_| json!(String::from_utf8_lossy(&p)))
                });
                Ok(json!({
                    "event_id": id,
                    "event_type": r.get::<_, String>(0)?,
                    "source": r.get::<_, String>(1)?,
                    "created": r.get::<_, Option<i64>>(2)?,
                    "received_at": r.get::<_, i64>(3)?,
                    "payload": payload,
                }))
            },
        )
        .optional()?;
    shown.with_context(|| {
        format!("no event {id} in the ledger (never received, or pruned after the retention age)")
    })
}

/// Runs `f` in one immediate transaction on the CLI's own connection.
fn write<T>(
    conn: &mut Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> anyhow::Result<T> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let out = f(&tx)?;
    tx.commit()?;
    Ok(out)
}

/// Revives one dead row; errors if it is not dead.
pub fn outbox_retry(conn: &mut Connection, id: i64) -> anyhow::Result<()> {
    let now = unix_now();
    if !write(conn, |tx| crate::outbox::retry(tx, id, now))? {
        bail!("outbox row {id} does not exist or is not dead (see: hookledger outbox list)");
    }
    Ok(())
}

pub fn outbox_retry_all_dead(conn: &mut Connection) -> anyhow::Result<usize> {
    let now = unix_now();
    write(conn, |tx| crate::outbox::retry_all_dead(tx, now))
}

pub fn replay(conn: &mut Connection, event_id: &str) -> anyhow::Result<()> {
    let now = unix_now();
    if !write(conn, |tx| crate::outbox::replay(tx, event_id, now))? {
        bail!(
            "no event {event_id} in the ledger (never received, or pruned after the retention age)"
        );
    }
    Ok(())
}

/// One prune, each batch its own short transaction.
pub fn prune(conn: &mut Connection, retention_days: u64) -> anyhow::Result<Pruned> {
    crate::config::check_retention(retention_days)?;
    let pruned = retention::prune(unix_now(), retention_days, |task| {
        write(conn, task).map_err(|e| StoreError::Database(format!("{e:#}")))
    })?;
    Ok(pruned)
}

/// Opens a read-only connection to an existing database.
pub fn open_read(path: &Path) -> anyhow::Result<Connection> {
    if !path.exists() {
        bail!(
            "database file {} does not exist (pass --db, or start `hookledger serve` first)",
            path.display()
        );
    }
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("cannot open {}", path.display()))?;
    conn.busy_timeout(crate::store::sqlite::DEFAULT_BUSY_TIMEOUT)?;
    Ok(conn)
}

/// `2026-11-30 03:15:58` (UTC) for a Unix time.
pub fn format_time(t: i64) -> String {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm), proleptic Gregorian, UTC.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

pub fn render_outbox(rows: &[OutboxRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.kind.clone(),
                r.key.clone(),
                r.status.clone(),
                r.attempts.to_string(),
                match r.status.as_str() {
                    "pending" => format_time(r.next_attempt_at),
                    "done" => r.done_at.map(format_time).unwrap_or_default(),
                    _ => String::new(),
                },
                r.last_error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::render(
        &[
            "id",
            "kind",
            "key",
            "status",
            "attempts",
            "next/done (UTC)",
            "last error",
        ],
        &cells,
    )
}

pub fn render_events(rows: &[EventRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.event_id.clone(),
                r.event_type.clone(),
                r.source.clone(),
                r.created.map(format_time).unwrap_or_default(),
                format_time(r.received_at),
                r.payload_bytes.to_string(),
            ]
        })
        .collect();
    table::render(
        &[
            "event id",
            "type",
            "source",
            "created (UTC)",
            "received (UTC)",
            "bytes",
        ],
        &cells,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_utc_times() {
        assert_eq!(super::format_time(0), "1970-01-01 00:00:00");
        assert_eq!(super::format_time(1721954054), "2024-07-26 00:34:14");
        assert_eq!(super::format_time(1724632454), "2024-08-26 00:34:14");
    }
}
