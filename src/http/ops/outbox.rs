//! The outbox by kind and status: `GET /outbox?kind=…&status=…` lists rows newest first with
//! their target (URL or command), attempts, last error and a command's output tail; `GET
//! /outbox/row?id=…` shows one. `POST /outbox/retry` puts one dead row back to pending, `POST
//! /outbox/retry-dead` the dead rows of one kind (both with the admin token). A status is shown
//! as the database has it, whatever it is.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::html::{
    counts_table, esc, page, param, q, query_without, rows_table, statuses, TOKEN_FIELD,
};
use super::state::{commit, read_ledger, Admin};
use crate::store::Write;
use crate::time::unix_now;

/// Rows a page.
const PAGE: i64 = 50;

pub(super) async fn list(State(admin): State<Arc<Admin>>, RawQuery(query): RawQuery) -> Response {
    let query = query.unwrap_or_default();
    let (kind, status) = (
        param(query.as_bytes(), "kind"),
        param(query.as_bytes(), "status"),
    );
    let retried = param(query.as_bytes(), "retried");
    let before = param(query.as_bytes(), "before").and_then(|p| p.parse::<i64>().ok());
    let (k, s) = (kind.clone(), status.clone());
    let lanes: Vec<String> = admin.metrics.lanes().into_keys().collect();
    let read = read_ledger(&admin, move |conn| {
        Ok((
            crate::store::listings::outbox_summary(conn, &lanes)?,
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
    for s in statuses(&summary) {
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
        rows_table(
            &mut h,
            &admin.targets,
            &rows[..rows.len().min(PAGE as usize)],
            now,
        );
    }
    let others = query_without(&query, |k| k == "before" || k == "retried");
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

pub(super) async fn show(State(admin): State<Arc<Admin>>, RawQuery(query): RawQuery) -> Response {
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
    rows_table(
        &mut h,
        &admin.targets,
        std::slice::from_ref(&row),
        unix_now(),
    );
    if let Some(output) = &row.output {
        let _ = write!(
            h,
            "<h2>Output of its command (the end)</h2><pre id=output>{}</pre>",
            esc(output)
        );
    }
    page(&format!("Outbox row {id}"), &h)
}

pub(super) async fn retry(State(admin): State<Arc<Admin>>, form: Bytes) -> Response {
    let id = param(&form, "id").and_then(|i| i.parse::<i64>().ok());
    commit(
        &admin,
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

pub(super) async fn retry_dead(State(admin): State<Arc<Admin>>, form: Bytes) -> Response {
    let kind = param(&form, "kind");
    let back = kind.clone().unwrap_or_default();
    commit(
        &admin,
        kind.map(|kind| Write::ReviveKind { kind })
            .ok_or_else(|| "`kind` is required".to_string()),
        |n| {
            log::info!("admin: {n} dead outbox rows of {back} retried from the console");
            format!("/outbox?kind={}&retried={n}", q(&back))
        },
    )
    .await
}
