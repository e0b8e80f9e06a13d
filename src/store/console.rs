//! What the operator's console (`/status`, `/events`, `/outbox` on the admin listener) reads,
//! the same SQL on every store, on a pooled read connection. Everything comes from the
//! database, so the pages say the same after a restart.

use crate::sql::{Dialect, Row, Session, ToParam};
use crate::store::ledger;
use crate::store::listings::{outbox_row, OutboxRow, OUTBOX_COLUMNS};
use crate::store::payload::{body_size, SIZE};

/// The window `/status` counts over: events per minute, refusals by reason.
pub(crate) const WINDOW_SECS: i64 = 15 * 60;
/// The last messages shown per source and reason.
pub(crate) const MESSAGES: usize = 3;
/// The last events listed per source on `/status`.
pub(crate) const RECENT: i64 = 5;

/// One source at a glance, from the ledger and the kept refusals.
#[derive(Debug, Clone, Default)]
pub(crate) struct SourceSummary {
    pub(crate) source: String,
    /// When its newest event in the ledger was received.
    pub(crate) last_event_at: Option<i64>,
    /// Events received in the window.
    pub(crate) events: i64,
    /// Its newest events.
    pub(crate) recent: Vec<EventLine>,
    /// Refusals in the window, by reason, most first.
    pub(crate) refusals: Vec<ReasonSummary>,
}

impl SourceSummary {
    pub(crate) fn refused(&self) -> i64 {
        self.refusals.iter().map(|r| r.count).sum()
    }
}

/// A source's refusals for one reason in the window.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReasonSummary {
    pub(crate) reason: String,
    pub(crate) count: i64,
    pub(crate) last_at: i64,
    /// The newest distinct messages, newest first: (when, message).
    pub(crate) messages: Vec<(i64, String)>,
}

/// An event as the lists show it.
#[derive(Debug, Clone)]
pub(crate) struct EventLine {
    pub(crate) source: String,
    pub(crate) event_id: String,
    pub(crate) event_type: String,
    pub(crate) received_at: i64,
    pub(crate) payload_bytes: Option<i64>,
}

/// `sources` at `now`: each source's last event, events and refusals in the window. Every
/// query goes through an index on `source` (pinned by the contract's plan test).
pub(crate) fn summaries(
    conn: &dyn Session,
    sources: &[String],
    now: i64,
) -> anyhow::Result<Vec<SourceSummary>> {
    let since = now - WINDOW_SECS;
    let mut out = Vec::with_capacity(sources.len());
    for source in sources {
        let mut s = refused(conn, source, now)?;
        s.recent = recent(conn, source, RECENT)?;
        s.last_event_at = s.recent.first().map(|e| e.received_at);
        s.events = conn
            .query(
                "SELECT count(*) FROM webhook_events WHERE source = $1 AND received_at >= $2",
                &[source, &since],
            )?
            .first()
            .map(|r| r.get::<i64>(0))
            .transpose()?
            .unwrap_or(0);
        out.push(s);
    }
    Ok(out)
}

/// `source`'s newest `limit` events: a walk down its end of the (source, received_at,
/// event_id) index.
pub(crate) fn recent(
    conn: &dyn Session,
    source: &str,
    limit: i64,
) -> anyhow::Result<Vec<EventLine>> {
    let rows = conn.query(
        &format!(
            "SELECT source, event_id, event_type, received_at, {SIZE} FROM webhook_events
             WHERE source = $1 ORDER BY received_at DESC, event_id DESC LIMIT $2"
        ),
        &[&source, &limit],
    )?;
    rows.iter().map(event_line).collect()
}

