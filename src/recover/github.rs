//! GitHub: a webhook that failed is never retried (GitHub's docs suggest a script that lists
//! the failed deliveries and redelivers them). A reconcile lists the hook's deliveries since
//! the horizon (`GET {hook}/deliveries`, newest first, GitHub's cursor in the `Link` header),
//! and for each delivery GUID the ledger lacks either reads the delivery's request (its
//! headers and payload) and applies it as if it had arrived (`mode = "apply"`, the default),
//! or asks GitHub to deliver it again (`mode = "redeliver"`, `POST …/attempts`), which then
//! comes as a signed webhook. The claim is the GUID, as for the webhook, so a delivery that
//! arrives after all, or a second run, finds it claimed.
//!
//! The hook is a repository's or an organization's (read with a token, `api_key`), or a GitHub
//! App's own (`hook = "app"`: `/app/hook/…`, read with the App's JWT, [`super::jwt`]).
//!
//! An applied delivery's body is the payload GitHub shows, serialized again: the same JSON,
//! not the bytes that were signed (it came over TLS from GitHub with our token, and needs no
//! signature). Its id and type are read from the delivery's own request headers as the
//! source reads a webhook's (`X-GitHub-Delivery`, `X-GitHub-Event` and the body's `action`,
//! or the source's `id`/`type` overrides).
//!
//! Rate limits and retries are the shared client's ([`super::client`]): a 429, or a 403 with
//! `x-ratelimit-remaining: 0` or a `retry-after`, is waited out when the wait is short and
//! stops the run otherwise; any other 401 or 403 is a refused token and stops the run at once, as does a hook that is not there (404). A
//! run reads at most [`MAX_PAGES`] pages, and stops if a cursor repeats.

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
use super::jwt::AppKey;
use super::{apply, periodic_each, present, Counts, Periodic};

/// GitHub's API.
pub(crate) const GITHUB_API_BASE: &str = "https://api.github.com";

/// GitHub keeps a hook's deliveries (and redelivers them) for 3 days.
pub(crate) const MAX_SINCE: Duration = Duration::from_secs(3 * 86_400);

/// Deliveries per page: GitHub's largest.
const PAGE: usize = 100;

/// Pages one run reads at most: 10,000 deliveries.
pub(crate) const MAX_PAGES: usize = 100;

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GithubError {
    #[error(
        "GitHub refused the token (HTTP {status}: {message}); check it and that it may read \
         the webhook's deliveries (fine-grained: Webhooks read, and write for redeliver)"
    )]
    Refused { status: u16, message: String },
    #[error("GitHub has no webhook {0} that this token can see (HTTP 404)")]
    NoHook(String),
    #[error("{0}")]
    Failed(String),
}

impl From<String> for GithubError {
    fn from(why: String) -> GithubError {
        GithubError::Failed(why)
    }
}

/// Which webhook: a repository's, an organization's, or a GitHub App's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hook {
    /// `/repos/OWNER/REPO/hooks/ID`, `/orgs/ORG/hooks/ID` or `/app/hook`.
    path: String,
    /// As the config names it, for messages.
    name: String,
}

impl Hook {
    /// `repos/OWNER/REPO/HOOK_ID`, `orgs/ORG/HOOK_ID` or `app`.
    pub(crate) fn parse(text: &str) -> Result<Hook, String> {
        let parts: Vec<&str> = text.trim_matches('/').split('/').collect();
        let plain = |s: &str| {
            !s.is_empty()
                && !s.chars().all(|c| c == '.')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        let path =
            match parts.as_slice() {
                ["repos", owner, repo, id] if plain(owner) && plain(repo) => {
                    format!("/repos/{owner}/{repo}/hooks/{}", hook_id(id)?)
                }
                ["orgs", org, id] if plain(org) => format!("/orgs/{org}/hooks/{}", hook_id(id)?),
                ["app"] => "/app/hook".to_string(),
                _ => return Err(
                    "must be \"repos/OWNER/REPO/HOOK_ID\", \"orgs/ORG/HOOK_ID\" (the hook's id \
                     is in its settings page's URL) or \"app\" (a GitHub App's own hook)"
                        .into(),
                ),
            };
        Ok(Hook {
            path,
            name: text.to_string(),
        })
    }

    /// Whether this is a GitHub App's own hook, read with the App's JWT.
    fn is_app(&self) -> bool {
        self.path == "/app/hook"
    }
}

fn hook_id(text: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| format!("the hook id `{text}` is not a number"))
}

