//! The listings behind `events list/show` and `outbox list`, the same SQL on every store.

use anyhow::{bail, Context};
use serde_json::json;

use crate::sql::{Row, Session, Value};
use crate::store::ledger;

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
    /// The end of a `[[delivery]]` command's stdout and stderr (none for a POST).
    pub(crate) output: Option<String>,
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
        if !matches!(s, "pending" | "done" | "dead" | "superseded") {
            bail!("--status must be pending, done, dead or superseded, not `{s}`");
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

/// The newest `limit` dead outbox rows, newest first: by when they were queued, a walk down
/// `outbox_pending_age` (status, created_at, id) that stops at `limit`, however many are dead
/// (by id alone, every dead row was read and sorted).
pub(crate) fn outbox_dead(conn: &dyn Session, limit: usize) -> anyhow::Result<Vec<OutboxRow>> {
    let rows = conn.query(
        &format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox WHERE status = 'dead'
             ORDER BY created_at DESC, id DESC LIMIT $1"
        ),
        &[&(limit as i64)],
    )?;
    rows.iter().map(outbox_row).collect()
}

/// One outbox row by id, or `None`.
pub(crate) fn outbox_show(conn: &dyn Session, id: i64) -> anyhow::Result<Option<OutboxRow>> {
    let rows = conn.query(
        &format!("SELECT {OUTBOX_COLUMNS} FROM outbox WHERE id = $1"),
        &[&id],
    )?;
    rows.first().map(outbox_row).transpose()
}

pub(crate) const OUTBOX_COLUMNS: &str =
    "id, kind, source, key, status, attempts, next_attempt_at, \
    last_error, created_at, done_at, output";

pub(crate) fn outbox_row(r: &Row) -> anyhow::Result<OutboxRow> {
    Ok(OutboxRow {
        id: r.get(0)?,
        kind: text(r, 1)?,
        source: text(r, 2)?,
        key: text(r, 3)?,
        status: text(r, 4)?,
        attempts: r.get(5)?,
        next_attempt_at: r.get(6)?,
        last_error: r.get::<Option<Value>>(7)?.map(|v| shown(&v)),
        created_at: r.get(8)?,
        done_at: r.get(9)?,
        output: r.get::<Option<Value>>(10)?.map(|v| shown(&v)),
    })
}

/// Text column `i` of an outbox row, whatever an effect stored in it: on SQLite, where a
/// column takes any type, an effect can queue a row whose `kind` or `key` is a BLOB or a
/// number. One such row must not make the listings (`/metrics`, `/status`, `outbox list`)
/// fail for good; it is shown as [`shown`] says.
fn text(r: &Row, i: usize) -> anyhow::Result<String> {
    match r.get::<Value>(i)? {
        Value::Null => anyhow::bail!("column {i}: NULL where text is expected"),
        value => Ok(shown(&value)),
    }
}

/// A value as text: text as it is, a number in decimal, bytes as the text they spell when
/// that is printable UTF-8, else as SQL's blob literal `x'…'` (what finds the row in a shell).
pub(crate) fn shown(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Integer(i) => i.to_string(),
        Value::Real(f) => format!("{f:?}"),
        Value::Text(s) => s.clone(),
        Value::Blob(b) => blob_text(b),
    }
}

/// Bytes as the text they spell when that is UTF-8 without control characters, else as
/// `x'…'` in upper-case hex.
pub(crate) fn blob_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
        _ => {
            let hex: String = bytes.iter().map(|b| format!("{b:02X}")).collect();
            format!("x'{hex}'")
        }
    }
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

/// Most kinds the outbox summary names one by one (beyond those with a lane): rows of a kind
/// nobody delivers (an effect that writes a new kind per event) would otherwise make `/status`
/// a table and `/metrics` a label set per kind, whatever their number.
pub(crate) const MAX_SUMMARY_KINDS: usize = 100;

/// The kind the rows of the kinds past [`MAX_SUMMARY_KINDS`] are counted under.
pub(crate) const OTHER_KINDS: &str = "(other kinds)";

