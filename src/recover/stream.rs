//! A run over a provider's event stream (Paddle's `/events`, WorkOS's `/events`): pages of
//! event entities, each the body its webhook carries (or that body without the delivery's own
//! fields), read by the source as a webhook's body is. For each entity since the horizon the
//! ledger lacks, the event is applied through the writer as if it had arrived; the claim is the
//! id the source reads, so a webhook that arrives after all, or a second run, finds it claimed.
//!
//! Stopping: at the end of the stream, at an entity older than the horizon in a stream listed
//! newest first, after [`Stream::MAX_PAGES`] pages (logged), or when a cursor repeats (an
//! error: the API listed a page again).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;

use crate::config::{Config, Secret, SourceConfig};
use crate::event::Event;
use crate::metrics::Metrics;
use crate::source::Source;
use crate::store::Reader;
use crate::writer::WriterHandle;

use super::{apply, periodic_each, present, Counts, Periodic};

/// A page of a stream: its entities, and the cursor of the next page (`None`: the last).
pub(crate) struct Page {
    pub(crate) entities: Vec<serde_json::Value>,
    pub(crate) next: Option<String>,
}

/// One provider's event stream.
pub(crate) trait Stream: Sized + Send + 'static {
    /// The provider, for messages ("Paddle").
    const PROVIDER: &'static str;
    /// How far back the API lists events.
    const MAX_SINCE: Duration;
    /// [`Stream::MAX_SINCE`] as the config writes it ("90d").
    const MAX_SINCE_TEXT: &'static str;
    /// The entity's field with its id (what the source reads as the event id).
    const ID: &'static str;
    /// The entity's field with the RFC 3339 time it occurred.
    const TIME: &'static str;
    /// Whether pages come newest first (an entity older than the horizon ends the run).
    const NEWEST_FIRST: bool;
    /// Pages one run reads at most.
    const MAX_PAGES: usize;
    /// Why a run stopped.
    type Error: From<String> + std::fmt::Display;

    /// The client of `source`'s API at `base` with `key`.
    fn new(source: &SourceConfig, base: &str, key: Secret) -> Self;

    /// The same client, whose pauses end (and calls fail) once `cancel` is set.
    fn cancelled_by(self, cancel: Arc<AtomicBool>) -> Self;

    /// The page at `cursor` (`None`: the first), for a run back to `since` (Unix seconds).
    fn page(&self, cursor: Option<&str>, since: i64) -> Result<Page, Self::Error>;
}

/// One reconcile of a source over its provider's event stream.
pub(crate) struct Run<S> {
    pub(crate) stream: S,
    /// Events that occurred at or after this (Unix seconds).
    pub(crate) since: i64,
    pub(crate) dry_run: bool,
}

impl<S: Stream> Run<S> {
    /// A run for `source` over the last `since`, its API at `api_base` (over the source's,
    /// over `default`) with `api_key` (over the source's).
    pub(crate) fn new(
        source: &SourceConfig,
        since: Duration,
        dry_run: bool,
        (api_base, default): (Option<&str>, &str),
        api_key: Option<Secret>,
    ) -> anyhow::Result<Run<S>> {
        super::check_since(
            since,
            S::MAX_SINCE,
            S::MAX_SINCE_TEXT,
            &format!(
                "{}'s API lists the events of the last {}",
                S::PROVIDER,
                S::MAX_SINCE_TEXT
            ),
        )?;
        let Some(key) = api_key.or_else(|| source.api_key.clone()) else {
            anyhow::bail!(
                "no {} API key: pass --api-key env:NAME, or give the source api_key = \
                 \"env:NAME\"",
                S::PROVIDER
            );
        };
        let base = super::api_base(api_base, source, default)?;
        Ok(Run {
            stream: S::new(source, base, key),
            since: super::horizon(since),
            dry_run,
        })
    }

    /// Reconciles `source` until done or `stop` is set (checked between pages): each event
    /// since the horizon that the ledger lacks is applied.
    pub(crate) fn once(
        &self,
        source: &Source,
        writer: &WriterHandle,
        reader: &Reader,
        stop: &AtomicBool,
    ) -> Result<Counts, S::Error> {
        once(
            &self.stream,
            self.since,
            self.dry_run,
            (source, writer, reader),
            stop,
        )
    }
}