/// The checks of a github source's API settings, naming the key: `hook` and `api_key` go
/// together with `reconcile` and `mode`, `since` within GitHub's 3 days.
pub(crate) fn check_source(source: &SourceConfig) -> Result<(), ConfigError> {
    let key = |field: &str| source_key(&source.name, field);
    if let Some(hook) = &source.hook {
        let hook = Hook::parse(hook).map_err(|e| ConfigError::new(key("hook"), e))?;
        if hook.is_app() {
            check_app(source)?;
        } else if source.api_key.is_none() {
            refuse!(
                key("hook"),
                "needs api_key (a token that may read the hook's deliveries)"
            );
        }
    }
    for (field, set) in [
        ("app_id", source.app_id.is_some()),
        ("private_key", source.private_key.is_some()),
    ] {
        let app = source
            .hook
            .as_deref()
            .and_then(|h| Hook::parse(h).ok())
            .is_some_and(|h| h.is_app());
        if set && !app {
            refuse!(
                key(field),
                "applies to hook = \"app\" only (a GitHub App's own hook)"
            );
        }
    }
    let wants_hook = [
        ("reconcile", source.reconcile.is_some()),
        ("mode", source.mode.is_some()),
        ("api_key", source.api_key.is_some()),
        ("api_base", source.api_base.is_some()),
    ];
    for (field, set) in wants_hook {
        if set && source.hook.is_none() {
            refuse!(
                key(field),
                "needs hook = \"repos/OWNER/REPO/HOOK_ID\" or \"orgs/ORG/HOOK_ID\" (the webhook \
                 whose deliveries are recovered)"
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
                "must be at most 3d (GitHub keeps a hook's deliveries for 3 days)"
            );
        }
    }
    Ok(())
}

/// A GitHub App's hook: read with the App's JWT, so `app_id` and a `private_key` that signs
/// (checked here, before anything is opened), and no `api_key`.
fn check_app(source: &SourceConfig) -> Result<(), ConfigError> {
    let key = |field: &str| source_key(&source.name, field);
    if source.api_key.is_some() {
        refuse!(
            key("api_key"),
            "a GitHub App's hook is read with the App's own JWT: give app_id and private_key, \
             not api_key"
        );
    }
    let (Some(app_id), Some(private_key)) = (source.app_id, &source.private_key) else {
        refuse!(
            key("hook"),
            "\"app\" needs app_id (the App's id, on its settings page) and private_key = \
             \"file:PATH\" (a private key generated for the App, the .pem GitHub gives)"
        );
    };
    AppKey::new(app_id, private_key.expose())
        .map_err(|e| ConfigError::new(key("private_key"), e))?;
    Ok(())
}

/// One delivery of the list.
#[derive(Debug, Deserialize)]
struct Summary {
    id: u64,
    guid: String,
    delivered_at: String,
}

/// One delivery, read by id: the request as GitHub sent it.
#[derive(Deserialize)]
struct Delivery {
    request: DeliveryRequest,
}

#[derive(Deserialize)]
struct DeliveryRequest {
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
    payload: Option<serde_json::Value>,
}

/// A client for one hook's deliveries.
pub(crate) struct GithubApi {
    api: Api,
    hook: Hook,
}

/// The headers of GitHub's REST API, besides the token.
const HEADERS: &[(&str, &str)] = &[
    ("Accept", "application/vnd.github+json"),
    ("X-GitHub-Api-Version", "2022-11-28"),
];

impl GithubApi {
    pub(crate) fn new(base: &str, auth: Auth, hook: Hook) -> GithubApi {
        GithubApi {
            api: Api::new("GitHub", base, auth, HEADERS),
            hook,
        }
    }

    /// The client of a github source with a `hook` and its credentials: an `api_key`, or for
    /// the App's hook its `app_id` and `private_key`; `api_base` and `api_key` override the
    /// source's own.
    pub(crate) fn of(
        source: &SourceConfig,
        api_base: Option<&str>,
        api_key: Option<Secret>,
    ) -> Result<GithubApi, String> {
        let hook = source.hook.as_deref().ok_or("no hook")?;
        let hook = Hook::parse(hook).map_err(|e| format!("hook: {e}"))?;
        let base = super::api_base(api_base, source, GITHUB_API_BASE).map_err(|e| e.to_string())?;
        let auth = match (hook.is_app(), source.app_id, &source.private_key) {
            (true, _, _) if api_key.is_some() => {
                return Err(
                    "a GitHub App's hook is read with the App's own JWT (app_id and \
                            private_key): --api-key does not apply"
                        .into(),
                )
            }
            (true, Some(app_id), Some(pem)) => {
                Auth::App(Arc::new(AppKey::new(app_id, pem.expose())?))
            }
            (true, _, _) => return Err("\"app\" needs app_id and private_key".into()),
            (false, _, _) => Auth::Token(api_key.or_else(|| source.api_key.clone()).ok_or(
                "no GitHub token: pass --api-key env:NAME, or give the source \
                            api_key = \"env:NAME\"",
            )?),
        };
        Ok(GithubApi::new(base, auth, hook))
    }