/// Rows per kind and status: each kind of `lanes` (those delivered here), the other kinds
/// with the most rows up to [`MAX_SUMMARY_KINDS`], the rest as [`OTHER_KINDS`].
pub(crate) fn outbox_summary(
    conn: &dyn Session,
    lanes: &[String],
) -> anyhow::Result<OutboxSummary> {
    use std::collections::{BTreeMap, HashMap};
    let groups = conn.query(
        "SELECT kind, status, count(*) FROM outbox GROUP BY kind, status",
        &[],
    )?;
    // SQLite groups the text `forward` apart from the bytes `forward`: shown alike, they are
    // counted as one.
    let mut by_kind: HashMap<String, BTreeMap<String, i64>> = HashMap::new();
    for r in &groups {
        let (kind, status, rows) = (text(r, 0)?, text(r, 1)?, r.get::<i64>(2)?);
        *by_kind.entry(kind).or_default().entry(status).or_default() += rows;
    }
    let mut others: Vec<(i64, String)> = by_kind
        .iter()
        .filter(|(kind, _)| !lanes.contains(kind))
        .map(|(kind, statuses)| (statuses.values().sum(), kind.clone()))
        .collect();
    // Most rows first, then by name: which kinds are named does not change from one read to
    // the next while the counts stand.
    others.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut folded: BTreeMap<String, i64> = BTreeMap::new();
    for (_, kind) in others.iter().skip(MAX_SUMMARY_KINDS) {
        for (status, rows) in by_kind.remove(kind).unwrap_or_default() {
            *folded.entry(status).or_default() += rows;
        }
    }
    if !folded.is_empty() {
        by_kind.insert(OTHER_KINDS.to_string(), folded);
    }
    let mut counts: Vec<OutboxCount> = by_kind
        .into_iter()
        .flat_map(|(kind, statuses)| {
            statuses.into_iter().map(move |(status, rows)| OutboxCount {
                kind: kind.clone(),
                status,
                rows,
            })
        })
        .collect();
    counts.sort_by(|a, b| (&a.kind, &a.status).cmp(&(&b.kind, &b.status)));
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

/// The newest `limit` events received at `since` or later, of type `kind` and source
/// `source` (each when given), newest first.
pub(crate) fn events_list(
    conn: &dyn Session,
    since: Option<i64>,
    kind: Option<&str>,
    source: Option<&str>,
    limit: usize,
) -> anyhow::Result<Vec<EventRow>> {
    let rows = conn.query(
        &format!(
            "SELECT event_id, event_type, source, created, received_at, {}
         FROM webhook_events
         WHERE (CAST($1 AS BIGINT) IS NULL OR received_at >= $1)
           AND (CAST($2 AS TEXT) IS NULL OR event_type = $2)
           AND (CAST($4 AS TEXT) IS NULL OR source = $4)
         ORDER BY received_at DESC, source DESC, event_id DESC LIMIT $3",
            crate::store::payload::SIZE
        ),
        &[&since, &kind, &(limit as i64), &source],
    )?;
    rows.iter()
        .map(|r| {
            Ok(EventRow {
                event_id: r.get(0)?,
                event_type: r.get(1)?,
                source: r.get(2)?,
                created: r.get(3)?,
                received_at: r.get(4)?,
                // The body's size, not the bytes it is stored in.
                payload_bytes: crate::store::payload::body_size(r, 5)?.unwrap_or(0),
            })
        })
        .collect()
}

/// The source of the event `id`, when exactly one source sent that id.
pub(crate) fn source_of(conn: &dyn Session, id: &str) -> anyhow::Result<String> {
    let sources = conn
        .query(&ledger::by_id(conn.dialect(), "source", "$1"), &[&id])?
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
            &ledger::by_key(
                conn.dialect(),
                "event_type, source, created, received_at, payload, payload_codec, payload_dict",
                "$1",
                "$2",
            ),
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
    let payload = crate::store::payload::read(conn, &row, 4)?.map(|p| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_any_type_are_shown_as_text() {
        assert_eq!(shown(&Value::Text("forward".into())), "forward");
        assert_eq!(shown(&Value::Integer(42)), "42");
        assert_eq!(shown(&Value::Real(1.0)), "1.0");
        assert_eq!(shown(&Value::Blob(b"evt_1".to_vec())), "evt_1");
        assert_eq!(shown(&Value::Blob(vec![0])), "x'00'");
        assert_eq!(shown(&Value::Blob(vec![0xff, 0x0a])), "x'FF0A'");
        assert_eq!(shown(&Value::Blob(b"a\nb".to_vec())), "x'610A62'");
    }
}