/// The periodic reconcile of each source of `config` that `is` picks and that has one
/// (`reconcile = { every, since }` and an `api_key`), each on a thread of its own, its API at
/// the source's `api_base` or `default`.
pub(crate) fn periodic<S: Stream>(
    (config, sources): (&Config, &HashMap<Arc<str>, Arc<Source>>),
    (writer, reader): (&WriterHandle, &Reader),
    metrics: &Arc<Metrics>,
    is: fn(&SourceConfig) -> bool,
    default: &str,
) -> anyhow::Result<Vec<Periodic>> {
    periodic_each(config, sources, metrics, |c, source, stop| {
        if !is(c) {
            return None;
        }
        let base = super::api_base(None, c, default).ok()?;
        let mut run = Run {
            stream: S::new(c, base, c.api_key.clone()?).cancelled_by(stop),
            since: 0,
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

/// Reconciles `source` with `stream` back to `since` until done or `stop` is set (checked
/// between pages); with `dry_run`, counts what it would apply.
fn once<S: Stream>(
    stream: &S,
    since: i64,
    dry_run: bool,
    (source, writer, reader): (&Source, &WriterHandle, &Reader),
    stop: &AtomicBool,
) -> Result<Counts, S::Error> {
    let mut counts = Counts::default();
    let mut cursors = HashSet::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    while !stop.load(Ordering::SeqCst) {
        let page = stream.page(cursor.as_deref(), since)?;
        pages += 1;
        let mut older = false;
        let mut missing = Vec::new();
        for entity in &page.entities {
            let at = entity
                .get(S::TIME)
                .and_then(|t| t.as_str())
                .and_then(crate::time::parse_rfc3339)
                .unwrap_or(i64::MAX);
            if at < since {
                older = true;
                continue;
            }
            counts.found += 1;
            match event_of::<S>(source, entity) {
                Ok(event) => match present(reader, &source.name, &event.id) {
                    Ok(true) => counts.already_present += 1,
                    Ok(false) => missing.push(event),
                    Err(e) => {
                        log::error!("reconcile {} {}: {e}", source.name, event.id);
                        counts.failed += 1;
                    }
                },
                Err(why) => {
                    log::error!(
                        "reconcile {}: an event of {}'s: {why}",
                        source.name,
                        S::PROVIDER
                    );
                    counts.failed += 1;
                }
            }
        }
        if dry_run {
            counts.applied += missing.len() as u64;
        } else {
            apply(source, missing, writer, &mut counts);
        }
        let Some(next) = page.next else { break };
        if page.entities.is_empty() || (S::NEWEST_FIRST && older) {
            break;
        }
        if pages >= S::MAX_PAGES {
            let rest = match S::NEWEST_FIRST {
                true => "older ones were not checked",
                // Oldest first: each run would stop at the same place; a shorter look back
                // gets to the newest.
                false => "the newest were not checked: shorten reconcile.since",
            };
            log::warn!(
                "reconcile {}: stopped after {} pages ({} events); {rest}",
                source.name,
                S::MAX_PAGES,
                counts.found
            );
            break;
        }
        if !cursors.insert(next.clone()) {
            return Err(format!(
                "{}'s API listed the page after {next} again; stopped after {pages} pages",
                S::PROVIDER
            )
            .into());
        }
        cursor = Some(next);
    }
    Ok(counts)
}

/// The event of an entity of the stream, read as the source reads a webhook's body.
fn event_of<S: Stream>(source: &Source, entity: &serde_json::Value) -> Result<Event, String> {
    let listed = entity
        .get(S::ID)
        .and_then(|id| id.as_str())
        .ok_or_else(|| format!("it has no string {}", S::ID))?;
    let body = serde_json::to_vec(entity).map_err(|e| e.to_string())?;
    let envelope = source
        .envelope(&HeaderMap::new(), &body)
        .map_err(|e| format!("{listed}: {}", e.summary()))?;
    if envelope.id != listed {
        return Err(format!(
            "{listed}: the source reads id {} from it, not its {}; not applied",
            envelope.id,
            S::ID
        ));
    }
    Ok(Event {
        source: source.name.clone(),
        id: envelope.id,
        kind: envelope.kind,
        created: envelope.created,
        body: body.into(),
    })
}
