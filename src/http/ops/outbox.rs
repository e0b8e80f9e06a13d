//! The outbox by kind and status: `GET /outbox?kind=…&status=…` lists rows newest first with
//! their target (URL or command), attempts, last error and a command's output tail; `GET
//! /outbox/row?id=…` shows one. `POST /outbox/retry` puts one dead row back to pending, `POST
//! /outbox/retry-dead` the dead rows of one kind (both with the admin token). A status is shown
//! as the database has it, whatever it is.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::html::{age, esc, page, param, q, tail, TOKEN_FIELD};
use super::{change, read_ledger, read_refusal, Admin};
use crate::store::listings::{OutboxRow, OutboxSummary};
use crate::store::Write;
use crate::time::{format_time, unix_now};

/// Rows a page.
const PAGE: i64 = 50;
/// The end of a command's output shown in a list.
const OUTPUT_TAIL: usize = 600;

/// Rows per kind and status, each count a link to those rows, and a button per kind with
/// dead rows.
pub(super) fn counts_table(h: &mut String, outbox: &OutboxSummary) {
    let mut kinds: Vec<&str> = outbox.counts.iter().map(|c| c.kind.as_str()).collect();
    kinds.dedup();
    if kinds.is_empty() {
        h.push_str("<p class=note>No rows.</p>");
        return;
    }
    let statuses = super::status::statuses(outbox);
    h.push_str("<table class=outbox><tr><th>kind</th>");
    for s in &statuses {
        let _ = write!(h, "<th>{}</th>", esc(s));
    }
    h.push_str("</tr>");
    for kind in kinds {
        let _ = write!(h, "<tr><td>{}</td>", esc(kind));
        for status in &statuses {
            let n = outbox
                .counts
                .iter()
                .find(|c| c.kind == kind && c.status == *status)
                .map_or(0, |c| c.rows);
            let _ = write!(h, "<td class=n>{n}</td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

/// The target of `kind` as configured here, or a dash.
fn target<'a>(admin: &'a Admin, kind: &str) -> &'a str {
    admin
        .targets
        .iter()
        .find(|(k, _)| k == kind)
        .map_or("-", |(_, t)| t.as_str())
}

/// Outbox rows with their target, attempts, last error and output tail; dead rows get a
/// retry button.
pub(super) fn rows_table(h: &mut String, admin: &Admin, rows: &[OutboxRow], now: i64) {
    h.push_str(
        "<table class=outbox-rows><tr><th>row</th><th>kind</th><th>target</th><th>event</th>\
         <th>status</th><th>attempts</th><th>next attempt / done</th><th>last error</th>\
         <th>output (tail)</th><th></th></tr>",
    );
    for r in rows {
        let when = match (r.done_at, r.status.as_str()) {
            (Some(at), _) => format!("done {} ago", age(now - at)),
            (None, "pending") if r.next_attempt_at > now => {
                format!("in {}", age(r.next_attempt_at - now))
            }
            (None, "pending") => "due now".to_string(),
            _ => format_time(r.next_attempt_at),
        };
        let output = r
            .output
            .as_deref()
            .map(|o| format!("<pre class=output>{}</pre>", esc(&tail(o, OUTPUT_TAIL))))
            .unwrap_or_default();
        let status = esc(&r.status);
        let _ = write!(
            h,
            "<tr class=\"outbox-row status-{status}\" id=\"row-{id}\"><td class=n>\
             <a href=\"/outbox/row?id={id}\">{id}</a></td><td>{}</td><td><code>{}</code></td>\
             <td><a href=\"{}\"><code>{}</code></a> <span class=note>{}</span></td>\
             <td class=\"{status}\">{status}</td><td class=n>{}</td><td>{when}</td>\
             <td class=last-error>{}</td><td>{output}</td><td>",
            esc(&r.kind),
            esc(target(admin, &r.kind)),
            esc(&super::events::link(&r.source, &r.key)),
            esc(&r.key),
            esc(&r.source),
            r.attempts,
            esc(r.last_error.as_deref().unwrap_or("")),
            id = r.id,
        );
        if r.status == "dead" {
            let _ = write!(
                h,
                "<form method=post action=/outbox/retry class=retry-one>\
                 <input type=hidden name=id value=\"{id}\">{TOKEN_FIELD}\
                 <button type=submit id=\"retry-{id}\">Retry this row</button></form>",
                id = r.id
            );
        }
        h.push_str("</td></tr>");
    }
    h.push_str("</table>");
}

pub(super) async fn list(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Some(refused) = read_refusal(&admin, &headers) {
        return refused;
    }
    let query = query.unwrap_or_default();
    let (kind, status) = (
        param(query.as_bytes(), "kind"),
        param(query.as_bytes(), "status"),
    );
    let retried = param(query.as_bytes(), "retried");
    let before = param(query.as_bytes(), "before").and_then(|p| p.parse::<i64>().ok());
    let (k, s) = (kind.clone(), status.clone());
    let read = read_ledger(&admin, move |conn| {
        Ok((
            crate::store::listings::outbox_summary(conn)?,
            crate::store::console::outbox(conn, k.as_deref(), s.as_deref(), PAGE + 1, before)?,
        ))
    });
    let (summary, rows) = match read.await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    let now = unix_now();
    let mut h = String::with_capacity(16 * 1024);
    h.push_str("<h1>Outbox</h1>");
    if let Some(n) = retried {
        let _ = write!(
            h,
            "<p class=flash id=retried>{} dead row(s) put back to pending.</p>",
            esc(&n)
        );
    }
    counts_table(&mut h, &summary);
    // Filters: a link per kind and status.
    let mut kinds: Vec<&str> = summary.counts.iter().map(|c| c.kind.as_str()).collect();
    kinds.dedup();
    h.push_str("<p class=filters>Kind: <a href=/outbox>any</a>");
    for k in &kinds {
        let _ = write!(h, " <a href=\"/outbox?kind={}\">{}</a>", esc(&q(k)), esc(k));
    }
    h.push_str(" · Status:");
    for s in super::status::statuses(&summary) {
        let mut at = format!("/outbox?status={}", q(&s));
        if let Some(k) = &kind {
            at.push_str(&format!("&kind={}", q(k)));
        }
        let _ = write!(h, " <a href=\"{}\">{}</a>", esc(&at), esc(&s));
    }
    h.push_str("</p>");
    let _ = write!(
        h,
        "<h2>Rows{}{}</h2>",
        kind.as_deref()
            .map(|k| format!(" of kind {}", esc(k)))
            .unwrap_or_default(),
        status
            .as_deref()
            .map(|s| format!(", {}", esc(s)))
            .unwrap_or_default(),
    );
    if let Some(k) = &kind {
        let dead = summary
            .counts
            .iter()
            .filter(|c| c.kind == *k && c.status == "dead")
            .map(|c| c.rows)
            .sum::<i64>();
        if dead > 0 {
            let _ = write!(
                h,
                "<form method=post action=/outbox/retry-dead id=retry-kind-form>\
                 <input type=hidden name=kind value=\"{}\">{TOKEN_FIELD}\
                 <button type=submit id=retry-kind>Retry the {dead} dead rows of {}</button></form>",
                esc(k),
                esc(k)
            );
        }
    }
    if rows.is_empty() {
        h.push_str("<p class=note>No rows.</p>");
    } else {
        rows_table(&mut h, &admin, &rows[..rows.len().min(PAGE as usize)], now);
    }
    let others: String = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k != "before" && k != "retried")
        .fold(
            url::form_urlencoded::Serializer::new(String::new()),
            |mut s, (k, v)| {
                s.append_pair(&k, &v);
                s
            },
        )
        .finish();
    // Paged by id, not by offset: a page costs the same however deep.
    if before.is_some() {
        let at = format!("/outbox?{others}");
        let _ = write!(h, "<a id=newest href=\"{}\">← newest</a> ", esc(&at));
    }
    if let (true, Some(last)) = (rows.len() as i64 > PAGE, rows.get(PAGE as usize - 1)) {
        let sep = if others.is_empty() { "" } else { "&" };
        let at = format!("/outbox?{others}{sep}before={}", last.id);
        let _ = write!(h, "<a id=older href=\"{}\">older →</a>", esc(&at));
    }
    page("Outbox", &h)
}

pub(super) async fn show(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if let Some(refused) = read_refusal(&admin, &headers) {
        return refused;
    }
    let query = query.unwrap_or_default();
    let Some(id) = param(query.as_bytes(), "id").and_then(|i| i.parse::<i64>().ok()) else {
        return (StatusCode::BAD_REQUEST, "`id` must be a row number\n").into_response();
    };
    let retried = param(query.as_bytes(), "retried");
    let read = read_ledger(&admin, move |conn| {
        crate::store::listings::outbox_show(conn, id)
    });
    let row = match read.await {
        Ok(Some(row)) => row,
        Ok(None) => {
            let mut answer = page(
                "No such row",
                &format!("<h1>No such row</h1><p class=error>No outbox row {id}.</p>"),
            );
            *answer.status_mut() = StatusCode::NOT_FOUND;
            return answer;
        }
        Err(refused) => return refused,
    };
    let mut h = format!("<h1>Outbox row {id}</h1>");
    match retried.as_deref() {
        Some("0") => {
            h.push_str("<p class=error id=retried>Not retried: the row is not dead (any more).</p>")
        }
        Some(_) => h.push_str("<p class=flash id=retried>Put back to pending.</p>"),
        None => {}
    }
    rows_table(&mut h, &admin, std::slice::from_ref(&row), unix_now());
    if let Some(output) = &row.output {
        let _ = write!(
            h,
            "<h2>Output of its command (the end)</h2><pre id=output>{}</pre>",
            esc(output)
        );
    }
    page(&format!("Outbox row {id}"), &h)
}

pub(super) async fn retry(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    form: Bytes,
) -> Response {
    let id = param(&form, "id").and_then(|i| i.parse::<i64>().ok());
    change(
        &admin,
        &headers,
        &form,
        id.map(|id| Write::Revive { id: Some(id) })
            .ok_or_else(|| "`id` must be a row number".to_string()),
        |n| {
            let id = id.unwrap_or_default();
            log::info!("admin: outbox row {id} retried from the console ({n} row)");
            format!("/outbox/row?id={id}&retried={n}")
        },
    )
    .await
}

pub(super) async fn retry_dead(
    State(admin): State<Arc<Admin>>,
    headers: HeaderMap,
    form: Bytes,
) -> Response {
    let kind = param(&form, "kind");
    let back = kind.clone().unwrap_or_default();
    change(
        &admin,
        &headers,
        &form,
        kind.map(|kind| Write::ReviveKind { kind })
            .ok_or_else(|| "`kind` is required".to_string()),
        |n| {
            log::info!("admin: {n} dead outbox rows of {back} retried from the console");
            format!("/outbox?kind={}&retried={n}", q(&back))
        },
    )
    .await
}
