//! `GET /status`: one HTML page, rendered here, no script. At the top a line per source (its
//! last event's age, events per minute, refusals in the last 15 minutes); per source its last
//! events and its refusals by reason with their last messages, read from the database (so
//! they survive a restart), then what this instance answered since it started (duplicates
//! and failures are not in the ledger). Then the outbox (rows per kind and status, the dead
//! rows with their last error and a command's output; each delivery kind's lane: its pending
//! rows, paused while its breaker is open, attempts in flight) and the retention horizon;
//! version, uptime and when the config was loaded (with its file's hash) in the header; when
//! no instance was up before this one started (by the heartbeat), since when; and per source
//! its last recovery run (what the provider's API gave back).
//!
//! `POST /status/retry-dead` (the page's button) puts every dead row back to pending through
//! the writer. It needs the admin token in the form's `token` field or as a bearer token, never
//! basic auth: a browser sends basic auth by itself, so another site's form could use it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::response::Response;

use super::html::{age, counts_table, esc, link, page as html_page, param, q, TOKEN_FIELD};
use super::state::{commit, read_ledger, Admin};
use crate::metrics::{Activity, Lane, Outcome, Recovery};
use crate::refusals::UNKNOWN_SOURCE;
use crate::store::console::{SourceSummary, WINDOW_SECS};
use crate::store::listings::{OutboxRow, OutboxSummary};
use crate::store::{WalWatch, Write};
use crate::time::format_time;
use crate::time::unix_now;

/// Dead rows listed on the page (the newest).
const DEAD_ROWS: usize = 20;

/// What the page shows from the database.
struct Stored {
    sources: Vec<SourceSummary>,
    /// Requests for a name no source has, when there were some in the window.
    unknown: Option<SourceSummary>,
    outbox: OutboxSummary,
    dead: Vec<OutboxRow>,
    oldest_claim: Option<i64>,
}

pub(super) async fn page(State(admin): State<Arc<Admin>>, RawQuery(query): RawQuery) -> Response {
    let now = unix_now();
    let names = admin.metrics.source_names();
    let lanes: Vec<String> = admin.metrics.lanes().into_keys().collect();
    let read = read_ledger(&admin, move |conn| {
        let sources = crate::store::console::summaries(conn, &names, now)?;
        // Only refusals: no event has this source, so the ledger is not asked.
        let unknown = crate::store::console::refused(conn, UNKNOWN_SOURCE, now)?;
        let unknown = Some(unknown).filter(|u| u.refused() > 0);
        Ok(Stored {
            sources,
            unknown,
            outbox: crate::store::listings::outbox_summary(conn, &lanes)?,
            dead: crate::store::listings::outbox_dead(conn, DEAD_ROWS)?,
            oldest_claim: crate::store::listings::oldest_claim(conn)?,
        })
    });
    let stored = match read.await {
        Ok(stored) => stored,
        Err(refused) => return refused,
    };
    let revived =
        param(query.unwrap_or_default().as_bytes(), "revived").and_then(|v| v.parse::<u64>().ok());
    let html = render(&admin, &stored, &admin.metrics.activity(), revived, now);
    html_page("hookledger status", &html)
}

pub(super) async fn retry_dead(State(admin): State<Arc<Admin>>) -> Response {
    commit(&admin, Ok(Write::Revive { id: None }), |n| {
        log::info!("admin: {n} dead outbox rows put back to pending from /status");
        format!("/status?revived={n}")
    })
    .await
}

