//! The Stripe wing: everything that knows Stripe beyond its signature scheme (which is
//! `source/stripe.rs`, one scheme among others).
//!
//! - `billing.rs`: the `stripe-billing` handler (guarded snapshots and credits), its batch
//!   form on PostgreSQL, and the refresh of a subscription on ties;
//! - `migrations/`: the handler's own tables (`subscriptions`, `invoice_payments`,
//!   `accounts`), for SQLite and PostgreSQL, made when a source names the handler
//!   ([`billing::SCHEMA`]);
//! - `refresh.rs`: the outbox target that fetches the subscription and hands it back to
//!   billing;
//! - `api.rs`: the client of Stripe's API (events, subscriptions);
//! - `reconcile.rs`: the events Stripe has that the ledger lacks, recovered through the API;
//! - `bench.rs`: the writer on stripe-billing without HTTP, for the bench's ceiling;
//! - `samples.rs`: real-shaped Stripe events, for the demo, the tests and the bench;
//! - `settings.rs`: the defaults of Stripe's API and the rules the Stripe settings of a source
//!   follow (the config names no provider), checked at start-up.

pub(crate) mod api;
pub(crate) mod bench;
pub(crate) mod billing;
pub(crate) mod reconcile;
pub(crate) mod refresh;
pub(crate) mod samples;
pub(crate) mod settings;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Config, ConfigError, SourceConfig};
use crate::delivery::Targets;
use crate::handler::{Handler, Schema};
use crate::source::Source;
use crate::store::Reader;
use crate::writer::{Background, WriterHandle};

// What the wing adds to a hookledger, for the composition root (`app.rs`): the only calls
// into it from outside, beside the CLI's quick start, the demo and the bench.

/// Refuses the Stripe settings of `config` that cannot work, naming the key.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    settings::check(config)
}

/// The built-in handler `name` of `source`, if it is one of the wing's.
pub(crate) fn handler(
    name: &str,
    config: &Config,
    source: &SourceConfig,
) -> Option<anyhow::Result<Arc<dyn Handler>>> {
    (name == settings::BILLING).then(|| {
        Ok(Arc::new(billing::StripeBilling {
            credits_per_invoice: billing::BillingSettings::of(&config.stripe_billing)?
                .credits_per_invoice,
            refresh: source.refreshes().then_some(source.refresh),
        }) as Arc<dyn Handler>)
    })
}

/// The own tables of the wing's built-in handler `name` and the migrations that make them, if
/// it is one of the wing's.
pub(crate) fn schema(name: &str) -> Option<&'static Schema> {
    (name == settings::BILLING).then_some(&billing::SCHEMA)
}

/// The schema of each of the wing's handlers.
#[cfg(feature = "postgres")]
pub(crate) fn schemas() -> &'static [&'static Schema] {
    &[&billing::SCHEMA]
}

/// The refresh on ties: fetches from the API of each source that refreshes, if any does.
pub(crate) fn add_targets(config: &Config, targets: &mut Targets) {
    if let Some(fetch) = refresh::Fetch::of(config) {
        targets.add(
            billing::REFRESH,
            Box::new(fetch),
            crate::outbox::default_schedule(),
        );
    }
}

/// The periodic reconcile of each source that has one.
pub(crate) fn background(
    config: &Config,
    sources: &HashMap<Arc<str>, Arc<Source>>,
    writer: &WriterHandle,
    reader: &Reader,
    metrics: &Arc<crate::metrics::Metrics>,
) -> anyhow::Result<Vec<Box<dyn Background>>> {
    Ok(
        reconcile::periodic(config, sources, writer, reader, metrics)?
            .into_iter()
            .map(|p| Box::new(p) as Box<dyn Background>)
            .collect(),
    )
}
