//! Reconcile: the events Stripe has that the ledger lacks (a webhook missed for good: the
//! endpoint down for longer than Stripe retries, a secret wrong for a day), recovered from
//! Stripe's API and run through the same claim and effects as a webhook.
//!
//! Pages of `GET /v1/events` (newest first, 100 each, `created[gte]`) are read one at a time;
//! the events of a page the ledger lacks go to the writer all at once, so they share
//! transactions as concurrent webhooks do (the writer orders each batch by claim key; the
//! guards make the order of events irrelevant). Every event is its own claim: a run killed midway
//! leaves whole events behind, and the next run (or the webhook, if it comes) finds them
//! claimed. Events from the API come over TLS from Stripe with our key, so they need no
//! webhook signature.
//!
//! A run ends when the API says there is no more, and also when it repeats a page (a cursor
//! seen before: an error, the API is broken) or after [`MAX_PAGES`] pages (logged; the older
//! events are not checked by this run): an API that always says `has_more` cannot keep a run
//! going for ever.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use anyhow::bail;

use crate::config::{Config, SchemeName, Secret, SourceConfig};
use crate::event::Event;
use crate::recover::{self, apply, periodic_each, without_present, Counts, Periodic};
use crate::source::{stripe, Source};
use crate::store::Reader;
use crate::stripe::settings::{MAX_RECONCILE_SINCE, STRIPE_API_BASE};
use crate::writer::WriterHandle;

use crate::stripe::api::{ApiError, StripeApi};

/// Pages one run reads at most: 100,000 events, more than most accounts make in Stripe's 30
/// days.
pub(crate) const MAX_PAGES: usize = 1000;

/// The pages of one run so far: a page whose cursor was seen before is a repeat.
struct Pages {
    cursors: HashSet<String>,
    max: usize,
}

/// Whether to read the page after a cursor.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Read,
    /// The cursor was seen before: the API listed a page again.
    Repeated,
    /// [`Pages::max`] pages were read.
    Enough,
}

impl Pages {
    fn new(max: usize) -> Pages {
        Pages {
            cursors: HashSet::new(),
            max,
        }
    }

    /// A page that ends with event `cursor` and says there is more was read.
    fn after(&mut self, cursor: &str) -> Next {
        if !self.cursors.insert(cursor.to_string()) {
            Next::Repeated
        } else if self.cursors.len() >= self.max {
            Next::Enough
        } else {
            Next::Read
        }
    }
}

/// One reconcile: which API, from when, and whether to change anything.
pub(crate) struct Run {
    pub(crate) api: StripeApi,
    /// Events Stripe created at or after this (Unix seconds).
    pub(crate) since: i64,
    /// Count what would be applied; write nothing.
    pub(crate) dry_run: bool,
}

impl Run {
    /// A run for `source` over the events of the last `since`: its API from `api_base` and
    /// `api_key` over the source's own settings, the key else from `STRIPE_API_KEY`.
    pub(crate) fn new(
        source: &SourceConfig,
        since: Duration,
        dry_run: bool,
        api_base: Option<&str>,
        api_key: Option<Secret>,
    ) -> anyhow::Result<Run> {
        recover::check_since(
            since,
            MAX_RECONCILE_SINCE,
            "30d",
            "Stripe keeps events for 30 days",
        )?;
        if source.scheme != SchemeName::Stripe {
            bail!(
                "source `{}`: reconcile reads Stripe's API; this source's scheme is {}",
                source.name,
                source.scheme.as_str()
            );
        }
        let key = match api_key.or_else(|| source.api_key.clone()) {
            Some(key) => key,
            None => Secret::new(std::env::var("STRIPE_API_KEY").map_err(|_| {
                anyhow::anyhow!(
                    "no Stripe API key: set STRIPE_API_KEY, pass --api-key env:NAME, or give the \
                     source api_key = \"env:NAME\" in the config file"
                )
            })?),
        };
        let base = recover::api_base(api_base, source, STRIPE_API_BASE)?;
        Ok(Run {
            api: StripeApi::new(base, key),
            since: recover::horizon(since),
            dry_run,
        })
    }

