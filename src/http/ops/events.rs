//! The events browser: `GET /events` lists the ledger's events, newest first, filtered by
//! source, type, the start of the id and a time range, [`PAGE`] a page; `GET
//! /event?source=…&id=…` shows one: its payload (pretty-printed JSON when it is JSON, always
//! escaped), its outcome and its outbox rows. `POST /event/replay` (the page's button, with the
//! admin token) queues its forward again, as `hookledger replay` does.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::html::{esc, link, page, param, query_without, rows_table, TOKEN_FIELD};
use super::state::{commit, read_ledger, Admin};
use crate::store::console::{EventDetail, EventFilter, EventKey, EventLine};
use crate::store::Write;
use crate::time::{format_time, parse_rfc3339, unix_now};

/// Events a page.
const PAGE: i64 = 50;

/// A time as the filter takes it: RFC 3339, `YYYY-MM-DDTHH:MM[:SS]` or `YYYY-MM-DD HH:MM`
/// in UTC (what a `datetime-local` field sends), a date alone, or Unix seconds.
fn parse_when(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<i64>() {
        return Some(secs);
    }
    if let Some(t) = parse_rfc3339(text) {
        return Some(t);
    }
    let full = match text.len() {
        10 => format!("{text}T00:00:00Z"),
        16 => format!("{text}:00Z"),
        19 => format!("{text}Z"),
        _ => return None,
    };
    parse_rfc3339(&full)
}

/// The filter of a query string, and what could not be read in it.
fn filter_of(query: &[u8]) -> (EventFilter, Vec<String>) {
    let mut errors = Vec::new();
    let mut when = |key: &str| {
        let text = param(query, key)?;
        let parsed = parse_when(&text);
        if parsed.is_none() {
            errors.push(format!(
                "`{key}`: {text} is not a time (2026-12-01T19:00, RFC 3339, or Unix seconds)"
            ));
        }
        parsed
    };
    let (from, to) = (when("from"), when("to"));
    let filter = EventFilter {
        source: param(query, "source"),
        event_type: param(query, "type"),
        id_prefix: param(query, "id"),
        from,
        to,
    };
    (filter, errors)
}

pub(super) async fn list(State(admin): State<Arc<Admin>>, RawQuery(query): RawQuery) -> Response {
    let query = query.unwrap_or_default();
    let (filter, errors) = filter_of(query.as_bytes());
    let after = key_of(query.as_bytes());
    let found = if errors.is_empty() {
        let (filter, key) = (filter.clone(), after.clone());
        let read = read_ledger(&admin, move |conn| {
            crate::store::console::events(conn, &filter, PAGE + 1, key.as_ref())
        });
        match read.await {
            Ok(found) => found,
            Err(refused) => return refused,
        }
    } else {
        Vec::new()
    };
    let mut h = String::with_capacity(16 * 1024);
    h.push_str("<h1>Events</h1>");
    form(&mut h, &admin, &filter);
    for e in &errors {
        let _ = write!(h, "<p class=error>{}</p>", esc(e));
    }
    results(&mut h, &found, &query, after.is_some());
    page("Events", &h)
}

fn form(h: &mut String, admin: &Admin, f: &EventFilter) {
    let value = |v: &Option<String>| esc(v.as_deref().unwrap_or(""));
    let when = |t: Option<i64>| t.map(format_time).unwrap_or_default();
    h.push_str(
        "<form method=get action=/events id=filter><label>Source <select name=source>\
         <option value=\"\">any</option>",
    );
    for s in &admin.metrics.source_names() {
        let selected = if f.source.as_deref() == Some(s) {
            " selected"
        } else {
            ""
        };
        let _ = write!(h, "<option value=\"{0}\"{selected}>{0}</option>", esc(s));
    }
    let _ = write!(
        h,
        "</select></label> <label>Type <input name=type value=\"{}\"></label> \
         <label>Id starts with <input name=id value=\"{}\"></label> \
         <label>From (UTC) <input name=from placeholder=\"2026-12-01 19:00\" value=\"{}\"></label> \
         <label>To <input name=to value=\"{}\"></label> \
         <button type=submit id=search>Search</button></form>",
        value(&f.event_type),
        value(&f.id_prefix),
        esc(&when(f.from)),
        esc(&when(f.to)),
    );
}

