//! The Stripe wing: everything that knows Stripe beyond its signature scheme (which is
//! `source/stripe.rs`, one scheme among others).
//!
//! - `billing.rs`: the `stripe-billing` handler (guarded snapshots and credits), its batch
//!   form on PostgreSQL, and the refresh of a subscription on ties;
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
