//! What the console's pages share: the frame (style, navigation), escaping, ages, the token
//! field of a form that changes data, and query strings.
//!
//! Every value that comes from a request or a target's answer (an event's type, its payload,
//! a target's error body) goes through [`esc`]; the pages have no script, and their answers
//! say so (`Content-Security-Policy: script-src 'none'`), so even a value that escaped would
//! not run.

use std::fmt::Write as _;

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

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
    }
}