fn render(
    admin: &Admin,
    stored: &Stored,
    activity: &[(Arc<str>, Activity)],
    revived: Option<u64>,
    now: i64,
) -> String {
    let mut h = String::with_capacity(16 * 1024);
    let _ = write!(
        h,
        "<h1>hookledger status</h1><p class=note id=about>hookledger {} · up {} (since {} UTC) \
         · {} (UTC) · database {}</p>",
        env!("CARGO_PKG_VERSION"),
        age(now - admin.started_at),
        format_time(admin.started_at),
        format_time(now),
        esc(&admin.database.to_string()),
    );
    let (loaded_at, sha256) = admin.metrics.config();
    let _ = write!(
        h,
        "<p class=note id=config>config loaded {} UTC",
        format_time(loaded_at)
    );
    if let Some(sha256) = sha256 {
        let _ = write!(h, " · file sha256 <code>{}</code>", esc(&sha256));
    }
    h.push_str(" (SIGHUP reads it again)</p>");
    if let Some(n) = revived {
        let rows = if n == 1 { "row" } else { "rows" };
        let _ = write!(
            h,
            "<p class=flash id=revived>{n} dead {rows} put back to pending.</p>"
        );
    }
    if let Some(wal) = admin.metrics.wal() {
        wal_over(&mut h, wal, now);
    }
    if let Some(down) = admin.metrics.downtime() {
        let _ = write!(
            h,
            "<p class=refused id=downtime>Down from {} to {} UTC ({}): no instance was up, by \
             the heartbeat. Webhooks sent meanwhile were refused or lost; each source's recovery \
             (below) shows what its provider's API gave back.</p>",
            format_time(down.from),
            format_time(down.to),
            age(down.to - down.from),
        );
    }
    summary(&mut h, &stored.sources, now);
    if let Some(unknown) = &stored.unknown {
        let _ = write!(
            h,
            "<h2>Requests for no source</h2><p class=refused id=unknown-source>{} requests in \
             the last {} min named a source that does not exist.</p>",
            unknown.refused(),
            WINDOW_SECS / 60
        );
        refusals(&mut h, unknown, now);
    }
    sources(
        &mut h,
        &stored.sources,
        activity,
        &|name| admin.metrics.recovery(name),
        now,
    );
    outbox(&mut h, stored, &admin.metrics.lanes(), now);
    retention(&mut h, admin, stored, now);
    if let Some(wal) = admin.metrics.wal() {
        wal_size(&mut h, wal);
    }
    h
}

/// At the top while SQLite's write-ahead log stays past its bound, with what holds it.
fn wal_over(h: &mut String, wal: &WalWatch, now: i64) {
    let since = wal.over_since.load(Relaxed);
    if since == 0 {
        return;
    }
    let cause = if wal.pinned.load(Relaxed) {
        "a reader holds an old snapshot of the database (a long read transaction: a backup, \
         a sqlite3 shell), so no checkpoint can copy it back"
    } else {
        "the checkpoints do not keep up with the writes"
    };
    let _ = write!(
        h,
        "<p class=refused id=wal-over>The write-ahead log is {}, past its bound \
         (<code>storage.wal_limit_mb</code> = {}) for {}: {cause}.</p>",
        mib(wal.bytes.load(Relaxed)),
        wal.limit.load(Relaxed) >> 20,
        age(now - since),
    );
}

/// The write-ahead log's size against its bound, and the times it stayed past it.
fn wal_size(h: &mut String, wal: &WalWatch) {
    let times = wal.over_total.load(Relaxed);
    let _ = write!(
        h,
        "<h2>Storage</h2><ul><li id=wal>Write-ahead log: {} of a {} bound \
         (<code>storage.wal_limit_mb</code>); past it for over 2 s {times} {} since the \
         start.</li></ul>",
        mib(wal.bytes.load(Relaxed)),
        mib(wal.limit.load(Relaxed)),
        if times == 1 { "time" } else { "times" },
    );
}

/// `bytes` in MiB, one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// A line per source: what an operator looks at first.
fn summary(h: &mut String, sources: &[SourceSummary], now: i64) {
    let minutes = WINDOW_SECS / 60;
    h.push_str("<ul class=summary id=summary>");
    for s in sources {
        let name = esc(&s.source);
        let last = s.last_event_at.map_or_else(
            || "no event yet".to_string(),
            |at| format!("last event {} ago", age(now - at)),
        );
        let rate = s.events as f64 / minutes as f64;
        let _ = write!(
            h,
            "<li id=\"summary-{name}\"><a href=\"#source-{name}\"><b>{name}</b></a>: {last} · \
             {rate:.1} events/min · "
        );
        if s.refusals.is_empty() {
            let _ = write!(h, "no refusals in {minutes} min</li>");
            continue;
        }
        let reasons: Vec<String> = s
            .refusals
            .iter()
            .map(|r| format!("{} {}", esc(&r.reason), r.count))
            .collect();
        let _ = write!(
            h,
            "<span class=refused>{} refused in {minutes} min ({})</span></li>",
            s.refused(),
            reasons.join(", ")
        );
    }
    h.push_str("</ul>");
}

