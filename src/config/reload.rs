//! What a config read again asks of a running server ([`change`]): nothing, a swap of the
//! sources in place, a restart in place, or a refusal for a key that cannot change while it
//! serves.
//!
//! The request path reads its sources (their secrets, schemes, handlers and the effects run
//! for them) through one pointer, so those swap between two requests. What the background
//! threads were started with (the outbox's lanes and targets, alerts, retention, the writer,
//! a source's provider API) is applied by starting again on the same listening sockets.

use super::{Config, ConfigError, SourceConfig};

/// What applying a new config to a running server takes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// The two configs are the same.
    Nothing,
    /// Only sources, their handlers, the SQL effects, the app's migrations and the built-in
    /// handlers' settings differ: swapped in place.
    Sources,
    /// These keys differ, and the threads that read them were started with the old values:
    /// applied by a restart in place (the same listening sockets; idle keep-alive
    /// connections are closed, none is refused).
    Restart(Vec<String>),
}

/// What it takes to go from `old` to `new`, both validated; an error names a key that cannot
/// change while the server runs (`database`, `listen`, `admin_listen`).
pub(crate) fn change(old: &Config, new: &Config) -> Result<Change, ConfigError> {
    let fixed = [
        ("database", old.database != new.database),
        ("listen", old.listen != new.listen),
        ("admin_listen", old.admin_listen != new.admin_listen),
    ];
    if let Some((key, _)) = fixed.iter().find(|(_, differs)| *differs) {
        return Err(ConfigError::new(
            *key,
            "cannot change while hookledger serves (a reload keeps the database and the \
             listening sockets): the running config is kept; restart to apply it, or put the \
             old value back",
        ));
    }
    let mut restart: Vec<String> = Vec::new();
    let whole = [
        ("admin_token", old.admin_token != new.admin_token),
        ("http", old.http != new.http),
        ("storage", old.storage != new.storage),
        ("writer", old.writer != new.writer),
        ("forward", old.forward != new.forward),
        ("delivery", old.deliveries != new.deliveries),
        ("retention", old.retention != new.retention),
        ("alert", old.alerts != new.alerts),
        ("otlp_endpoint", old.otlp_endpoint != new.otlp_endpoint),
    ];
    restart.extend(
        whole
            .iter()
            .filter(|(_, differs)| *differs)
            .map(|(key, _)| key.to_string()),
    );
    // A source with a provider API has threads of its own (its reconcile, the refresh of its
    // objects), started with its API settings.
    let names = old.sources.iter().chain(&new.sources).map(|s| &s.name);
    for name in names {
        let (was, is) = (old.source(name), new.source(name));
        if !(was.is_some_and(has_api) || is.is_some_and(has_api)) {
            continue;
        }
        for field in api_changes(was, is) {
            let key = super::source_key(name, field);
            if !restart.contains(&key) {
                restart.push(key);
            }
        }
    }
    if !restart.is_empty() {
        return Ok(Change::Restart(restart));
    }
    let sources = old.sources != new.sources
        || old.effects != new.effects
        || old.schema != new.schema
        || old.stripe_billing != new.stripe_billing;
    Ok(match sources {
        true => Change::Sources,
        false => Change::Nothing,
    })
}

fn has_api(source: &SourceConfig) -> bool {
    source.api_key.is_some() || source.private_key.is_some()
}

/// The keys its provider-API threads read that differ between `was` and `is`; a source with
/// an API that is added or removed: the key of its credential.
fn api_changes(was: Option<&SourceConfig>, is: Option<&SourceConfig>) -> Vec<&'static str> {
    let (Some(a), Some(b)) = (was, is) else {
        let source = was.or(is).expect("a source of one config or the other");
        return vec![match source.api_key {
            Some(_) => "api_key",
            None => "private_key",
        }];
    };
    [
        ("api_key", a.api_key != b.api_key),
        ("api_base", a.api_base != b.api_base),
        ("reconcile", a.reconcile != b.reconcile),
        ("refresh", a.refresh != b.refresh),
        ("handlers", a.handlers != b.handlers),
        ("hook", a.hook != b.hook),
        ("mode", a.mode != b.mode),
        ("event_types", a.event_types != b.event_types),
        ("app_id", a.app_id != b.app_id),
        ("private_key", a.private_key != b.private_key),
    ]
    .into_iter()
    .filter_map(|(key, differs)| differs.then_some(key))
    .collect()
}

