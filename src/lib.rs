//! hookledger receives webhooks and makes each event change the app's data exactly once, on
//! one SQLite file.
//!
//! The crate in the order a request travels:
//! - [`server`]: HTTP lifecycle (bind, routes, limits, graceful shutdown);
//! - [`ingest`]: THE request path: body → verify → parse → writer → response;
//! - [`verify`]: signature schemes (Stripe in, Standard Webhooks out);
//! - [`event`]: verified bytes → typed event;
//! - [`writer`]: the single writer thread and group commit;
//! - [`ledger`]: the claim (`INSERT OR IGNORE`);
//! - [`state`]: guarded upserts of business state;
//! - [`outbox`]: effects queued in the transaction; [`delivery`]: the worker that delivers
//!   them to the app after commit;
//! - [`retention`]: pruning what the provider can no longer resend;
//! - [`db`]: open, pragmas, migrations, read pool.
//!
//! Around it: [`config`] (settings and defaults), [`cli`] (subcommands), [`client`] (signing
//! and sending events, as Stripe does) and [`demo`].

pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod delivery;
pub mod demo;
pub mod event;
pub mod ingest;
pub mod inspect;
pub mod ledger;
pub mod loadgen;
pub mod outbox;
pub mod retention;
pub mod sample;
pub mod server;
pub mod state;
pub mod table;
pub mod verify;
pub mod writer;

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