/// Where the page starts (`after_at`, `after_source`, `after_id`: the last event of the page
/// before), or `None` for the newest.
fn key_of(query: &[u8]) -> Option<EventKey> {
    Some(EventKey {
        received_at: param(query, "after_at")?.parse().ok()?,
        source: param(query, "after_source")?,
        event_id: param(query, "after_id")?,
    })
}

fn results(h: &mut String, found: &[EventLine], query: &str, paged: bool) {
    if found.is_empty() {
        h.push_str("<p class=note id=no-events>No events match.</p>");
    } else {
        h.push_str(
            "<table class=events-found><tr><th>received (UTC)</th><th>source</th><th>event</th>\
             <th>type</th><th>payload</th></tr>",
        );
        for e in found.iter().take(PAGE as usize) {
            let payload = e
                .payload_bytes
                .map_or_else(|| "cleared".to_string(), |n| format!("{n} bytes"));
            let _ = write!(
                h,
                "<tr class=found><td>{}</td><td>{}</td><td><a class=event-link href=\"{}\">\
                 <code>{}</code></a></td><td>{}</td><td class=n>{payload}</td></tr>",
                format_time(e.received_at),
                esc(&e.source),
                esc(&link(&e.source, &e.event_id)),
                esc(&e.event_id),
                esc(&e.event_type),
            );
        }
        h.push_str("</table>");
    }
    // The same filter from another key.
    let others = query_without(query, |k| k.starts_with("after_"));
    if paged {
        let _ = write!(
            h,
            "<a id=newest href=\"{}\">← newest</a> ",
            esc(&format!("/events?{others}"))
        );
    }
    if let (true, Some(last)) = (found.len() as i64 > PAGE, found.get(PAGE as usize - 1)) {
        let mut at = url::form_urlencoded::Serializer::new(String::new());
        at.append_pair("after_at", &last.received_at.to_string())
            .append_pair("after_source", &last.source)
            .append_pair("after_id", &last.event_id);
        let sep = if others.is_empty() { "" } else { "&" };
        let _ = write!(
            h,
            "<a id=older href=\"{}\">older →</a>",
            esc(&format!("/events?{others}{sep}{}", at.finish()))
        );
    }
}

pub(super) async fn show(State(admin): State<Arc<Admin>>, RawQuery(query): RawQuery) -> Response {
    let query = query.unwrap_or_default();
    let (Some(source), Some(id)) = (
        param(query.as_bytes(), "source"),
        param(query.as_bytes(), "id"),
    ) else {
        return (StatusCode::BAD_REQUEST, "`source` and `id` are required\n").into_response();
    };
    let replayed = param(query.as_bytes(), "replayed");
    let (s, i) = (source.clone(), id.clone());
    let found = read_ledger(&admin, move |conn| {
        crate::store::console::event(conn, &s, &i)
    });
    let detail = match found.await {
        Ok(Some(detail)) => detail,
        Ok(None) => {
            let body = format!(
                "<h1>No such event</h1><p class=error>No event <code>{}</code> of source {} in \
                 the ledger (never received, or pruned after the retention age).</p>",
                esc(&id),
                esc(&source)
            );
            let mut answer = page("No such event", &body);
            *answer.status_mut() = StatusCode::NOT_FOUND;
            return answer;
        }
        Err(refused) => return refused,
    };
    page(
        &format!("Event {id}"),
        &render_event(&admin, &detail, replayed.as_deref(), unix_now()),
    )
}

