//! `[[effect]]` (SQL run for a source's events inside the claim's transaction) and `[schema]`
//! (the app's own migrations).

use std::path::PathBuf;

use serde::Deserialize;

use super::{refuse, ConfigError};

/// SQL run, in config order, for the events of `source` whose type `on` matches.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EffectConfig {
    pub source: String,
    /// Exact types, `prefix.*` patterns, or `*`; one string or a list.
    #[serde(deserialize_with = "super::route::strings")]
    pub on: Vec<String>,
    /// One or more statements separated by `;`, with the named parameters `:source`,
    /// `:event_id`, `:event_type`, `:created` (NULL if the scheme has no event time) and
    /// `:body` (the verified raw body, as text).
    pub sql: String,
}

/// The app's own schema.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SchemaConfig {
    /// A folder of `*.sql` files, applied once each in name order at start-up (relative to
    /// the config file).
    pub migrations: Option<PathBuf>,
}

/// The parameters an effect's SQL may name.
pub(crate) const PARAMETERS: &[&str] =
    &[":source", ":event_id", ":event_type", ":created", ":body"];

/// A statement of an effect with its `:name` parameters turned into `$1, $2, …` (in order of
/// first use), which both stores bind; `parameters[i]` is the index in [`PARAMETERS`] of `$i+1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BoundStatement {
    pub(crate) sql: String,
    pub(crate) parameters: Vec<usize>,
}

/// Turns `:name` into `$n` outside quotes and comments, leaving PostgreSQL's `::type` casts
/// alone. An unknown name, or a `$1` written in the SQL, is refused with a message.
pub(crate) fn bind_parameters(sql: &str) -> Result<BoundStatement, String> {
    let mut out = String::with_capacity(sql.len());
    let mut parameters = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                out.push(c);
                let mut last = ' ';
                for d in chars.by_ref() {
                    out.push(d);
                    if last == '*' && d == '/' {
                        break;
                    }
                    last = d;
                }
            }
            ':' if chars.peek() == Some(&':') => {
                chars.next();
                out.push_str("::");
            }
            ':' if chars
                .peek()
                .is_some_and(|d| d.is_ascii_alphabetic() || *d == '_') =>
            {
                let mut name = String::from(":");
                while let Some(&d) = chars.peek() {
                    if !(d.is_ascii_alphanumeric() || d == '_') {
                        break;
                    }
                    name.push(d);
                    chars.next();
                }
                let Some(known) = PARAMETERS.iter().position(|p| *p == name) else {
                    return Err(format!(
                        "unknown parameter `{name}`; the parameters are {}",
                        PARAMETERS.join(", ")
                    ));
                };
                let n = match parameters.iter().position(|p| *p == known) {
                    Some(n) => n,
                    None => {
                        parameters.push(known);
                        parameters.len() - 1
                    }
                };
                out.push_str(&format!("${}", n + 1));
            }
            '$' if chars.peek().is_some_and(char::is_ascii_digit) => {
                let digits: String =
                    std::iter::from_fn(|| chars.next_if(char::is_ascii_digit)).collect();
                return Err(format!(
                    "positional parameter `${digits}`: name it instead ({})",
                    PARAMETERS.join(", ")
                ));
            }
            _ => out.push(c),
        }
    }
    Ok(BoundStatement {
        sql: out,
        parameters,
    })
}

impl EffectConfig {
    /// SQL `sql` run for the events of `source` whose type matches one of `on` (exact types,
    /// `prefix.*` or `*`).
    pub fn new(
        source: impl Into<String>,
        on: impl IntoIterator<Item = impl Into<String>>,
        sql: impl Into<String>,
    ) -> EffectConfig {
        EffectConfig {
            source: source.into(),
            on: on.into_iter().map(Into::into).collect(),
            sql: sql.into(),
        }
    }

    /// Whether events of type `kind` run this effect.
    pub(crate) fn matches(&self, kind: &str) -> bool {
        super::route::type_matches(&self.on, kind)
    }

