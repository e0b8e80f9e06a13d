//! A source's routes: which kinds its new events queue a row of without SQL (`on = [...]` on
//! `[forward]` and a `[[delivery]]`). Matched on the request's thread, before the writer: the
//! writer only inserts the rows ([`crate::outbox::Routed`]).

use std::sync::Arc;

use serde_json::Value;

use crate::config::{route_type_matches, Config, RouteConfig, FORWARD};
use crate::event::Event;
use crate::outbox::Routed;

/// One kind's entries that name this source: alternatives, the first that matches decides.
#[derive(Debug, Clone)]
struct KindRoute {
    kind: Arc<str>,
    entries: Vec<RouteConfig>,
}

/// The routes of one source, in config order (`[forward]` first).
#[derive(Debug, Clone, Default)]
pub(crate) struct Routes(Vec<KindRoute>);

impl Routes {
    /// The routes of `config` that name `source`.
    pub(crate) fn of(config: &Config, source: &str) -> Routes {
        let forward = config
            .forward
            .as_ref()
            .and_then(|f| f.on.as_ref())
            .map(|on| (Arc::from(FORWARD), on));
        let deliveries = config
            .deliveries
            .iter()
            .filter_map(|d| Some((Arc::from(d.kind.as_str()), d.on.as_ref()?)));
        Routes(
            forward
                .into_iter()
                .chain(deliveries)
                .filter_map(|(kind, on)| {
                    let entries: Vec<RouteConfig> =
                        on.iter().filter(|r| r.source == source).cloned().collect();
                    (!entries.is_empty()).then_some(KindRoute { kind, entries })
                })
                .collect(),
        )
    }

    /// The rows `event` queues when it is new: one per kind with an entry that matches. The
    /// body is read as JSON once, only when an entry of its type has pointers to look at (a
    /// body that is not JSON matches no `when`, and has no `key`).
    pub(crate) fn rows(&self, event: &Event) -> Vec<Routed> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let mut body: Option<Option<Value>> = None;
        let mut rows = Vec::new();
        for route in &self.0 {
            for entry in &route.entries {
                if !entry.types.is_empty() && !route_type_matches(&entry.types, &event.kind) {
                    continue;
                }
                let json = match entry.when.is_empty() && entry.key.is_none() {
                    true => None,
                    false => body
                        .get_or_insert_with(|| serde_json::from_slice(&event.body).ok())
                        .as_ref(),
                };
                let holds = |pointer: &str, values: &[String]| {
                    json.and_then(|j| text_at(j, pointer))
                        .is_some_and(|text| values.contains(&text))
                };
                if entry.when.iter().all(|(p, v)| holds(p, &v.0)) {
                    let coalesce_key = entry.key.as_deref().and_then(|p| text_at(json?, p));
                    rows.push(Routed {
                        kind: route.kind.clone(),
                        coalesce_key,
                    });
                    break;
                }
            }
        }
        rows
    }
}

/// The value at `pointer` as text: a string as it is, a number or a boolean as JSON writes it;
/// `None` for null, an object, an array, or nothing there.
fn text_at(json: &Value, pointer: &str) -> Option<String> {
    match json.pointer(pointer)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DeliveryConfig, ForwardConfig, SchemeName, Secret, SourceConfig};

    fn push(kind: &str, body: &str) -> Event {
        Event {
            source: "gh".into(),
            id: "d1".into(),
            kind: kind.into(),
            created: None,
            body: bytes::Bytes::from(body.to_string()),
        }
    }

    fn config(deploy: Vec<RouteConfig>, forward: Option<Vec<RouteConfig>>) -> Config {
        let mut config = Config::default();
        config
            .sources
            .push(SourceConfig::new("gh", SchemeName::Github, vec![]));
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let mut f = ForwardConfig::new("http://127.0.0.1:1/", secret);
        f.on = forward;
        config.forward = Some(f);
        config
            .deliveries
            .push(DeliveryConfig::command("deploy", vec!["/bin/true".into()]).with_routes(deploy));
        config
    }

    fn routed(kind: &str, key: Option<&str>) -> Routed {
        Routed {
            kind: kind.into(),
            coalesce_key: key.map(Into::into),
        }
    }

    #[test]
    fn a_push_to_main_is_routed_with_its_ref_and_one_to_another_branch_is_not() {
        let main = RouteConfig::new("gh")
            .with_types(["push"])
            .with_key("/ref")
            .when("/ref", ["refs/heads/main"]);
        let routes = Routes::of(&config(vec![main], None), "gh");
        let body = r#"{"ref":"refs/heads/main","after":"abc"}"#;
        assert_eq!(
            routes.rows(&push("push", body)),
            [routed("deploy", Some("refs/heads/main"))]
        );
        assert!(routes
            .rows(&push("push", r#"{"ref":"refs/heads/dev"}"#))
            .is_empty());
        assert!(routes.rows(&push("ping", body)).is_empty());
        // The value must be at the pointer, not elsewhere in the body.
        let elsewhere = r#"{"ref":"refs/heads/dev","base_ref":"refs/heads/main"}"#;
        assert!(routes.rows(&push("push", elsewhere)).is_empty());
        assert!(routes.rows(&push("push", "ref=refs/heads/main")).is_empty());
        assert!(Routes::of(&config(vec![], None), "gh")
            .rows(&push("push", body))
            .is_empty());
    }

    #[test]
    fn entries_are_alternatives_lists_any_value_and_numbers_compare_as_text() {
        let routes = Routes::of(
            &config(
                vec![
                    RouteConfig::new("other").with_types(["push"]),
                    RouteConfig::new("gh").when("/n", ["1", "2"]),
                    RouteConfig::new("gh")
                        .with_types(["release.*"])
                        .with_key("/n"),
                ],
                Some(vec![RouteConfig::new("gh").with_types(["*"])]),
            ),
            "gh",
        );
        assert_eq!(
            routes.rows(&push("push", r#"{"n":2}"#)),
            [routed(FORWARD, None), routed("deploy", None)]
        );
        assert_eq!(
            routes.rows(&push("release.published", r#"{"n":7}"#)),
            [routed(FORWARD, None), routed("deploy", Some("7"))]
        );
        assert_eq!(
            routes.rows(&push("push", r#"{"n":3}"#)),
            [routed(FORWARD, None)]
        );
    }
}
