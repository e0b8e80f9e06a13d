//! What the operator's console (`/status`, `/events`, `/outbox` on the admin listener) reads,
//! the same SQL on every store, on a pooled read connection. Everything comes from the
//! database, so the pages say the same after a restart.

use crate::sql::{Row, Session};
use crate::store::listings::{outbox_row, OutboxRow, OUTBOX_COLUMNS};

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

/// `sources` at `now`: each source's last event, events and refusals in the window.
pub(crate) fn summaries(
    conn: &dyn Session,
    sources: &[String],
    now: i64,
) -> anyhow::Result<Vec<SourceSummary>> {
    let since = now - WINDOW_SECS;
    let mut out = Vec::with_capacity(sources.len());
    for source in sources {
        let mut s = SourceSummary {
            source: source.clone(),
            ..SourceSummary::default()
        };
        s.last_event_at = conn
            .query(
                "SELECT max(received_at) FROM webhook_events WHERE source = $1",
                &[source],
            )?
            .first()
            .map(|r| r.get::<Option<i64>>(0))
            .transpose()?
            .flatten();
        s.events = conn
            .query(
                "SELECT count(*) FROM webhook_events WHERE source = $1 AND received_at >= $2",
                &[source, &since],
            )?
            .first()
            .map(|r| r.get::<i64>(0))
            .transpose()?
            .unwrap_or(0);
        s.recent = events(
            conn,
            &EventFilter {
                source: Some(source.clone()),
                ..EventFilter::default()
            },
            RECENT,
            0,
        )?;
        let counted = conn.query(
            "SELECT reason, CAST(sum(count) AS BIGINT), max(at) FROM hookledger_refusals
             WHERE source = $1 AND at >= $2 GROUP BY reason",
            &[source, &since],
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
        // The table holds a bounded number of rows per source.
        let messages = conn.query(
            "SELECT reason, at, message FROM hookledger_refusals
             WHERE source = $1 AND at >= $2 ORDER BY id DESC",
            &[source, &since],
        )?;
        for r in &messages {
            let (reason, at, message): (String, i64, String) = (r.get(0)?, r.get(1)?, r.get(2)?);
            if let Some(summary) = s.refusals.iter_mut().find(|x| x.reason == reason) {
                if summary.messages.len() < MESSAGES
                    && !summary.messages.iter().any(|(_, m)| *m == message)
                {
                    summary.messages.push((at, message));
                }
            }
        }
        out.push(s);
    }
    Ok(out)
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

/// Events matching `filter`, newest first, `limit` from `offset`.
pub(crate) fn events(
    conn: &dyn Session,
    filter: &EventFilter,
    limit: i64,
    offset: i64,
) -> anyhow::Result<Vec<EventLine>> {
    let rows = conn.query(
        "SELECT source, event_id, event_type, received_at, length(payload)
         FROM webhook_events
         WHERE (CAST($1 AS TEXT) IS NULL OR source = $1)
           AND (CAST($2 AS TEXT) IS NULL OR event_type = $2)
           AND (CAST($3 AS TEXT) IS NULL
                OR substr(event_id, 1, length(CAST($3 AS TEXT))) = CAST($3 AS TEXT))
           AND (CAST($4 AS BIGINT) IS NULL OR received_at >= $4)
           AND (CAST($5 AS BIGINT) IS NULL OR received_at < $5)
         ORDER BY received_at DESC, source DESC, event_id DESC LIMIT $6 OFFSET $7",
        &[
            &filter.source,
            &filter.event_type,
            &filter.id_prefix,
            &filter.from,
            &filter.to,
            &limit,
            &offset,
        ],
    )?;
    rows.iter().map(event_line).collect()
}

fn event_line(r: &Row) -> anyhow::Result<EventLine> {
    Ok(EventLine {
        source: r.get(0)?,
        event_id: r.get(1)?,
        event_type: r.get(2)?,
        received_at: r.get(3)?,
        payload_bytes: r.get(4)?,
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
            "SELECT source, event_id, event_type, received_at, length(payload), created, payload
             FROM webhook_events WHERE source = $1 AND event_id = $2",
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
        created: r.get(5)?,
        payload: r.get(6)?,
        outbox: outbox
            .iter()
            .map(outbox_row)
            .collect::<anyhow::Result<_>>()?,
    }))
}

/// Outbox rows of `kind` and `status` (`None`: any), newest first, `limit` from `offset`.
pub(crate) fn outbox(
    conn: &dyn Session,
    kind: Option<&str>,
    status: Option<&str>,
    limit: i64,
    offset: i64,
) -> anyhow::Result<Vec<OutboxRow>> {
    let rows = conn.query(
        &format!(
            "SELECT {OUTBOX_COLUMNS} FROM outbox
             WHERE (CAST($1 AS TEXT) IS NULL OR kind = $1)
               AND (CAST($2 AS TEXT) IS NULL OR status = $2)
             ORDER BY id DESC LIMIT $3 OFFSET $4"
        ),
        &[&kind, &status, &limit, &offset],
    )?;
    rows.iter().map(outbox_row).collect()
}
