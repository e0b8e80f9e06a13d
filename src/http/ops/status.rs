//! `GET /status`: one HTML page, rendered here, no script. Per source: this instance's events
//! per minute and its last events with their outcomes. Then the outbox (rows per kind and
//! status, superseded and paused among them, each kind's breaker and attempts in flight; the
//! dead rows with their last error and a command's output) and the retention horizon.
//!
//! `POST /status/retry-dead` (the page's button) puts every dead row back to pending through
//! the writer. It needs the admin token in the form's `token` field or as a bearer token, never
//! basic auth: a browser sends basic auth by itself, so another site's form could use it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};

use super::{read_ledger, read_refusal, refusal, Admin, Auth};
use crate::metrics::{Activity, Lane, Outcome};
use crate::store::listings::{OutboxRow, OutboxSummary};
use crate::store::Write;
use crate::time::format_time;
use crate::time::unix_now;

/// Dead rows listed on the page (the newest).
const DEAD_ROWS: usize = 20;

/// What the page shows from the database.
struct Stored {
    outbox: OutboxSummary,
    dead: Vec<OutboxRow>,
    oldest_claim: Option<i64>,
}

pub(super) async fn page(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Some(refused) = read_refusal(&admin, &headers) {
        return refused;
    }
    let read = read_ledger(&admin, |conn| {
        Ok(Stored {
            outbox: crate::store::listings::outbox_summary(conn)?,
            dead: crate::store::listings::outbox_dead(conn, DEAD_ROWS)?,
            oldest_claim: crate::store::listings::oldest_claim(conn)?,
        })
    });
    let stored = match read.await {
        Ok(stored) => stored,
        Err(refused) => return refused,
    };
    let revived = query.as_deref().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "revived")
            .and_then(|(_, v)| v.parse::<u64>().ok())
    });
    let html = render(
        &admin,
        &stored,
        &admin.metrics.activity(),
        revived,
        unix_now(),
    );
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            // Its button changes data: no other site may frame it.
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        Html(html),
    )
        .into_response()
}

pub(super) async fn retry_dead(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    form: Bytes,
) -> Response {
    let token = url::form_urlencoded::parse(&form)
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned());
    if let Some(refused) = refusal(&admin, &headers, Auth::form_or_bearer(token.as_deref())) {
        return refused;
    }
    let writer = admin.writer.clone();
    let revived =
        tokio::task::spawn_blocking(move || writer.run_blocking(Write::Revive { id: None })).await;
    match revived {
        Ok(Ok(n)) => {
            log::info!("admin: {n} dead outbox rows put back to pending from /status");
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("/status?revived={n}"))],
            )
                .into_response()
        }
        Ok(Err(e)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the dead rows were not revived: {e}\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the dead rows were not revived: {e}\n"),
        )
            .into_response(),
    }
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:70em;\
padding:0 1em;color:#222}h1{font-size:1.4em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .6em;\
text-align:left;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right}\
.processed{color:#176117}.duplicate{color:#555}.failed,.dead{color:#a11}\
.note{color:#666}.flash{background:#eef7ee;border:1px solid #9c9;padding:.4em .8em}\
code{font-size:.95em}";

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
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <title>hookledger status</title><style>{STYLE}</style></head><body>\
         <h1>hookledger status</h1><p class=note>{} (UTC) · database {}</p>",
        format_time(now),
        esc(&admin.database.to_string()),
    );
    if let Some(n) = revived {
        let rows = if n == 1 { "row" } else { "rows" };
        let _ = write!(
            h,
            "<p class=flash id=revived>{n} dead {rows} put back to pending.</p>"
        );
    }
    sources(&mut h, activity);
    outbox(&mut h, stored, &admin.metrics.lanes(), now);
    retention(&mut h, admin, stored, now);
    h.push_str("</body></html>\n");
    h
}

fn sources(h: &mut String, activity: &[(Arc<str>, Activity)]) {
    h.push_str("<h2>Sources</h2><p class=note>What this instance answered since it started.</p>");
    for (name, a) in activity {
        let name = esc(name);
        let _ = write!(
            h,
            "<section class=source id=\"source-{name}\"><h3>{name}</h3>\
             <p>Requests refused before an event could be read (signature, size, body): {}.</p>",
            a.rejected
        );
        if a.minutes.is_empty() {
            h.push_str("<p class=note>No events yet.</p></section>");
            continue;
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
                 <td class={outcome}>{outcome}{reason}</td><td class=n>{:.1}</td></tr>",
                format_time(e.at),
                esc(&e.id),
                esc(&e.kind),
                e.millis
            );
        }
        h.push_str("</table></section>");
    }
}

fn outbox(h: &mut String, stored: &Stored, lanes: &BTreeMap<String, Lane>, now: i64) {
    h.push_str("<h2>Outbox</h2>");
    // The kinds with rows, and the lanes with none yet.
    let kinds: BTreeSet<&str> = (stored.outbox.counts.iter().map(|c| c.kind.as_str()))
        .chain(lanes.keys().map(String::as_str))
        .collect();
    if kinds.is_empty() {
        h.push_str("<p class=note>No rows.</p>");
    } else {
        h.push_str(
            "<table class=outbox><tr><th>kind</th><th>pending</th><th>done</th><th>dead</th>\
             <th>superseded</th><th>in flight</th><th>breaker</th></tr>",
        );
        for kind in kinds {
            let count = |status: &str| {
                stored
                    .outbox
                    .counts
                    .iter()
                    .find(|c| c.kind == kind && c.status == status)
                    .map_or(0, |c| c.rows)
            };
            let lane = lanes.get(kind);
            let (pending, breaker) = match lane {
                // Its pending rows wait for the probe.
                Some(l) if l.breaker_open => (format!("{} (paused)", count("pending")), "open"),
                Some(_) => (count("pending").to_string(), "closed"),
                None => (count("pending").to_string(), "no delivery"),
            };
            let _ = write!(
                h,
                "<tr class=kind id=\"kind-{k}\"><td>{k}</td><td class=n>{pending}</td>\
                 <td class=n>{}</td><td class=n>{}</td><td class=n>{}</td><td class=n>{}</td>\
                 <td class=breaker>{breaker}</td></tr>",
                count("done"),
                count("dead"),
                count("superseded"),
                lane.map_or(0, |l| l.in_flight),
                k = esc(kind),
            );
        }
        h.push_str("</table>");
    }
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
            "<tr class=dead-row><td class=n>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td>\
             <td class=n>{}</td><td>{}</td><td class=dead>{}{}</td></tr>",
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
    h.push_str(
        "</table><form method=post action=/status/retry-dead>\
         <label>Admin token <input type=password name=token autocomplete=off required></label> \
         <button type=submit id=retry-dead>Retry dead rows</button></form>",
    );
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

/// `42 s`, `3 min`, `5 h`, `2 days`.
fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172_800 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// `text` safe in HTML text and in a double-quoted attribute.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_for_html_and_attributes() {
        assert_eq!(
            esc(r#"<script>alert("x&y's")</script>"#),
            "&lt;script&gt;alert(&quot;x&amp;y&#39;s&quot;)&lt;/script&gt;"
        );
    }

    #[test]
    fn ages_read_in_the_unit_that_fits() {
        assert_eq!(age(-5), "0 s");
        assert_eq!(age(119), "119 s");
        assert_eq!(age(600), "10 min");
        assert_eq!(age(3 * 3600), "3 h");
        assert_eq!(age(5 * 86_400), "5 days");
    }
}