    /// Reconciles `source` until done or `stop` is set (checked between pages): the events the
    /// ledger lacks (looked up on `reader` first, so that events claimed long ago do not go
    /// through the writer again each run; the claim still decides) go through `writer`, the
    /// same claim and effects as a webhook. An `Err` stops the run (the API refused the key,
    /// kept failing, or repeated a page); what was applied before stays, and a rerun picks up
    /// the rest.
    pub(crate) fn once(
        &self,
        source: &Source,
        writer: &WriterHandle,
        reader: &Reader,
        stop: &AtomicBool,
    ) -> Result<Counts, ApiError> {
        let mut counts = Counts::default();
        let mut after: Option<String> = None;
        let mut pages = Pages::new(MAX_PAGES);
        while !stop.load(Ordering::SeqCst) {
            let page = self.api.events(self.since, after.as_deref())?;
            let Some(last) = page.events.last() else {
                break;
            };
            let cursor = event_id(last)?;
            let next = if page.has_more {
                pages.after(&cursor)
            } else {
                Next::Read
            };
            if next == Next::Repeated {
                return Err(ApiError::Failed(format!(
                    "Stripe's API listed the page ending with event {cursor} again (the cursor \
                     did not advance, and it says there is more); stopped after {} pages",
                    pages.cursors.len()
                )));
            }
            counts.found += page.events.len() as u64;
            after = Some(cursor);
            let mut events = Vec::with_capacity(page.events.len());
            for body in page.events {
                match read(source, body) {
                    Some(event) => events.push(event),
                    None => counts.failed += 1,
                }
            }
            let missing = without_present(source, events, reader, &mut counts);
            if self.dry_run {
                counts.applied += missing.len() as u64;
            } else {
                apply(source, missing, writer, &mut counts);
            }
            if !page.has_more {
                break;
            }
            if next == Next::Enough {
                log::warn!(
                    "reconcile {}: stopped after {MAX_PAGES} pages ({} events); the older \
                     events of the period were not checked",
                    source.name,
                    counts.found
                );
                break;
            }
        }
        Ok(counts)
    }
}

/// The id of a listed event, for the next page's `starting_after`.
fn event_id(body: &[u8]) -> Result<String, ApiError> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_slice::<Id>(body)
        .map(|e| e.id)
        .map_err(|e| ApiError::Failed(format!("an event in Stripe's list has no id: {e}")))
}

/// The event in `body`, read as the stripe scheme reads a webhook; `None` (logged) when it
/// cannot be.
fn read(source: &Source, body: Vec<u8>) -> Option<Event> {
    match stripe::envelope(&body) {
        Ok(envelope) => Some(Event {
            source: source.name.clone(),
            id: envelope.id,
            kind: envelope.kind,
            created: envelope.created,
            body: body.into(),
        }),
        Err(e) => {
            log::error!(
                "reconcile {}: an event from the API: {}",
                source.name,
                e.summary()
            );
            None
        }
    }
}

/// The periodic reconcile of each stripe source of `config` that has one (`reconcile = {
/// every, since }` and an API key), each on a thread of its own.
pub(crate) fn periodic(
    config: &Config,
    sources: &HashMap<Arc<str>, Arc<Source>>,
    writer: &WriterHandle,
    reader: &Reader,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<Vec<Periodic>> {
    periodic_each(config, sources, metrics, |c, source, stop| {
        if c.scheme != crate::config::SchemeName::Stripe {
            return None;
        }
        let mut run = Run {
            api: StripeApi::of(c)?.cancelled_by(stop),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_end_when_a_cursor_repeats_or_after_the_most_pages() {
        let mut pages = Pages::new(3);
        assert_eq!(pages.after("evt_100"), Next::Read);
        assert_eq!(pages.after("evt_100"), Next::Repeated);
        assert_eq!(pages.after("evt_200"), Next::Read);
        assert_eq!(
            pages.after("evt_100"),
            Next::Repeated,
            "a cycle of two pages"
        );
        assert_eq!(pages.after("evt_300"), Next::Enough);
    }
}