/// `source`'s refusals in the window at `now`, by reason, with their newest messages; nothing
/// of the ledger (the bucket of names no source has has no events).
pub(crate) fn refused(conn: &dyn Session, source: &str, now: i64) -> anyhow::Result<SourceSummary> {
    let since = now - WINDOW_SECS;
    let mut s = SourceSummary {
        source: source.to_string(),
        ..SourceSummary::default()
    };
    // Counted by the minute: the window starts at the minute `since` falls in.
    let counted = conn.query(
        "SELECT reason, CAST(sum(count) AS BIGINT), max(last_at) FROM hookledger_refusals
         WHERE source = $1 AND minute >= $2 GROUP BY reason",
        &[&source, &since.div_euclid(60)],
    )?;
    for r in &counted {
        s.refusals.push(ReasonSummary {
            reason: r.get(0)?,
            count: r.get(1)?,
            last_at: r.get(2)?,
            messages: Vec::new(),
        });
    }
    s.refusals
        .sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    // At most a few rows per source and reason are kept: sorted here, not by an index.
    let kept = conn.query(
        "SELECT reason, at, id, message FROM hookledger_refusal_messages
         WHERE source = $1 AND at >= $2",
        &[&source, &since],
    )?;
    let mut messages = kept
        .iter()
        .map(|r| {
            Ok((
                r.get::<String>(0)?,
                r.get::<i64>(1)?,
                r.get::<i64>(2)?,
                r.get(3)?,
            ))
        })
        .collect::<anyhow::Result<Vec<(String, i64, i64, String)>>>()?;
    // Newest first.
    messages.sort_by_key(|m| std::cmp::Reverse((m.1, m.2)));
    for (reason, at, _, message) in messages {
        if let Some(summary) = s.refusals.iter_mut().find(|x| x.reason == reason) {
            if summary.messages.len() < MESSAGES {
                summary.messages.push((at, message));
            }
        }
    }
    Ok(s)
}

/// What the events browser filters on; `None` is any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EventFilter {
    pub(crate) source: Option<String>,
    pub(crate) event_type: Option<String>,
    /// The start of the id.
    pub(crate) id_prefix: Option<String>,
    /// Received at or after (Unix seconds).
    pub(crate) from: Option<i64>,
    /// Received before (Unix seconds).
    pub(crate) to: Option<i64>,
}

/// Where a page of events starts: just after the last event of the page before it, in the
/// list's order (newest first). A key, not an offset: the page costs the same however deep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventKey {
    pub(crate) received_at: i64,
    pub(crate) source: String,
    pub(crate) event_id: String,
}

/// The smallest text greater than every text starting with `prefix`, by code point (what
/// both stores compare by here): `prefix` and the largest code point.
fn past_prefix(prefix: &str) -> String {
    format!("{prefix}{}", char::MAX)
}

/// Adds `value` to `params`; its placeholder.
fn bind<'a>(params: &mut Vec<&'a dyn ToParam>, value: &'a dyn ToParam) -> String {
    params.push(value);
    format!("${}", params.len())
}

/// Events matching `filter`, newest first (received_at, source, event_id), `limit` of them
/// after `after`. The WHERE clause names only the filters given, so each can use an index:
/// (source, received_at, event_id) with a source, (received_at) without.
pub(crate) fn events(
    conn: &dyn Session,
    filter: &EventFilter,
    limit: i64,
    after: Option<&EventKey>,
) -> anyhow::Result<Vec<EventLine>> {
    // Text compared by code point: SQLite's BINARY does; PostgreSQL's database collation may
    // not, which would make the prefix range wrong.
    let bytes = match conn.dialect() {
        Dialect::Sqlite => "",
        Dialect::Postgres => " COLLATE \"C\"",
    };
    let upper = filter.id_prefix.as_deref().map(past_prefix);
    let mut params: Vec<&dyn ToParam> = Vec::new();
    let mut clauses: Vec<String> = Vec::new();
    if let Some(source) = &filter.source {
        let p = bind(&mut params, source);
        clauses.push(format!("source = {p}"));
    }
    if let Some(kind) = &filter.event_type {
        let p = bind(&mut params, kind);
        clauses.push(format!("event_type = {p}"));
    }
    if let (Some(prefix), Some(upper)) = (&filter.id_prefix, &upper) {
        let (p, u) = (bind(&mut params, prefix), bind(&mut params, upper));
        clauses.push(format!(
            "event_id{bytes} >= {p}{bytes} AND event_id{bytes} < {u}{bytes}"
        ));
    }
    if let Some(from) = &filter.from {
        let p = bind(&mut params, from);
        clauses.push(format!("received_at >= {p}"));
    }
    if let Some(to) = &filter.to {
        let p = bind(&mut params, to);
        clauses.push(format!("received_at < {p}"));
    }
    if let Some(key) = after {
        let at = bind(&mut params, &key.received_at);
        let source = bind(&mut params, &key.source);
        let id = bind(&mut params, &key.event_id);
        // `received_at <= at` bounds the index range; the rest orders ties as the list does.
        clauses.push(format!(
            "received_at <= {at} AND (received_at < {at} OR source < {source} \
             OR (source = {source} AND event_id < {id}))"
        ));
    }
    let limit_param = bind(&mut params, &limit);
    let filters = where_all(&clauses);
    let rows = conn.query(
        &format!(
            "SELECT source, event_id, event_type, received_at, {SIZE}
             FROM webhook_events {filters}
             ORDER BY received_at DESC, source DESC, event_id DESC LIMIT {limit_param}"
        ),
        &params,
    )?;
    rows.iter().map(event_line).collect()
}