    /// Refuses what cannot work (the SQL itself is checked against the database later);
    /// `index` (from 1) and the source name it in errors.
    pub(crate) fn validate(&self, index: usize, sources: &[&str]) -> Result<(), ConfigError> {
        let source = &self.source;
        let key = |field: &str| format!("effect {index}.{field}");
        if !sources.contains(&source.as_str()) {
            refuse!(
                key("source"),
                "names no [[source]] (the `name` of a [[source]] goes here)"
            );
        }
        super::route::check_types(&key("on"), &self.on, false)?;
        let statements = split_statements(&self.sql);
        if statements.is_empty() {
            refuse!(key("sql"), "is empty");
        }
        // The parameters now, before the database is opened (the rest of the SQL can only be
        // checked against it).
        for (j, statement) in statements.iter().enumerate() {
            if let Err(e) = bind_parameters(statement) {
                refuse!(key("sql"), "statement {}: {e}", j + 1);
            }
        }
        Ok(())
    }
}

/// The statements of `sql`, split at each `;` outside quotes, brackets and comments. (An
/// effect holds plain statements; `CREATE TRIGGER … BEGIN …; END` belongs in a migration.)
pub(crate) fn split_statements(sql: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' | '`' | '[' => {
                let close = if c == '[' { ']' } else { c };
                current.push(c);
                for d in chars.by_ref() {
                    current.push(d);
                    if d == close {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                for d in chars.by_ref() {
                    if d == '\n' {
                        current.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for d in chars.by_ref() {
                    if last == '*' && d == '/' {
                        break;
                    }
                    last = d;
                }
                current.push(' ');
            }
            ';' => {
                if !current.trim().is_empty() {
                    statements.push(current.trim().to_string());
                }
                current.clear();
            }
            _ => current.push(c),
        }
    }
    if !current.trim().is_empty() {
        statements.push(current.trim().to_string());
    }
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_split_at_semicolons_outside_strings_and_comments() {
        let sql = "INSERT INTO t VALUES ('a;b', \"c;d\"); -- a comment; with a semicolon\n\
                   UPDATE t SET x = 1 /* ; */ WHERE y = [e;f];\n\n  ;";
        assert_eq!(
            split_statements(sql),
            [
                "INSERT INTO t VALUES ('a;b', \"c;d\")",
                "UPDATE t SET x = 1   WHERE y = [e;f]"
            ]
        );
        assert!(split_statements(" ; -- nothing\n").is_empty());
    }

    #[test]
    fn named_parameters_become_numbered_in_order_of_first_use() {
        let bound = bind_parameters(
            "INSERT INTO t (a, b, c) VALUES (:event_id, ':body', :created::bigint) -- :nope\n\
             ON CONFLICT DO UPDATE SET a = :event_id /* :nope */ || \":x\"",
        )
        .unwrap();
        assert_eq!(
            bound.sql,
            "INSERT INTO t (a, b, c) VALUES ($1, ':body', $2::bigint) -- :nope\n\
             ON CONFLICT DO UPDATE SET a = $1 /* :nope */ || \":x\""
        );
        assert_eq!(bound.parameters, [1, 3]);
    }

    #[test]
    fn unknown_and_positional_parameters_are_refused() {
        let err = bind_parameters("SELECT :amount").unwrap_err();
        assert!(err.contains("unknown parameter `:amount`"), "{err}");
        assert!(err.contains(":body"), "{err}");
        let err = bind_parameters("SELECT $12").unwrap_err();
        assert!(err.contains("positional parameter `$12`"), "{err}");
        let none: &[usize] = &[];
        assert_eq!(
            bind_parameters("SELECT '$1', x::text").unwrap().parameters,
            none
        );
    }

    #[test]
    fn patterns_match_exact_types_prefixes_and_everything() {
        let effect = |on: &[&str]| EffectConfig {
            source: "s".into(),
            on: on.iter().map(|s| s.to_string()).collect(),
            sql: "SELECT 1".into(),
        };
        assert!(effect(&["invoice.paid"]).matches("invoice.paid"));
        assert!(!effect(&["invoice.paid"]).matches("invoice.paid.x"));
        assert!(effect(&["invoice.*"]).matches("invoice.payment_succeeded"));
        assert!(!effect(&["invoice.*"]).matches("invoices"));
        assert!(effect(&["*"]).matches("anything"));
        assert!(effect(&["a", "b"]).matches("b"));
        let sources = ["s"];
        assert!(effect(&["in*voice"]).validate(1, &sources).is_err());
        assert!(effect(&[]).validate(1, &sources).is_err());
        let err = EffectConfig {
            source: "nope".into(),
            ..effect(&["*"])
        }
        .validate(2, &sources)
        .unwrap_err();
        assert_eq!(err.key, "effect 2.source");
        assert!(
            err.to_string()
                .starts_with("effect 2.source: names no [[source]]")
                && !err.to_string().contains("nope"),
            "{err}"
        );
    }
}