    /// The same client, whose pauses end (and calls fail) once `cancel` is set.
    pub(crate) fn cancelled_by(self, cancel: Arc<AtomicBool>) -> GithubApi {
        GithubApi {
            api: self.api.cancelled_by(cancel),
            hook: self.hook,
        }
    }

    /// A page of deliveries (newest first) after `cursor`, and the next page's cursor.
    fn deliveries(
        &self,
        cursor: Option<&str>,
    ) -> Result<(Vec<Summary>, Option<String>), GithubError> {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("per_page", &PAGE.to_string());
        if let Some(cursor) = cursor {
            query.append_pair("cursor", cursor);
        }
        let path = format!("{}/deliveries?{}", self.hook.path, query.finish());
        let (body, link) = self.call("GET", &path)?;
        let page: Vec<Summary> = serde_json::from_slice(&body).map_err(|e| {
            GithubError::Failed(format!(
                "GitHub's list of deliveries is not as documented: {e}"
            ))
        })?;
        Ok((
            page,
            link.as_deref().and_then(|l| next_link_param(l, "cursor")),
        ))
    }

    /// Delivery `id`: its request's headers and payload.
    fn delivery(&self, id: u64) -> Result<Delivery, GithubError> {
        let (body, _) = self.call("GET", &format!("{}/deliveries/{id}", self.hook.path))?;
        serde_json::from_slice(&body).map_err(|e| {
            GithubError::Failed(format!("GitHub's delivery {id} is not as documented: {e}"))
        })
    }

    /// Asks GitHub to deliver `id` again.
    fn redeliver(&self, id: u64) -> Result<(), GithubError> {
        self.call(
            "POST",
            &format!("{}/deliveries/{id}/attempts", self.hook.path),
        )
        .map(drop)
    }

    /// `method path` through [`Api::call`]; a 401 or 403 left after its rate-limit checks is a
    /// refused token, a 404 a hook that is not there (or not to this token).
    fn call(&self, method: &str, path: &str) -> Result<(Vec<u8>, Option<String>), GithubError> {
        self.api.call(method, path).map_err(|e| {
            e.sorted(
                |status, message| GithubError::Refused { status, message },
                Some(GithubError::NoHook(self.hook.name.clone())),
            )
        })
    }
}

/// One reconcile of a github source.
pub(crate) struct Run {
    pub(crate) api: GithubApi,
    /// Deliveries at or after this (Unix seconds).
    pub(crate) since: i64,
    pub(crate) mode: RecoverMode,
    pub(crate) dry_run: bool,
}

