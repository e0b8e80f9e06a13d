//! Routes: `on = [{ source, types, key, when }]` on `[forward]` and a `[[delivery]]`, which
//! events queue a row of that kind, without SQL. Event types are matched as an effect's `on`
//! is ([`type_matches`]); `key` and `when` are JSON pointers into the verified body.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{refuse, ConfigError};

/// One alternative of a route: the events of `source` whose type is one of `types` (all its
/// types when empty) and whose body holds, at each pointer of `when`, one of its values.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RouteConfig {
    /// The `name` of a `[[source]]`.
    pub source: String,
    /// Exact types, `prefix.*` patterns, or `*`; empty: every type.
    #[serde(default, deserialize_with = "strings")]
    pub types: Vec<String>,
    /// A JSON pointer (`/ref`): the value there is the row's `coalesce_key`, so that with
    /// `coalesce = true` a newer event with the same value supersedes the queued rows.
    #[serde(default)]
    pub key: Option<String>,
    /// JSON pointer → the value (or any of the values) it must hold, compared as text.
    #[serde(default)]
    pub when: BTreeMap<String, RouteValues>,
}

/// The values a pointer of `when` may hold: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct RouteValues(#[serde(deserialize_with = "strings")] pub Vec<String>);

impl RouteConfig {
    /// The events of `source` (every type, until [`RouteConfig::with_types`]).
    pub fn new(source: impl Into<String>) -> RouteConfig {
        RouteConfig {
            source: source.into(),
            types: Vec::new(),
            key: None,
            when: BTreeMap::new(),
        }
    }

    /// Only events of these types (exact, `prefix.*` or `*`).
    pub fn with_types(mut self, types: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.types = types.into_iter().map(Into::into).collect();
        self
    }

    /// The value at `pointer` is the row's `coalesce_key`.
    pub fn with_key(mut self, pointer: impl Into<String>) -> Self {
        self.key = Some(pointer.into());
        self
    }

    /// Only events whose body holds `value` (or one of several) at `pointer`.
    pub fn when(
        mut self,
        pointer: impl Into<String>,
        values: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let values = values.into_iter().map(Into::into).collect();
        self.when.insert(pointer.into(), RouteValues(values));
        self
    }
}

/// Refuses a route that cannot work; `at` is the table's key (`delivery `deploy``, `forward`),
/// `sources` the names of the `[[source]]`s.
pub(crate) fn validate(at: &str, on: &[RouteConfig], sources: &[&str]) -> Result<(), ConfigError> {
    if on.is_empty() {
        refuse!(
            format!("{at}.on"),
            "is empty: it routes no event (leave `on` out to queue rows by effects only)"
        );
    }
    for (i, route) in on.iter().enumerate() {
        let key = |field: &str| format!("{at}.on {}.{field}", i + 1);
        if !sources.contains(&route.source.as_str()) {
            refuse!(
                key("source"),
                "names no [[source]] (the `name` of a [[source]] goes here)"
            );
        }
        check_types(&key("types"), &route.types, true)?;
        if let Some(pointer) = &route.key {
            check_pointer(&key("key"), pointer)?;
        }
        for (pointer, values) in &route.when {
            let at = key(&format!("when.\"{pointer}\""));
            check_pointer(&at, pointer)?;
            if values.0.is_empty() {
                refuse!(at, "is an empty list: no value could match");
            }
        }
    }
    Ok(())
}

/// A JSON pointer (RFC 6901) to a value inside the body: `/` then the path.
fn check_pointer(key: &str, pointer: &str) -> Result<(), ConfigError> {
    if !pointer.starts_with('/') {
        refuse!(
            key,
            "must be a JSON pointer into the body, as \"/ref\" or \"/data/object/id\""
        );
    }
    Ok(())
}

/// Refuses event-type patterns that match nothing or are not patterns; `empty_is_all`: an
/// empty list means every type (a route's `types`), else it is refused (an effect's `on`).
pub(crate) fn check_types(
    key: &str,
    patterns: &[String],
    empty_is_all: bool,
) -> Result<(), ConfigError> {
    if (patterns.is_empty() && !empty_is_all) || patterns.iter().any(|p| p.trim().is_empty()) {
        refuse!(key, "must name event types, `prefix.*` or `*`");
    }
    if patterns
        .iter()
        .any(|p| p.contains('*') && !p.ends_with('*'))
    {
        refuse!(key, "`*` may only end a pattern");
    }
    Ok(())
}

/// Whether `kind` is one of `patterns`: an exact type, `prefix.*` (any type that starts with
/// `prefix.`) or `*`.
pub(crate) fn type_matches(patterns: &[String], kind: &str) -> bool {
    patterns
        .iter()
        .any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => kind.starts_with(prefix),
            None => pattern == kind,
        })
}

/// One string or a list of them, as a list.
pub(super) fn strings<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Written::deserialize(d)? {
        Written::One(one) => vec![one],
        Written::Many(many) => many,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(on: &[RouteConfig]) -> String {
        validate("delivery `deploy`", on, &["gh"])
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_route_is_read_from_toml_with_one_value_or_a_list() {
        #[derive(Deserialize)]
        struct Table {
            on: Vec<RouteConfig>,
        }
        let table: Table = toml::from_str(
            r#"on = [{ source = "gh", types = "push", key = "/ref",
                       when = { "/ref" = "refs/heads/main", "/repository/name" = ["a", "b"] } }]"#,
        )
        .unwrap();
        let expected = RouteConfig::new("gh")
            .with_types(["push"])
            .with_key("/ref")
            .when("/ref", ["refs/heads/main"])
            .when("/repository/name", ["a", "b"]);
        assert_eq!(table.on, vec![expected]);
    }

    #[test]
    fn each_refusal_names_its_key() {
        assert!(
            refusal(&[]).starts_with("delivery `deploy`.on:"),
            "{}",
            refusal(&[])
        );
        let unknown = refusal(&[RouteConfig::new("gitlab")]);
        assert!(
            unknown.starts_with("delivery `deploy`.on 1.source:"),
            "{unknown}"
        );
        let not_pointer = refusal(&[
            RouteConfig::new("gh"),
            RouteConfig::new("gh").with_key("ref"),
        ]);
        assert!(
            not_pointer.starts_with("delivery `deploy`.on 2.key:"),
            "{not_pointer}"
        );
        let when = refusal(&[RouteConfig::new("gh").when("ref", ["x"])]);
        assert!(
            when.starts_with("delivery `deploy`.on 1.when.\"ref\":"),
            "{when}"
        );
        let none: [&str; 0] = [];
        let empty = refusal(&[RouteConfig::new("gh").when("/ref", none)]);
        assert!(empty.contains("empty list"), "{empty}");
        let star = refusal(&[RouteConfig::new("gh").with_types(["*.paid"])]);
        assert!(star.starts_with("delivery `deploy`.on 1.types:"), "{star}");
        validate(
            "forward",
            &[RouteConfig::new("gh").with_key("/ref")],
            &["gh"],
        )
        .unwrap();
    }

    #[test]
    fn types_match_exactly_by_prefix_or_all() {
        let patterns = ["push".to_string(), "invoice.*".to_string()];
        assert!(type_matches(&patterns, "push"));
        assert!(type_matches(&patterns, "invoice.paid"));
        assert!(!type_matches(&patterns, "pushed"));
        assert!(!type_matches(&patterns, "invoices"));
        assert!(type_matches(&["*".to_string()], "anything"));
    }
}
