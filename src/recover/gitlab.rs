//! GitLab: a webhook that failed is not retried (after repeated failures GitLab disables the
//! hook for a while); GitLab keeps each hook's requests of the last 7 days, with their headers
//! and payload. A reconcile lists them (`GET /projects/:id/hooks/:hook_id/events`, or a
//! group's, 50 a page, the `Link` header's next `page`), and for each event the ledger lacks
//! either applies the recorded request as if it had arrived (`mode = "apply"`, the default:
//! the body is the payload serialized again, its headers those GitLab shows, the secret token
//! redacted) or asks GitLab to send it again (`mode = "redeliver"`, `POST …/events/:hook_event_id/resend`). The claim is the one a
//! webhook makes: the `Idempotency-Key` (GitLab 17.4 on), else the UUID. GitLab gives a
//! request it sends again (by hand, or asked by a run) a new UUID and the same key: a run
//! takes the requests of one key as one event, present when its key or any of their UUIDs is
//! claimed (a claim made before the preset claimed the key is a UUID), so an event received
//! through a resend is neither applied nor resent again.
//!
//! GitLab lists the last 7 days whatever the horizon: a run looks at all of them (what the
//! ledger has is counted present). The token (a personal, project or group access token with
//! the `read_api` scope, `api` to resend, of a Maintainer, or an Owner for a group) goes as a
//! bearer; a 401 or 403 stops the run at once, as does a hook that is not there (404). GitLab
//! allows five resends a minute per hook: a 429 is waited out by the shared client.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{refuse, source_key, ConfigError, RecoverMode, Secret, SourceConfig};
use crate::event::Event;
use crate::source::Source;
use crate::store::Reader;
use crate::writer::WriterHandle;

use super::client::{next_link_param, Api, Auth};
use super::{apply, periodic_each, present, Counts, Periodic};

/// The preset whose sources this recovers (`preset = "gitlab"`).
pub(crate) const PRESET: &str = "gitlab";

/// GitLab.com's API (a self-managed instance's is `https://HOST/api/v4`).
pub(crate) const GITLAB_API_BASE: &str = "https://gitlab.com/api/v4";

/// GitLab keeps a hook's requests for 7 days.
pub(crate) const MAX_SINCE: Duration = Duration::from_secs(7 * 86_400);

/// The header with the request's id, as the gitlab preset claims it.
const EVENT_UUID: &str = "X-Gitlab-Event-UUID";

/// The header that stays the same when GitLab sends a request again (17.4 on), where the
/// UUID is new each time.
const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// Hook events per page: half GitLab's largest, as each carries its payload.
const PAGE: usize = 50;

/// Pages one run reads at most: 10,000 requests.
const MAX_PAGES: usize = 200;

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GitlabError {
    #[error(
        "GitLab refused the token (HTTP {status}: {message}); check it, and that it has the \
         read_api scope (api to resend) and the Maintainer role (Owner for a group's hook)"
    )]
    Refused { status: u16, message: String },
    #[error("GitLab has no webhook {0} that this token can see (HTTP 404)")]
    NoHook(String),
    #[error("{0}")]
    Failed(String),
}

/// Whether `source` is recovered from GitLab's hook events (`preset = "gitlab"`).
pub(crate) fn is_gitlab(source: &SourceConfig) -> bool {
    source.preset.as_deref() == Some(PRESET)
}

impl From<String> for GitlabError {
    fn from(why: String) -> GitlabError {
        GitlabError::Failed(why)
    }
}

/// Which webhook: a project's or a group's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hook {
    /// `/projects/ID/hooks/HOOK_ID` or `/groups/ID/hooks/HOOK_ID`.
    path: String,
    /// As the config names it, for messages.
    name: String,
}

impl Hook {
    /// `projects/ID/HOOK_ID` or `groups/ID/HOOK_ID`; the id a number or a URL-encoded path
    /// (`my-group%2Fmy-project`).
    pub(crate) fn parse(text: &str) -> Result<Hook, String> {
        let parts: Vec<&str> = text.trim_matches('/').split('/').collect();
        let id = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '%'))
                && !s.chars().all(|c| c == '.')
        };
        let path =
            match parts.as_slice() {
                [kind @ ("projects" | "groups"), owner, hook] if id(owner) => {
                    let hook: u64 = hook
                        .parse()
                        .map_err(|_| format!("the hook id `{hook}` is not a number"))?;
                    format!("/{kind}/{owner}/hooks/{hook}")
                }
                _ => return Err(
                    "must be \"projects/ID/HOOK_ID\" or \"groups/ID/HOOK_ID\" (the project's or \
                     group's id, or its URL-encoded path, and the hook's id from its settings)"
                        .into(),
                ),
            };
        Ok(Hook {
            path,
            name: text.to_string(),
        })
    }
}