fn sources(
    h: &mut String,
    summaries: &[SourceSummary],
    activity: &[(Arc<str>, Activity)],
    recoveries: &dyn Fn(&str) -> Option<Recovery>,
    now: i64,
) {
    let minutes = WINDOW_SECS / 60;
    h.push_str("<h2>Sources</h2>");
    for s in summaries {
        let name = esc(&s.source);
        let _ = write!(
            h,
            "<section class=source id=\"source-{name}\"><h3>{name}</h3><p>Events in the last \
             {minutes} min: {} ({:.1}/min). <a href=\"/events?source={}\">Browse its \
             events</a></p>",
            s.events,
            s.events as f64 / minutes as f64,
            esc(&q(&s.source)),
        );
        if let Some(run) = recoveries(&s.source) {
            recovery(h, &name, &run, now);
        }
        refusals(h, s, now);
        if !s.recent.is_empty() {
            h.push_str(
                "<table class=ledger-events><tr><th>received (UTC)</th><th>event</th>\
                 <th>type</th></tr>",
            );
            for e in &s.recent {
                let _ = write!(
                    h,
                    "<tr class=ledger-event><td>{}</td><td><a href=\"{}\"><code>{}</code></a></td>\
                     <td>{}</td></tr>",
                    format_time(e.received_at),
                    esc(&link(&e.source, &e.event_id)),
                    esc(&e.event_id),
                    esc(&e.event_type),
                );
            }
            h.push_str("</table>");
        }
        if let Some((_, a)) = activity.iter().find(|(n, _)| **n == *s.source) {
            instance(h, a);
        }
        h.push_str("</section>");
    }
}

/// A source's last reconcile run: what it found and applied from the provider's API, or why
/// it stopped.
fn recovery(h: &mut String, name: &str, run: &Recovery, now: i64) {
    let when = format!(
        "last run {} UTC ({} ago)",
        format_time(run.at),
        age(now - run.at)
    );
    match &run.result {
        Ok(c) => {
            let _ = write!(
                h,
                "<p class=recovery id=\"recovery-{name}\">Recovery, {when}: found {}, applied {}",
                c.found, c.applied
            );
            if c.redelivered > 0 {
                let _ = write!(h, ", asked to redeliver {}", c.redelivered);
            }
            let _ = write!(
                h,
                ", already present {}, failed {}.</p>",
                c.already_present, c.failed
            );
        }
        Err(why) => {
            let _ = write!(
                h,
                "<p class=refused id=\"recovery-{name}\">Recovery, {when}: stopped: {}</p>",
                esc(why)
            );
        }
    }
}

/// A source's refusals by reason, with their last messages.
fn refusals(h: &mut String, s: &SourceSummary, now: i64) {
    let minutes = WINDOW_SECS / 60;
    if s.refusals.is_empty() {
        let _ = write!(
            h,
            "<p class=note>No requests refused in the last {minutes} min.</p>"
        );
        return;
    }
    let _ = write!(
        h,
        "<p class=refused>Requests refused in the last {minutes} min: {}.</p>\
         <table class=refusals><tr><th>reason</th><th>requests</th><th>last</th>\
         <th>last messages</th></tr>",
        s.refused()
    );
    for r in &s.refusals {
        let _ = write!(
            h,
            "<tr class=refusal><td class=refused>{}</td><td class=n>{}</td><td>{} ago</td><td>",
            esc(&r.reason),
            r.count,
            age(now - r.last_at)
        );
        for (at, message) in &r.messages {
            let _ = write!(
                h,
                "<div class=message>{} <span class=note>({} ago)</span></div>",
                esc(message),
                age(now - at)
            );
        }
        h.push_str("</td></tr>");
    }
    h.push_str("</table>");
}

/// What this instance answered since it started (duplicates and failures too).
fn instance(h: &mut String, a: &Activity) {
    let _ = write!(
        h,
        "<h4>This instance since it started</h4><p>Requests refused before an event could be \
         read (signature, size, body): {}.</p>",
        a.rejected
    );
    if a.minutes.is_empty() {
        h.push_str("<p class=note>No events yet.</p>");
        return;
    }
    h.push_str(
        "<table class=throughput><tr><th>minute (UTC)</th><th>processed</th>\
         <th>duplicate</th><th>failed</th></tr>",
    );
    for m in a.minutes.iter().rev() {
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td></tr>",
            &format_time(m.minute * 60)[..16],
            m.processed,
            m.duplicate,
            m.failed
        );
    }
    h.push_str(
        "</table><table class=events><tr><th>answered (UTC)</th><th>event</th>\
         <th>type</th><th>outcome</th><th>ms</th></tr>",
    );
    for e in &a.recent {
        let outcome = e.outcome.label();
        let reason = if e.outcome == Outcome::Failed {
            format!(" ({})", e.reason)
        } else {
            String::new()
        };
        let _ = write!(
            h,
            "<tr class=event><td>{}</td><td><code>{}</code></td><td>{}</td>\
             <td class=\"{outcome}\">{outcome}{reason}</td><td class=n>{:.1}</td></tr>",
            format_time(e.at),
            esc(&e.id),
            esc(&e.kind),
            e.millis
        );
    }
    h.push_str("</table>");
}