fn render_event(admin: &Admin, d: &EventDetail, replayed: Option<&str>, now: i64) -> String {
    let e = &d.line;
    let mut h = String::with_capacity(8 * 1024);
    let _ = write!(
        h,
        "<h1>Event <code id=event-id>{}</code></h1>",
        esc(&e.event_id)
    );
    match replayed {
        Some("0") => h.push_str(
            "<p class=error id=replayed>Not replayed: its payload was cleared after the \
             retention age, or the event is gone.</p>",
        ),
        Some(_) => h.push_str(
            "<p class=flash id=replayed>Replayed: its forward is queued again (below).</p>",
        ),
        None => {}
    }
    let created = d.created.map(format_time).unwrap_or_else(|| "-".into());
    let _ = write!(
        h,
        "<table class=event-facts><tr><th>source</th><td id=event-source>{}</td></tr>\
         <tr><th>type</th><td id=event-type>{}</td></tr>\
         <tr><th>received (UTC)</th><td>{}</td></tr><tr><th>created (UTC)</th><td>{created}</td></tr>\
         <tr><th>outcome</th><td class=processed id=outcome>processed: claimed in the ledger, \
         its handlers' effects committed with the claim</td></tr></table>",
        esc(&e.source),
        esc(&e.event_type),
        format_time(e.received_at),
    );
    h.push_str("<h2>Outbox rows</h2>");
    if d.outbox.is_empty() {
        h.push_str("<p class=note>None: nothing was queued for it.</p>");
    } else {
        rows_table(&mut h, &admin.targets, &d.outbox, now);
    }
    let _ = write!(
        h,
        "<form method=post action=/event/replay id=replay-form>\
         <input type=hidden name=source value=\"{}\"><input type=hidden name=id value=\"{}\">\
         {TOKEN_FIELD}<button type=submit id=replay>Replay</button> <span class=note>queues \
         its forward again (a new row, or its row back to pending)</span></form>",
        esc(&e.source),
        esc(&e.event_id),
    );
    h.push_str("<h2>Payload</h2>");
    match &d.payload {
        None => h.push_str("<p class=note>Cleared after the retention age.</p>"),
        Some(bytes) => {
            let text = match serde_json::from_slice::<serde_json::Value>(bytes) {
                Ok(json) => serde_json::to_string_pretty(&json)
                    .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned()),
                Err(_) => String::from_utf8_lossy(bytes).into_owned(),
            };
            let _ = write!(h, "<pre id=payload>{}</pre>", esc(&text));
        }
    }
    h
}

pub(super) async fn replay(State(admin): State<Arc<Admin>>, form: Bytes) -> Response {
    let (source, id) = (param(&form, "source"), param(&form, "id"));
    let back = (source.clone(), id.clone());
    commit(
        &admin,
        match (source, id) {
            (Some(source), Some(event_id)) => Ok(Write::Replay { source, event_id }),
            _ => Err("`source` and `id` are required".to_string()),
        },
        |n| {
            let (source, id) = back;
            let (source, id) = (source.unwrap_or_default(), id.unwrap_or_default());
            log::info!("admin: event {id} of {source} replayed from the console ({n} row)");
            format!("{}&replayed={n}", link(&source, &id))
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_in_the_forms_a_person_types() {
        let t = parse_rfc3339("2026-12-01T19:00:00Z").unwrap();
        assert_eq!(parse_when("2026-12-01T19:00"), Some(t));
        assert_eq!(parse_when("2026-12-01 19:00"), Some(t));
        assert_eq!(parse_when("2026-12-01 19:00:00"), Some(t));
        assert_eq!(parse_when("2026-12-01T19:00:00Z"), Some(t));
        assert_eq!(parse_when(&t.to_string()), Some(t));
        assert_eq!(parse_when("2026-12-01"), Some(t - 19 * 3600));
        assert_eq!(parse_when("yesterday"), None);
        let (filter, errors) = filter_of(b"source=stripe&id=evt_1&from=soon&to=2026-12-01");
        assert_eq!(filter.source.as_deref(), Some("stripe"));
        assert_eq!(filter.id_prefix.as_deref(), Some("evt_1"));
        assert_eq!(filter.from, None);
        assert_eq!(filter.to, Some(t - 19 * 3600));
        assert_eq!(errors.len(), 1, "{errors:?}");
    }
}