impl Run {
    /// A run for `source` over the last `since`, its API from `api_base` and `api_key` over
    /// the source's own.
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
            "3d",
            "GitHub keeps a hook's deliveries for 3 days",
        )?;
        if source.hook.is_none() {
            anyhow::bail!(
                "source `{}`: reconcile lists a GitHub webhook's deliveries: give the source \
                 hook = \"repos/OWNER/REPO/HOOK_ID\" and api_key = \"env:NAME\"",
                source.name
            );
        }
        let api = GithubApi::of(source, api_base, api_key)
            .map_err(|e| anyhow::anyhow!("source `{}`: {e}", source.name))?;
        Ok(Run {
            api,
            since: super::horizon(since),
            mode: source.mode.unwrap_or_default(),
            dry_run,
        })
    }

    /// Reconciles `source` until done or `stop` is set (checked between pages): each GUID
    /// delivered since the horizon that the ledger lacks is applied or redelivered.
    pub(crate) fn once(
        &self,
        source: &Source,
        writer: &WriterHandle,
        reader: &Reader,
        stop: &AtomicBool,
    ) -> Result<Counts, GithubError> {
        let mut counts = Counts::default();
        let mut guids = HashSet::new();
        let mut cursors = HashSet::new();
        let mut cursor: Option<String> = None;
        let mut pages = 0;
        loop {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let (page, next) = self.api.deliveries(cursor.as_deref())?;
            pages += 1;
            let mut older = page.is_empty();
            let mut missing = Vec::new();
            for delivery in page {
                let at = crate::time::parse_rfc3339(&delivery.delivered_at).unwrap_or(i64::MAX);
                if at < self.since {
                    older = true;
                    continue;
                }
                // A redelivery has the GUID of the delivery it repeats: the newest is listed
                // first, and one of them is enough.
                if !guids.insert(delivery.guid.clone()) {
                    continue;
                }
                counts.found += 1;
                match present(reader, &source.name, &delivery.guid) {
                    Ok(true) => counts.already_present += 1,
                    Ok(false) => missing.push(delivery),
                    Err(e) => {
                        log::error!("reconcile {} {}: {e}", source.name, delivery.guid);
                        counts.failed += 1;
                    }
                }
            }
            self.recover(source, missing, writer, &mut counts)?;
            let Some(next) = next else { break };
            if older {
                break;
            }
            if pages >= MAX_PAGES {
                log::warn!(
                    "reconcile {}: stopped after {MAX_PAGES} pages ({} deliveries); older ones \
                     were not checked",
                    source.name,
                    counts.found
                );
                break;
            }
            if !cursors.insert(next.clone()) {
                return Err(GithubError::Failed(format!(
                    "GitHub's API listed the page after cursor {next} again; stopped after {} \
                     pages",
                    cursors.len()
                )));
            }
            cursor = Some(next);
        }
        Ok(counts)
    }

    /// The deliveries the ledger lacks: applied, or redelivered, or (dry run) counted.
    fn recover(
        &self,
        source: &Source,
        missing: Vec<Summary>,
        writer: &WriterHandle,
        counts: &mut Counts,
    ) -> Result<(), GithubError> {
        if self.dry_run {
            counts.applied += missing.len() as u64;
            return Ok(());
        }
        if self.mode == RecoverMode::Redeliver {
            for delivery in missing {
                self.api.redeliver(delivery.id)?;
                log::info!(
                    "reconcile {} {}: asked GitHub to redeliver delivery {}",
                    source.name,
                    delivery.guid,
                    delivery.id
                );
                counts.redelivered += 1;
            }
            return Ok(());
        }
        let mut events = Vec::with_capacity(missing.len());
        for delivery in missing {
            let request = self.api.delivery(delivery.id)?.request;
            match event_of(source, &delivery.guid, request) {
                Ok(event) => events.push(event),
                Err(why) => {
                    log::error!("reconcile {} {}: {why}", source.name, delivery.guid);
                    counts.failed += 1;
                }
            }
        }
        apply(source, events, writer, counts);
        Ok(())
    }
}

/// The periodic reconcile of each github source of `config` that has one (`reconcile = {
/// every, since }`, a `hook` and a token), each on a thread of its own.
pub(crate) fn periodic(
    config: &crate::config::Config,
    sources: &HashMap<Arc<str>, Arc<Source>>,
    writer: &WriterHandle,
    reader: &Reader,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<Vec<Periodic>> {
    periodic_each(config, sources, metrics, |c, source, stop| {
        let mut run = Run {
            api: GithubApi::of(c, None, None).ok()?.cancelled_by(stop),
            since: 0,
            mode: c.mode.unwrap_or_default(),
            dry_run: false,
        };
        let (writer, reader) = (writer.clone(), reader.clone());
        Some(Box::new(move |since, flag| {
            run.since = since;
            run.once(&source, &writer, &reader, flag)
                .map_err(|e| e.to_string())
        }))
    })
}

/// The event a delivery's request carried, read as the source reads a webhook.
fn event_of(source: &Source, guid: &str, request: DeliveryRequest) -> Result<Event, String> {
    let payload = request
        .payload
        .ok_or("GitHub shows no payload for this delivery")?;
    super::event_of_request(
        source,
        (crate::source::hmac::GITHUB_DELIVERY, guid),
        None,
        &request.headers,
        &payload,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hook_is_a_repository_s_or_an_organization_s_and_nothing_else() {
        assert_eq!(
            Hook::parse("repos/octo/app/12345").unwrap().path,
            "/repos/octo/app/hooks/12345"
        );
        assert_eq!(
            Hook::parse("orgs/octo/7").unwrap().path,
            "/orgs/octo/hooks/7"
        );
        for bad in [
            "repos/octo/12",
            "orgs/octo/x",
            "repos/o/r/1/2",
            "users/x/1",
            "repos/../r/1",
        ] {
            assert!(Hook::parse(bad).is_err(), "{bad}");
        }
        let app = Hook::parse("app").unwrap();
        assert_eq!(app.path, "/app/hook");
        assert!(app.is_app());
        assert!(!Hook::parse("orgs/octo/7").unwrap().is_app());
    }
}