/// The checks of a gitlab source's API settings, naming the key: `hook` with `api_key`, the
/// others with `hook`, `since` within GitLab's 7 days.
pub(crate) fn check_source(source: &SourceConfig) -> Result<(), ConfigError> {
    let key = |field: &str| source_key(&source.name, field);
    if let Some(hook) = &source.hook {
        Hook::parse(hook).map_err(|e| ConfigError::new(key("hook"), e))?;
        if source.api_key.is_none() {
            refuse!(
                key("hook"),
                "needs api_key (a GitLab access token that may read the hook's events)"
            );
        }
    }
    for (field, set) in [
        ("reconcile", source.reconcile.is_some()),
        ("mode", source.mode.is_some()),
        ("api_key", source.api_key.is_some()),
        ("api_base", source.api_base.is_some()),
    ] {
        if set && source.hook.is_none() {
            refuse!(
                key(field),
                "needs hook = \"projects/ID/HOOK_ID\" or \"groups/ID/HOOK_ID\" (the webhook \
                 whose events are recovered)"
            );
        }
    }
    if let Some(base) = &source.api_base {
        super::check_api_base(&key("api_base"), base)?;
    }
    if let Some(reconcile) = &source.reconcile {
        if reconcile.since > MAX_SINCE {
            refuse!(
                key("reconcile.since"),
                "must be at most 7d (GitLab keeps a hook's requests for 7 days)"
            );
        }
    }
    Ok(())
}

/// One request of a hook, as GitLab lists it.
#[derive(Deserialize)]
struct HookEvent {
    id: u64,
    #[serde(default)]
    request_headers: serde_json::Map<String, serde_json::Value>,
    request_data: Option<serde_json::Value>,
}

impl HookEvent {
    /// The recorded request's header `name`.
    fn header(&self, name: &str) -> Option<&str> {
        self.request_headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_str())
    }

    /// Whether GitLab kept the payload: one over its limit is stored as `{"oversize": true}`.
    fn payload(&self) -> Result<&serde_json::Value, &'static str> {
        match &self.request_data {
            None => Err("GitLab shows no payload for this request"),
            Some(data) if data.get("oversize") == Some(&serde_json::Value::Bool(true)) => Err(
                "GitLab kept no payload for this request (over its size limit): mode = \
                 \"redeliver\" asks GitLab to send it again",
            ),
            Some(data) => Ok(data),
        }
    }
}

/// What a run knows of one event (its requests with one key).
enum Seen {
    /// Its presence not read yet.
    Unread,
    /// One of its requests is claimed.
    Claimed,
    /// Neither its key nor a UUID is claimed.
    Missing(Missing),
}

/// An event the ledger lacks.
struct Missing {
    /// Its `Idempotency-Key`, or its UUID without one.
    key: String,
    /// Its newest request's UUID.
    uuid: String,
    request: HookEvent,
}

/// The headers of GitLab's API, besides the token.
const HEADERS: &[(&str, &str)] = &[("Accept", "application/json")];

/// A client for one hook's events.
pub(crate) struct GitlabApi {
    api: Api,
    hook: Hook,
}

impl GitlabApi {
    /// The client of a gitlab source with a `hook` and an `api_key`; `api_base` and `api_key`
    /// override the source's own.
    pub(crate) fn of(
        source: &SourceConfig,
        api_base: Option<&str>,
        api_key: Option<Secret>,
    ) -> Result<GitlabApi, String> {
        let hook = Hook::parse(source.hook.as_deref().ok_or("no hook")?)
            .map_err(|e| format!("hook: {e}"))?;
        let base = super::api_base(api_base, source, GITLAB_API_BASE).map_err(|e| e.to_string())?;
        let token = api_key.or_else(|| source.api_key.clone()).ok_or(
            "no GitLab token: pass --api-key env:NAME, or give the source api_key = \"env:NAME\"",
        )?;
        Ok(GitlabApi {
            api: Api::new("GitLab", base, Auth::Token(token), HEADERS),
            hook,
        })
    }