impl Config {
    fn source(&self, name: &str) -> Option<&SourceConfig> {
        self.sources.iter().find(|s| s.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    fn config(text: &str) -> Config {
        Config::parse(text, std::path::Path::new("."), &[]).unwrap()
    }

    const BASE: &str = r#"
        [[source]]
        name = "gh"
        scheme = "github"
        secrets = ["gh_secret_number_1"]
    "#;

    #[test]
    fn sources_secrets_and_effects_swap_in_place() {
        let old = config(BASE);
        assert_eq!(change(&old, &config(BASE)), Ok(Change::Nothing));
        let rotated = BASE.replace(
            "[\"gh_secret_number_1\"]",
            "[\"gh_secret_number_2\", \"gh_secret_number_1\"]",
        );
        assert_eq!(change(&old, &config(&rotated)), Ok(Change::Sources));
        let added = format!(
            "{BASE}\n[[source]]\nname = \"ops\"\nscheme = \"github\"\nsecrets = \
             [\"ops_secret_number\"]\n"
        );
        assert_eq!(change(&old, &config(&added)), Ok(Change::Sources));
        assert_eq!(change(&config(&added), &old), Ok(Change::Sources));
        let effect = format!(
            "{BASE}\n[[effect]]\nsource = \"gh\"\non = \"push\"\nsql = \"UPDATE x SET y = 1\"\n"
        );
        assert_eq!(change(&old, &config(&effect)), Ok(Change::Sources));
    }

    #[test]
    fn the_database_and_the_listening_addresses_are_refused_by_key() {
        let old = config(BASE);
        let mut new = config(BASE);
        new.database = crate::config::Database::parse("other.db");
        assert_eq!(change(&old, &new).unwrap_err().key, "database");
        let mut new = config(BASE);
        new.listen = "127.0.0.1:1".parse().unwrap();
        assert_eq!(change(&old, &new).unwrap_err().key, "listen");
        let mut new = config(BASE);
        new.admin_listen = None;
        assert_eq!(change(&old, &new).unwrap_err().key, "admin_listen");
    }

    #[test]
    fn what_the_background_threads_read_needs_a_restart_naming_each_key() {
        let old = config(BASE);
        let new = config(&format!(
            "[retention]\nclaim_days = 30\n[http]\nmax_body = 4096\n{BASE}"
        ));
        assert_eq!(
            change(&old, &new),
            Ok(Change::Restart(vec!["http".into(), "retention".into()]))
        );
        // A source with a provider API: its API settings restart, the rest of it swaps.
        let mut old = config(BASE);
        old.sources[0].api_key = Some(Secret::new("rk_test_1"));
        let mut new = old.clone();
        new.sources[0].api_key = Some(Secret::new("rk_test_2"));
        assert_eq!(
            change(&old, &new),
            Ok(Change::Restart(vec!["source `gh`.api_key".into()]))
        );
        // The hook a github source's reconcile lists is read by its thread too, as are an
        // App's id and key; each is named.
        let mut new = old.clone();
        new.sources[0].hook = Some("repos/octo/app/7".into());
        assert_eq!(
            change(&old, &new),
            Ok(Change::Restart(vec!["source `gh`.hook".into()]))
        );
        new.sources[0].app_id = Some(7);
        new.sources[0].private_key = Some(Secret::new("file:app.pem"));
        assert_eq!(
            change(&old, &new),
            Ok(Change::Restart(vec![
                "source `gh`.hook".into(),
                "source `gh`.app_id".into(),
                "source `gh`.private_key".into()
            ]))
        );
        // A source with an API, added: its credential.
        let mut new = old.clone();
        new.sources[0].name = "ops".into();
        assert_eq!(
            change(&old, &new),
            Ok(Change::Restart(vec![
                "source `gh`.api_key".into(),
                "source `ops`.api_key".into()
            ]))
        );
        let mut new = old.clone();
        new.sources[0].secrets = vec![Secret::new("gh_secret_number_9")];
        assert_eq!(change(&old, &new), Ok(Change::Sources));
    }
}
