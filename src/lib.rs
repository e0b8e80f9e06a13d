//! hookledger receives webhooks and makes each event change the app's data exactly once, on
//! one SQLite file.
//!
//! The crate in the order a request travels:
//! - [`http::server`]: HTTP lifecycle (bind, routes, limits, graceful shutdown);
//! - [`http::ingest`]: THE request path: body → verify → parse → writer → response;
//! - [`source`]: signature schemes (Stripe in, Standard Webhooks out);
//! - [`event`]: verified bytes → typed event;
//! - [`writer`]: the single writer thread and group commit;
//! - [`store::sqlite::ledger`]: the claim (`INSERT OR IGNORE`);
//! - [`handler::stripe_billing`]: guarded upserts of business state;
//! - [`outbox`]: effects queued in the transaction; [`delivery`]: the worker that delivers
//!   them to the app after commit;
//! - [`retention`]: pruning what the provider can no longer resend;
//! - [`store::sqlite`]: open, pragmas, migrations, read pool.
//!
//! Around it: [`config`] (settings and defaults), [`cli`] (subcommands), [`dev`] (signing
//! and sending events, as Stripe does, and the demo).

pub mod bench;
pub mod cli;
pub mod config;
pub mod delivery;
pub mod dev;
pub mod event;
pub mod handler;
pub mod http;
pub mod loadgen;
pub mod outbox;
pub mod retention;
pub mod source;
pub mod store;
pub mod writer;

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