fn outbox(h: &mut String, stored: &Stored, lanes: &BTreeMap<String, Lane>, now: i64) {
    h.push_str("<h2>Outbox</h2><p><a href=/outbox>Browse the outbox</a></p>");
    counts_table(h, &stored.outbox);
    lanes_table(h, stored, lanes);
    if let Some(at) = stored.outbox.oldest_pending {
        let _ = write!(h, "<p>Oldest pending row queued {} ago.</p>", age(now - at));
    }
    h.push_str("<h3>Dead rows</h3>");
    if stored.dead.is_empty() {
        h.push_str("<p class=note>None.</p>");
        return;
    }
    let _ = write!(
        h,
        "<p class=note>The newest {DEAD_ROWS} at most.</p><table class=dead-rows><tr><th>row</th>\
         <th>kind</th><th>source</th><th>key</th><th>attempts</th><th>last attempt due (UTC)</th>\
         <th>last error</th></tr>"
    );
    for r in &stored.dead {
        let _ = write!(
            h,
            "<tr class=dead-row><td class=n><a href=\"/outbox/row?id={}\">{}</a></td><td>{}</td>\
             <td>{}</td><td><code>{}</code></td><td class=n>{}</td><td>{}</td>\
             <td class=dead>{}{}</td></tr>",
            r.id,
            r.id,
            esc(&r.kind),
            esc(&r.source),
            esc(&r.key),
            r.attempts,
            format_time(r.next_attempt_at),
            esc(r.last_error.as_deref().unwrap_or("")),
            // A command's last run: the end of what it printed.
            r.output.as_deref().map_or(String::new(), |o| format!(
                "<details><summary>output</summary><pre class=output>{}</pre></details>",
                esc(o)
            )),
        );
    }
    let _ = write!(
        h,
        "</table><form method=post action=/status/retry-dead>{TOKEN_FIELD}\
         <button type=submit id=retry-dead>Retry dead rows</button></form>"
    );
}

/// Each delivery kind's lane on this instance: its pending rows (paused while its breaker is
/// open), the breaker, attempts in flight, and the rows superseded by newer ones.
fn lanes_table(h: &mut String, stored: &Stored, lanes: &BTreeMap<String, Lane>) {
    if lanes.is_empty() {
        return;
    }
    h.push_str(
        "<h3>Lanes</h3><table class=lanes><tr><th>kind</th><th>pending</th><th>breaker</th>\
         <th>in flight</th><th>superseded</th></tr>",
    );
    for (kind, lane) in lanes {
        let count = |status: &str| {
            stored
                .outbox
                .counts
                .iter()
                .find(|c| c.kind == *kind && c.status == status)
                .map_or(0, |c| c.rows)
        };
        let (pending, breaker) = if lane.breaker_open {
            // Its pending rows wait for the probe.
            (format!("{} (paused)", count("pending")), "open")
        } else {
            (count("pending").to_string(), "closed")
        };
        let _ = write!(
            h,
            "<tr class=kind id=\"kind-{k}\"><td>{k}</td><td class=n>{pending}</td>\
             <td class=breaker>{breaker}</td><td class=n>{}</td><td class=n>{}</td></tr>",
            lane.in_flight,
            count("superseded"),
            k = esc(kind),
        );
    }
    h.push_str("</table>");
}

fn retention(h: &mut String, admin: &Admin, stored: &Stored, now: i64) {
    let r = &admin.retention;
    let before = |days: u64| match crate::retention::window(days) {
        Some(age) if now.saturating_sub(age) > 0 => {
            format!("those received before {}", format_time(now - age))
        }
        _ => "none".to_string(),
    };
    let _ = write!(
        h,
        "<h2>Retention</h2><ul><li>Claims are kept {}: {} are pruned, and a resend of one is \
         then new again.</li><li>Payloads are kept {}: {} are cleared.</li><li>Oldest claim in \
         the ledger: {}.</li></ul>",
        crate::config::describe_days(r.claim_days),
        before(r.claim_days),
        crate::config::describe_days(r.payload_days),
        before(r.payload_days),
        stored
            .oldest_claim
            .map_or_else(|| "none".to_string(), format_time)
    );
}