    /// A page of the hook's events, and the next page's number.
    fn events(&self, page: u64) -> Result<(Vec<HookEvent>, Option<u64>), GitlabError> {
        let path = format!("{}/events?per_page={PAGE}&page={page}", self.hook.path);
        let (body, link) = self.call("GET", &path)?;
        let events: Vec<HookEvent> = serde_json::from_slice(&body).map_err(|e| {
            GitlabError::Failed(format!(
                "GitLab's list of hook events is not as documented: {e}"
            ))
        })?;
        let next = link
            .as_deref()
            .and_then(|l| next_link_param(l, "page"))
            .and_then(|p| p.parse().ok());
        Ok((events, next))
    }

    /// Asks GitLab to send hook event `id` again.
    fn resend(&self, id: u64) -> Result<(), GitlabError> {
        self.call("POST", &format!("{}/events/{id}/resend", self.hook.path))
            .map(drop)
    }

    fn call(&self, method: &str, path: &str) -> Result<(Vec<u8>, Option<String>), GitlabError> {
        self.api.call(method, path).map_err(|e| {
            e.sorted(
                |status, message| GitlabError::Refused { status, message },
                Some(GitlabError::NoHook(self.hook.name.clone())),
            )
        })
    }
}

/// One reconcile of a gitlab source.
pub(crate) struct Run {
    pub(crate) api: GitlabApi,
    pub(crate) mode: RecoverMode,
    pub(crate) dry_run: bool,
}

impl Run {
    /// A run for `source` (GitLab lists the last 7 days; `since` may not ask for more), its
    /// API from `api_base` and `api_key` over the source's own.
    pub(crate) fn new(
        source: &SourceConfig,
        since: Duration,
        dry_run: bool,
        api_base: Option<&str>,
        api_key: Option<Secret>,
    ) -> anyhow::Result<Run> {
        super::check_since(
            since,
            MAX_SINCE,
            "7d",
            "GitLab keeps a hook's requests for 7 days",
        )?;
        if source.hook.is_none() {
            anyhow::bail!(
                "source `{}`: reconcile lists a GitLab webhook's events: give the source hook = \
                 \"projects/ID/HOOK_ID\" and api_key = \"env:NAME\"",
                source.name
            );
        }
        let api = GitlabApi::of(source, api_base, api_key)
            .map_err(|e| anyhow::anyhow!("source `{}`: {e}", source.name))?;
        Ok(Run {
            api,
            mode: source.mode.unwrap_or_default(),
            dry_run,
        })
    }

    /// Reconciles `source` until done or `stop` is set (checked between pages): each event
    /// the ledger lacks is applied or sent again. An event is its requests with one
    /// `Idempotency-Key` (GitLab 17.4 on: kept when a request is sent again, where
    /// `X-Gitlab-Event-UUID` is new each time), or with one UUID without it; it is present when
    /// its key or any of its requests' UUIDs is claimed. So all pages are read before anything
    /// is applied: a request sent again and received may be listed pages before the first one.
    pub(crate) fn once(
        &self,
        source: &Source,
        writer: &WriterHandle,
        reader: &Reader,
        stop: &AtomicBool,
    ) -> Result<Counts, GitlabError> {
        let mut counts = Counts::default();
        // Each event (by its key) in the order first listed, newest first.
        let mut order: Vec<String> = Vec::new();
        let mut events: HashMap<String, Seen> = HashMap::new();
        let mut seen_pages = HashSet::new();
        let mut page = 1;
        while !stop.load(Ordering::SeqCst) {
            let (listed, next) = self.api.events(page)?;
            for request in listed {
                let Some(uuid) = request.header(EVENT_UUID).map(str::to_string) else {
                    log::error!(
                        "reconcile {}: GitLab's hook event {} has no {EVENT_UUID}",
                        source.name,
                        request.id
                    );
                    counts.failed += 1;
                    continue;
                };
                let key = request
                    .header(IDEMPOTENCY_KEY)
                    .map_or_else(|| uuid.clone(), str::to_string);
                let seen = events.entry(key.clone()).or_insert_with(|| {
                    order.push(key.clone());
                    Seen::Unread
                });
                if matches!(seen, Seen::Claimed) {
                    continue;
                }
                // The preset claims the key where GitLab sends one; a claim made before it
                // did (or by a source that claims the UUID) is the UUID's.
                let claimed = match present(reader, &source.name, &key) {
                    Ok(false) if key != uuid => present(reader, &source.name, &uuid),
                    other => other,
                };
                match claimed {
                    Ok(true) => *seen = Seen::Claimed,
                    // The first request listed of an event is its newest.
                    Ok(false) if matches!(seen, Seen::Unread) => {
                        *seen = Seen::Missing(Missing { key, uuid, request })
                    }
                    Ok(false) => {}
                    Err(e) => {
                        log::error!("reconcile {} {uuid}: {e}", source.name);
                        counts.failed += 1;
                    }
                }
            }
            seen_pages.insert(page);
            let Some(next) = next else { break };
            if seen_pages.len() >= MAX_PAGES {
                log::warn!(
                    "reconcile {}: stopped after {MAX_PAGES} pages ({} events); older ones \
                     were not checked",
                    source.name,
                    order.len()
                );
                break;
            }
            if seen_pages.contains(&next) {
                return Err(GitlabError::Failed(format!(
                    "GitLab's API listed page {next} again; stopped after {} pages",
                    seen_pages.len()
                )));
            }
            page = next;
        }
        // Stopped before the last page: what is missing is not known yet.
        if stop.load(Ordering::SeqCst) {
            return Ok(counts);
        }
        let mut missing = Vec::new();
        for key in order {
            match events.remove(&key) {
                Some(Seen::Claimed) => {
                    counts.found += 1;
                    counts.already_present += 1;
                }
                Some(Seen::Missing(event)) => {
                    counts.found += 1;
                    missing.push(event);
                }
                // Its presence could not be read (counted failed).
                Some(Seen::Unread) | None => {}
            }
        }
        self.recover(source, missing, writer, &mut counts)?;
        Ok(counts)
    }

