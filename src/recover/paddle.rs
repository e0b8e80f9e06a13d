//! Paddle: a notification that failed is retried for a while, then given up; the event stays
//! in Paddle's event stream for 90 days. A reconcile lists the stream newest first (`GET
//! /events?order_by=id[DESC]`, 200 a page, each page after the last event id of the one
//! before, as Paddle's pagination says) down to the horizon, and applies each event the ledger
//! lacks as if its webhook had arrived: the body is the event entity as the API lists it
//! (`event_id`, `event_type`, `occurred_at`, `data`: what a webhook carries, without the
//! notification's id), read by the source as a webhook's body is (the paddle preset's
//! `/event_id` and `/event_type`). The claim is the event id, as for the webhook, so a
//! notification that arrives after all, or a second run, finds it claimed.
//!
//! The API key goes as a bearer token; Paddle refuses a bad one with 403 `invalid_token`
//! (401 or 403: the run stops at once and says so). Rate limits and retries are the shared
//! client's ([`super::client`]), the run over the pages the event stream's
//! ([`super::stream`]): at most [`MAX_PAGES`] pages, stopped if the API lists a page it listed
//! before.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{refuse, source_key, ConfigError, Secret, SourceConfig};

use super::client::{Api, Auth};
use super::stream::{self, Page, Stream};

/// The preset whose sources this recovers (`preset = "paddle"`).
pub(crate) const PRESET: &str = "paddle";

/// Paddle's live API (the sandbox's is `https://sandbox-api.paddle.com`).
pub(crate) const PADDLE_API_BASE: &str = "https://api.paddle.com";

/// Paddle's API returns the events of the last 90 days.
pub(crate) const MAX_SINCE: Duration = Duration::from_secs(90 * 86_400);

/// Events per page: Paddle's largest.
const PAGE: usize = 200;

/// Pages one run reads at most: 10,000 events.
pub(crate) const MAX_PAGES: usize = 50;

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PaddleError {
    #[error(
        "Paddle refused the API key (HTTP {status}: {message}); check it, that it is for this \
         environment (live or sandbox: api_base), and that it may read events"
    )]
    Refused { status: u16, message: String },
    #[error("{0}")]
    Failed(String),
}

/// The checks of a paddle source's API settings, naming the key: `reconcile` needs
/// `api_key`, and looks back at most Paddle's 90 days.
pub(crate) fn check_source(source: &SourceConfig) -> Result<(), ConfigError> {
    let key = |field: &str| source_key(&source.name, field);
    if source.reconcile.is_some() && source.api_key.is_none() {
        refuse!(
            key("reconcile"),
            "needs api_key (a Paddle API key that may read events)"
        );
    }
    if let Some(base) = &source.api_base {
        super::check_api_base(&key("api_base"), base)?;
    }
    if let Some(reconcile) = &source.reconcile {
        if reconcile.since > MAX_SINCE {
            refuse!(
                key("reconcile.since"),
                "must be at most 90d (Paddle's API returns the events of the last 90 days)"
            );
        }
    }
    Ok(())
}

/// Whether `source` is recovered from Paddle's events (`preset = "paddle"`).
pub(crate) fn is_paddle(source: &SourceConfig) -> bool {
    source.preset.as_deref() == Some(PRESET)
}

/// A page of the event stream, as Paddle answers it.
#[derive(Deserialize)]
struct Listed {
    data: Vec<serde_json::Value>,
    meta: Meta,
}

#[derive(Deserialize)]
struct Meta {
    pagination: Pagination,
}

#[derive(Deserialize)]
struct Pagination {
    has_more: bool,
}

/// The headers of Paddle's API, besides the key.
const HEADERS: &[(&str, &str)] = &[("Accept", "application/json")];

/// A client for the event stream.
pub(crate) struct PaddleApi {
    api: Api,
}

impl From<String> for PaddleError {
    fn from(why: String) -> PaddleError {
        PaddleError::Failed(why)
    }
}

impl Stream for PaddleApi {
    const PROVIDER: &'static str = "Paddle";
    const MAX_SINCE: Duration = MAX_SINCE;
    const MAX_SINCE_TEXT: &'static str = "90d";
    const ID: &'static str = "event_id";
    const TIME: &'static str = "occurred_at";
    const NEWEST_FIRST: bool = true;
    const MAX_PAGES: usize = MAX_PAGES;
    type Error = PaddleError;

    fn new(_source: &SourceConfig, base: &str, key: Secret) -> PaddleApi {
        PaddleApi {
            api: Api::new("Paddle", base, Auth::Token(key), HEADERS),
        }
    }

    fn cancelled_by(self, cancel: Arc<AtomicBool>) -> PaddleApi {
        PaddleApi {
            api: self.api.cancelled_by(cancel),
        }
    }

    /// A page of events, newest first, after event `after` (the last of the page before).
    fn page(&self, after: Option<&str>, _since: i64) -> Result<Page, PaddleError> {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("order_by", "id[DESC]");
        query.append_pair("per_page", &PAGE.to_string());
        if let Some(after) = after {
            query.append_pair("after", after);
        }
        let (body, _) = self
            .api
            .call("GET", &format!("/events?{}", query.finish()))
            .map_err(|e| {
                e.sorted(
                    |status, message| PaddleError::Refused { status, message },
                    None,
                )
            })?;
        let listed: Listed = serde_json::from_slice(&body).map_err(|e| {
            PaddleError::Failed(format!("Paddle's list of events is not as documented: {e}"))
        })?;
        let last = listed
            .data
            .last()
            .and_then(|e| e.get("event_id"))
            .and_then(|id| id.as_str())
            .map(str::to_string);
        Ok(Page {
            entities: listed.data,
            next: last.filter(|_| listed.meta.pagination.has_more),
        })
    }
}

/// One reconcile of a paddle source.
pub(crate) type Run = stream::Run<PaddleApi>;

/// A run of `source` over the last `since`, its API from `api_base` and `api_key` over the
/// source's own.
pub(crate) fn run(
    source: &SourceConfig,
    since: Duration,
    dry_run: bool,
    api_base: Option<&str>,
    api_key: Option<Secret>,
) -> anyhow::Result<Run> {
    Run::new(source, since, dry_run, (api_base, PADDLE_API_BASE), api_key)
}