fn event_line(r: &Row) -> anyhow::Result<EventLine> {
    Ok(EventLine {
        source: r.get(0)?,
        event_id: r.get(1)?,
        event_type: r.get(2)?,
        received_at: r.get(3)?,
        // The body's size, not the bytes it is stored in.
        payload_bytes: body_size(r, 4)?,
    })
}

/// One event of the ledger with its payload and its outbox rows.
#[derive(Debug, Clone)]
pub(crate) struct EventDetail {
    pub(crate) line: EventLine,
    pub(crate) created: Option<i64>,
    /// `None` once retention cleared it.
    pub(crate) payload: Option<Vec<u8>>,
    pub(crate) outbox: Vec<OutboxRow>,
}

/// Event `id` of `source`, or `None`.
pub(crate) fn event(
    conn: &dyn Session,
    source: &str,
    id: &str,
) -> anyhow::Result<Option<EventDetail>> {
    let Some(r) = conn
        .query(
            &ledger::by_key(
                conn.dialect(),
                &format!(
                    "source, event_id, event_type, received_at, {SIZE}, created, payload,
                     payload_codec, payload_dict"
                ),
                "$1",
                "$2",
            ),
            &[&source, &id],
        )?
        .into_iter()
        .next()
    else {
        return Ok(None);
    };
    let outbox = conn.query(
        &format!("SELECT {OUTBOX_COLUMNS} FROM outbox WHERE source = $1 AND key = $2 ORDER BY id"),
        &[&source, &id],
    )?;
    Ok(Some(EventDetail {
        line: event_line(&r)?,
        created: r.get(7)?,
        payload: crate::store::payload::read(conn, &r, 8)?,
        outbox: outbox
            .iter()
            .map(outbox_row)
            .collect::<anyhow::Result<_>>()?,
    }))
}

/// Outbox rows of `kind` and `status` (`None`: any), newest first, `limit` of them with an id
/// below `before`. The WHERE clause names only the filters given.
pub(crate) fn outbox(
    conn: &dyn Session,
    kind: Option<&str>,
    status: Option<&str>,
    limit: i64,
    before: Option<i64>,
) -> anyhow::Result<Vec<OutboxRow>> {
    let mut params: Vec<&dyn ToParam> = Vec::new();
    let mut clauses: Vec<String> = Vec::new();
    let (kind, status) = (kind.map(str::to_string), status.map(str::to_string));
    if let Some(kind) = &kind {
        clauses.push(format!("kind = {}", bind(&mut params, kind)));
    }
    if let Some(status) = &status {
        clauses.push(format!("status = {}", bind(&mut params, status)));
    }
    if let Some(before) = &before {
        clauses.push(format!("id < {}", bind(&mut params, before)));
    }
    let limit_param = bind(&mut params, &limit);
    let filters = where_all(&clauses);
    let rows = conn.query(
        &format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox {filters} ORDER BY id DESC LIMIT {limit_param}"
        ),
        &params,
    )?;
    rows.iter().map(outbox_row).collect()
}

/// `WHERE` with every clause, or nothing when there is none.
fn where_all(clauses: &[String]) -> String {
    match clauses.is_empty() {
        true => String::new(),
        false => format!("WHERE {}", clauses.join(" AND ")),
    }
}
