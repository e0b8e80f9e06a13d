//! The listings behind `events list/show` and `outbox list`, the same SQL on every store.

use anyhow::{bail, Context};
use serde_json::json;

use crate::sql::{Row, Session};

/// An outbox row for listing.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct OutboxRow {
    pub(crate) id: i64,
    pub(crate) kind: String,
    pub(crate) source: String,
    pub(crate) key: String,
    pub(crate) status: String,
    pub(crate) attempts: i64,
    pub(crate) next_attempt_at: i64,
    pub(crate) last_error: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) done_at: Option<i64>,
}

/// A ledger row for listing.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct EventRow {
    pub(crate) event_id: String,
    pub(crate) event_type: String,
    pub(crate) source: String,
    pub(crate) created: Option<i64>,
    pub(crate) received_at: i64,
    pub(crate) payload_bytes: i64,
}

pub(crate) fn outbox_list(
    conn: &dyn Session,
    status: Option<&str>,
) -> anyhow::Result<Vec<OutboxRow>> {
    if let Some(s) = status {
        if !matches!(s, "pending" | "done" | "dead") {
            bail!("--status must be pending, done or dead, not `{s}`");
        }
    }
    let rows = conn.query(
        &format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox
             WHERE CAST($1 AS TEXT) IS NULL OR status = $1 ORDER BY id"
        ),
        &[&status],
    )?;
    rows.iter().map(outbox_row).collect()
}

/// The newest `limit` dead outbox rows, newest first.
pub(crate) fn outbox_dead(conn: &dyn Session, limit: usize) -> anyhow::Result<Vec<OutboxRow>> {
    let rows = conn.query(
        &format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox WHERE status = 'dead' ORDER BY id DESC LIMIT $1"
        ),
        &[&(limit as i64)],
    )?;
    rows.iter().map(outbox_row).collect()
}

const OUTBOX_COLUMNS: &str = "id, kind, source, key, status, attempts, next_attempt_at, \
    last_error, created_at, done_at";

fn outbox_row(r: &Row) -> anyhow::Result<OutboxRow> {
    Ok(OutboxRow {
        id: r.get(0)?,
        kind: r.get(1)?,
        source: r.get(2)?,
        key: r.get(3)?,
        status: r.get(4)?,
        attempts: r.get(5)?,
        next_attempt_at: r.get(6)?,
        last_error: r.get(7)?,
        created_at: r.get(8)?,
        done_at: r.get(9)?,
    })
}

/// Outbox rows per kind and status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutboxCount {
    pub(crate) kind: String,
    pub(crate) status: String,
    pub(crate) rows: i64,
}

/// The outbox at a glance: rows per kind and status, and when the oldest pending row was
/// queued (Unix seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct OutboxSummary {
    pub(crate) counts: Vec<OutboxCount>,
    pub(crate) oldest_pending: Option<i64>,
}

pub(crate) fn outbox_summary(conn: &dyn Session) -> anyhow::Result<OutboxSummary> {
    let counts = conn
        .query(
            "SELECT kind, status, count(*) FROM outbox GROUP BY kind, status ORDER BY kind, status",
            &[],
        )?
        .iter()
        .map(|r| {
            Ok(OutboxCount {
                kind: r.get(0)?,
                status: r.get(1)?,
                rows: r.get(2)?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let oldest_pending = conn
        .query(
            "SELECT min(created_at) FROM outbox WHERE status = 'pending'",
            &[],
        )?
        .first()
        .map(|r| r.get::<Option<i64>>(0))
        .transpose()?
        .flatten();
    Ok(OutboxSummary {
        counts,
        oldest_pending,
    })
}

/// When the oldest claim in the ledger was received (Unix seconds).
pub(crate) fn oldest_claim(conn: &dyn Session) -> anyhow::Result<Option<i64>> {
    Ok(conn
        .query("SELECT min(received_at) FROM webhook_events", &[])?
        .first()
        .map(|r| r.get::<Option<i64>>(0))
        .transpose()?
        .flatten())
}

pub(crate) fn events_list(
    conn: &dyn Session,
    since: Option<i64>,
    kind: Option<&str>,
    limit: usize,
) -> anyhow::Result<Vec<EventRow>> {
    let rows = conn.query(
        "SELECT event_id, event_type, source, created, received_at, length(payload)
         FROM webhook_events
         WHERE (CAST($1 AS BIGINT) IS NULL OR received_at >= $1)
           AND (CAST($2 AS TEXT) IS NULL OR event_type = $2)
         ORDER BY received_at DESC, source DESC, event_id DESC LIMIT $3",
        &[&since, &kind, &(limit as i64)],
    )?;
    rows.iter()
        .map(|r| {
            Ok(EventRow {
                event_id: r.get(0)?,
                event_type: r.get(1)?,
                source: r.get(2)?,
                created: r.get(3)?,
                received_at: r.get(4)?,
                payload_bytes: r.get::<Option<i64>>(5)?.unwrap_or(0),
            })
        })
        .collect()
}

/// The source of the event `id`, when exactly one source sent that id.
pub(crate) fn source_of(conn: &dyn Session, id: &str) -> anyhow::Result<String> {
    let sources = conn
        .query(
            "SELECT source FROM webhook_events WHERE event_id = $1 ORDER BY source",
            &[&id],
        )?
        .iter()
        .map(|r| r.get::<String>(0))
        .collect::<Result<Vec<_>, _>>()?;
    match sources.as_slice() {
        [one] => Ok(one.clone()),
        [] => anyhow::bail!(
            "no event {id} in the ledger (never received, or pruned after the retention age)"
        ),
        several => anyhow::bail!(
            "event {id} was sent by several sources ({}); say which with --source",
            several.join(", ")
        ),
    }
}

/// One event of `source` with its payload parsed for pretty-printing.
pub(crate) fn event_show(
    conn: &dyn Session,
    source: &str,
    id: &str,
) -> anyhow::Result<serde_json::Value> {
    let row = conn
        .query(
            "SELECT event_type, source, created, received_at, payload FROM webhook_events
             WHERE source = $1 AND event_id = $2",
            &[&source, &id],
        )?
        .into_iter()
        .next()
        .with_context(|| {
            format!(
                "no event {id} of source {source} in the ledger (never received, or pruned \
                 after the retention age)"
            )
        })?;
    let payload = row.get::<Option<Vec<u8>>>(4)?.map(|p| {
        serde_json::from_slice::<serde_json::Value>(&p)
            .unwrap_or_else(|_| json!(String::from_utf8_lossy(&p)))
    });
    Ok(json!({
        "event_id": id,
        "event_type": row.get::<String>(0)?,
        "source": row.get::<String>(1)?,
        "created": row.get::<Option<i64>>(2)?,
        "received_at": row.get::<i64>(3)?,
        "payload": payload,
    }))
}
