//! WorkOS: a webhook that failed is retried for a while, then given up; the event stays in
//! WorkOS's event stream for 30 days. A reconcile lists the stream from the horizon on (`GET
//! /events` with `range_start`, `order=asc`, 100 a page, each later page from the cursor
//! `list_metadata.after` of the one before) and applies each event the ledger lacks as if its
//! webhook had arrived: the body is the event entity (`id`, `event`, `data`, `created_at`:
//! what a webhook carries), read by the source as a webhook's body is (the workos preset's
//! `/id` and `/event`). The claim is the event id, as for the webhook.
//!
//! WorkOS's API lists only the event types a call names (`events`, required: WorkOS's own
//! SDKs refuse a call without it), so the source names them: `event_types = [...]`, the types
//! its webhook endpoint is subscribed to. The key goes as a bearer token; a 401 or 403 stops the
//! run at once. Rate limits and retries are the shared client's ([`super::client`]), the run
//! over the pages the event stream's ([`super::stream`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{refuse, source_key, ConfigError, Secret, SourceConfig};

use super::client::{Api, Auth};
use super::stream::{self, Page, Stream};

/// The preset whose sources this recovers (`preset = "workos"`).
pub(crate) const PRESET: &str = "workos";

/// WorkOS's API.
pub(crate) const WORKOS_API_BASE: &str = "https://api.workos.com";

/// WorkOS's API lists the events of the last 30 days.
pub(crate) const MAX_SINCE: Duration = Duration::from_secs(30 * 86_400);

/// Events per page: WorkOS's largest.
const PAGE: usize = 100;

/// Pages one run reads at most: 10,000 events.
const MAX_PAGES: usize = 100;

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WorkosError {
    #[error(
        "WorkOS refused the API key (HTTP {status}: {message}); check it, that it is the \
         environment's (production or staging), and that it may read events"
    )]
    Refused { status: u16, message: String },
    #[error("{0}")]
    Failed(String),
}

impl From<String> for WorkosError {
    fn from(why: String) -> WorkosError {
        WorkosError::Failed(why)
    }
}

/// Whether `source` is recovered from WorkOS's events (`preset = "workos"`).
pub(crate) fn is_workos(source: &SourceConfig) -> bool {
    source.preset.as_deref() == Some(PRESET)
}

/// The checks of a workos source's API settings, naming the key: `reconcile` needs `api_key`
/// and `event_types`, and looks back at most WorkOS's 30 days.
pub(crate) fn check_source(source: &SourceConfig) -> Result<(), ConfigError> {
    let key = |field: &str| source_key(&source.name, field);
    if let Some(reconcile) = &source.reconcile {
        if source.event_types.is_empty() {
            refuse!(
                key("reconcile"),
                "needs event_types = [\"user.created\", …]: WorkOS's API lists only the event \
                 types a call names (those the webhook endpoint is subscribed to)"
            );
        }
        if reconcile.since > MAX_SINCE {
            refuse!(
                key("reconcile.since"),
                "must be at most 30d (WorkOS's API lists the events of the last 30 days)"
            );
        }
    }
    check_types(source)?;
    if let Some(base) = &source.api_base {
        super::check_api_base(&key("api_base"), base)?;
    }
    Ok(())
}

/// Each of `event_types` a WorkOS type: dotted words (`dsync.user.created`).
fn check_types(source: &SourceConfig) -> Result<(), ConfigError> {
    for t in &source.event_types {
        let word = |w: &str| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        if !t.split('.').all(word) {
            refuse!(
                source_key(&source.name, "event_types"),
                "`{t}` is not a WorkOS event type (dotted lowercase words, as user.created)"
            );
        }
    }
    Ok(())
}

/// A page of the event stream, as WorkOS answers it.
#[derive(Deserialize)]
struct Listed {
    data: Vec<serde_json::Value>,
    list_metadata: ListMetadata,
}

#[derive(Deserialize)]
struct ListMetadata {
    after: Option<String>,
}

/// The headers of WorkOS's API, besides the key.
const HEADERS: &[(&str, &str)] = &[("Accept", "application/json")];

/// A client for the event stream of some event types.
pub(crate) struct WorkosApi {
    api: Api,
    /// `events`: the types, comma-separated, as WorkOS's SDKs send them.
    types: String,
}

impl Stream for WorkosApi {
    const PROVIDER: &'static str = "WorkOS";
    const MAX_SINCE: Duration = MAX_SINCE;
    const MAX_SINCE_TEXT: &'static str = "30d";
    const ID: &'static str = "id";
    const TIME: &'static str = "created_at";
    const NEWEST_FIRST: bool = false;
    const MAX_PAGES: usize = MAX_PAGES;
    type Error = WorkosError;

    fn new(source: &SourceConfig, base: &str, key: Secret) -> WorkosApi {
        WorkosApi {
            api: Api::new("WorkOS", base, Auth::Token(key), HEADERS),
            types: source.event_types.join(","),
        }
    }

    fn cancelled_by(self, cancel: Arc<AtomicBool>) -> WorkosApi {
        WorkosApi {
            api: self.api.cancelled_by(cancel),
            types: self.types,
        }
    }

    /// The first page from `since` on, oldest first; a later one from `cursor` (WorkOS's
    /// `range_start` and `after` do not go together).
    fn page(&self, cursor: Option<&str>, since: i64) -> Result<Page, WorkosError> {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("events", &self.types);
        query.append_pair("order", "asc");
        query.append_pair("limit", &PAGE.to_string());
        match cursor {
            Some(after) => query.append_pair("after", after),
            None => query.append_pair("range_start", &crate::time::format_rfc3339(since)),
        };
        let (body, _) = self
            .api
            .call("GET", &format!("/events?{}", query.finish()))
            .map_err(|e| {
                e.sorted(
                    |status, message| WorkosError::Refused { status, message },
                    None,
                )
            })?;
        let listed: Listed = serde_json::from_slice(&body).map_err(|e| {
            WorkosError::Failed(format!("WorkOS's list of events is not as documented: {e}"))
        })?;
        Ok(Page {
            entities: listed.data,
            next: listed.list_metadata.after,
        })
    }
}

/// One reconcile of a workos source.
pub(crate) type Run = stream::Run<WorkosApi>;

/// A run of `source` over the last `since`, its API from `api_base` and `api_key` over the
/// source's own.
pub(crate) fn run(
    source: &SourceConfig,
    since: Duration,
    dry_run: bool,
    api_base: Option<&str>,
    api_key: Option<Secret>,
) -> anyhow::Result<Run> {
    if source.event_types.is_empty() {
        anyhow::bail!(
            "source `{}`: WorkOS's API lists only the event types a call names: give the \
             source event_types = [\"user.created\", …]",
            source.name
        );
    }
    Run::new(source, since, dry_run, (api_base, WORKOS_API_BASE), api_key)
}
