//! What the console's pages share: the frame (style, navigation), escaping, ages, the token
//! field of a form that changes data, query strings, and the tables more than one page shows.
//!
//! Every value that comes from a request or a target's answer (an event's type, its payload,
//! a target's error body) goes through [`esc`]; the pages have no script, and their answers
//! say so (`Content-Security-Policy: script-src 'none'`), so even a value that escaped would
//! not run.

use std::fmt::Write as _;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

use crate::store::listings::{OutboxRow, OutboxSummary};
use crate::time::format_time;

/// The end of a command's output shown in a list.
const OUTPUT_TAIL: usize = 600;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:78em;\
padding:0 1em;color:#222}h1{font-size:1.4em}h2{border-bottom:1px solid #ccc;margin-top:1.6em}\
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .6em;\
text-align:left;vertical-align:top}th{background:#f4f4f4}td.n{text-align:right}\
.processed,.done{color:#176117}.duplicate{color:#555}.failed,.dead,.refused{color:#a11}\
.note{color:#666}.flash{background:#eef7ee;border:1px solid #9c9;padding:.4em .8em}\
.error{background:#fbeeee;border:1px solid #c99;padding:.4em .8em}\
nav a{margin-right:1em}pre{background:#f7f7f7;padding:.6em;overflow:auto;max-height:40em}\
code{font-size:.95em}form.inline{display:inline}ul.summary li{margin:.2em 0}";

/// A whole page: `title`, the navigation, then `body`.
pub(super) fn page(title: &str, body: &str) -> Response {
    let mut h = String::with_capacity(body.len() + 2048);
    let _ = writeln!(
        h,
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <title>{} · hookledger</title><style>{STYLE}</style></head><body>\
         <nav><a href=/status>Status</a><a href=/events>Events</a><a href=/outbox>Outbox</a>\
         </nav>{body}</body></html>",
        esc(title)
    );
    (
        [
            (header::CACHE_CONTROL, "no-store"),
            // Its buttons change data: no other site may frame it.
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                 frame-ancestors 'none'",
            ),
        ],
        Html(h),
    )
        .into_response()
}

/// The admin token's field, for a form that changes data.
pub(super) const TOKEN_FIELD: &str = "<label>Admin token <input type=password name=token \
    autocomplete=off required></label> ";

/// `text` safe in HTML text and in a double-quoted attribute.
pub(super) fn esc(text: &str) -> String {
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

/// `text` as a query-string value (then [`esc`] it for an attribute).
pub(super) fn q(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The value of `key` in a query string or form body, if present and not empty.
pub(super) fn param(query: &[u8], key: &str) -> Option<String> {
    url::form_urlencoded::parse(query)
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// `query` without the keys `drop` names (a page's position, a notice), encoded again.
pub(super) fn query_without(query: &str, drop: impl Fn(&str) -> bool) -> String {
    url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| !drop(k))
        .fold(
            url::form_urlencoded::Serializer::new(String::new()),
            |mut s, (k, v)| {
                s.append_pair(&k, &v);
                s
            },
        )
        .finish()
}

/// `42 s`, `3 min`, `5 h`, `2 days`.
pub(super) fn age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172_800 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// The last `max` characters of `text`, marked when cut.
pub(super) fn tail(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let rest: String = text.chars().skip(count - max).collect();
    format!("…{rest}")
}

/// The address of event `id` of `source`'s page (to escape for an attribute).
pub(super) fn link(source: &str, id: &str) -> String {
    format!("/event?source={}&id={}", q(source), q(id))
}

/// The statuses to show as columns: the three every store has, then any other in the rows
/// (a newer hookledger's, say), by name.
pub(super) fn statuses(outbox: &OutboxSummary) -> Vec<String> {
    let mut statuses: Vec<String> = ["pending", "done", "dead"].map(String::from).to_vec();
    let mut others: Vec<String> = outbox
        .counts
        .iter()
        .map(|c| c.status.clone())
        .filter(|s| !statuses.contains(s))
        .collect();
    others.sort();
    others.dedup();
    statuses.extend(others);
    statuses
}

/// Rows per kind and status: a line per kind, a column per status of [`statuses`].
pub(super) fn counts_table(h: &mut String, outbox: &OutboxSummary) {
    let mut kinds: Vec<&str> = outbox.counts.iter().map(|c| c.kind.as_str()).collect();
    kinds.dedup();
    if kinds.is_empty() {
        h.push_str("<p class=note>No rows.</p>");
        return;
    }
    let statuses = statuses(outbox);
    let rows: std::collections::HashMap<(&str, &str), i64> = outbox
        .counts
        .iter()
        .map(|c| ((c.kind.as_str(), c.status.as_str()), c.rows))
        .collect();
    h.push_str("<table class=outbox><tr><th>kind</th>");
    for s in &statuses {
        let _ = write!(h, "<th>{}</th>", esc(s));
    }
    h.push_str("</tr>");
    for kind in kinds {
        let _ = write!(h, "<tr><td>{}</td>", esc(kind));
        for status in &statuses {
            let n = rows.get(&(kind, status.as_str())).copied().unwrap_or(0);
            let _ = write!(h, "<td class=n>{n}</td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
}

/// The target of `kind` among `targets` (each kind's, as shown), or a dash.
fn target<'a>(targets: &'a [(String, String)], kind: &str) -> &'a str {
    targets
        .iter()
        .find(|(k, _)| k == kind)
        .map_or("-", |(_, t)| t.as_str())
}

/// Outbox rows with their target (from `targets`: each kind's, as shown), attempts, last
/// error and output tail; dead rows get a retry button.
pub(super) fn rows_table(
    h: &mut String,
    targets: &[(String, String)],
    rows: &[OutboxRow],
    now: i64,
) {
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
            esc(target(targets, &r.kind)),
            esc(&link(&r.source, &r.key)),
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

    #[test]
    fn params_are_decoded_trimmed_and_empty_is_none() {
        let query = b"source=stripe&type=&id=evt%201+&x=%3Cb%3E";
        assert_eq!(param(query, "source").as_deref(), Some("stripe"));
        assert_eq!(param(query, "type"), None);
        assert_eq!(param(query, "id").as_deref(), Some("evt 1"));
        assert_eq!(param(query, "x").as_deref(), Some("<b>"));
        assert_eq!(param(query, "missing"), None);
        assert_eq!(q("a b&c"), "a+b%26c");
        assert_eq!(tail("abcdef", 3), "…def");
        assert_eq!(tail("abc", 3), "abc");
        assert_eq!(
            query_without("kind=a+b&before=9&status=dead", |k| k == "before"),
            "kind=a+b&status=dead"
        );
    }
}