    /// The events the ledger lacks: applied, or sent again, or (dry run) counted.
    fn recover(
        &self,
        source: &Source,
        missing: Vec<Missing>,
        writer: &WriterHandle,
        counts: &mut Counts,
    ) -> Result<(), GitlabError> {
        if self.dry_run {
            counts.applied += missing.len() as u64;
            return Ok(());
        }
        if self.mode == RecoverMode::Redeliver {
            for Missing { uuid, request, .. } in missing {
                self.api.resend(request.id)?;
                log::info!(
                    "reconcile {} {uuid}: asked GitLab to resend hook event {}",
                    source.name,
                    request.id
                );
                counts.redelivered += 1;
            }
            return Ok(());
        }
        let mut events: Vec<Event> = Vec::with_capacity(missing.len());
        for Missing { key, uuid, request } in missing {
            let applied = request.payload().map_err(String::from).and_then(|payload| {
                super::event_of_request(
                    source,
                    (EVENT_UUID, &uuid),
                    Some(&key),
                    &request.request_headers,
                    payload,
                )
            });
            match applied {
                Ok(e) => events.push(e),
                Err(why) => {
                    log::error!("reconcile {} {uuid}: {why}", source.name);
                    counts.failed += 1;
                }
            }
        }
        apply(source, events, writer, counts);
        Ok(())
    }
}

/// The periodic reconcile of each gitlab source of `config` that has one (`reconcile = {
/// every, since }`, a `hook` and a token), each on a thread of its own.
pub(crate) fn periodic(
    config: &crate::config::Config,
    sources: &HashMap<Arc<str>, Arc<Source>>,
    writer: &WriterHandle,
    reader: &Reader,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<Vec<Periodic>> {
    periodic_each(config, sources, metrics, |c, source, stop| {
        if !is_gitlab(c) {
            return None;
        }
        let GitlabApi { api, hook } = GitlabApi::of(c, None, None).ok()?;
        let run = Run {
            api: GitlabApi {
                api: api.cancelled_by(stop),
                hook,
            },
            mode: c.mode.unwrap_or_default(),
            dry_run: false,
        };
        let (writer, reader) = (writer.clone(), reader.clone());
        Some(Box::new(move |_since, flag| {
            run.once(&source, &writer, &reader, flag)
                .map_err(|e| e.to_string())
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_is_a_project_s_or_a_group_s_and_nothing_else() {
        assert_eq!(
            Hook::parse("projects/42/7").unwrap().path,
            "/projects/42/hooks/7"
        );
        assert_eq!(
            Hook::parse("projects/my-group%2Fmy-app/7").unwrap().path,
            "/projects/my-group%2Fmy-app/hooks/7"
        );
        assert_eq!(Hook::parse("groups/9/3").unwrap().path, "/groups/9/hooks/3");
        for bad in [
            "projects/42",
            "projects/42/x",
            "users/1/2",
            "projects/../7",
            "projects/a/b/7",
        ] {
            assert!(Hook::parse(bad).is_err(), "{bad}");
        }
    }
}
