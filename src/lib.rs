//! hookledger receives webhooks and makes each event change your app's data **exactly once**:
//! it verifies the provider's signature on the raw body, claims `(source, event id)` in a
//! ledger in the same transaction as your effects, and answers the provider only after that
//! transaction committed. A resend, a retry or a copy delivered twice at once is a duplicate
//! that changes nothing. It runs on one SQLite file, or on PostgreSQL shared by several
//! instances, with the same code.
//!
//! This page is for an app that embeds it. The `hookledger` binary (`serve`, the config file,
//! the console) and the concepts are in the book (`docs/` in the repository); how the crate is
//! built inside, and how to add a preset, a scheme, a store or a delivery target, is in
//! `CONTRIBUTING.md`.
//!
//! # The API
//! - [`Hookledger`]: made with [`Hookledger::builder`] (or [`Hookledger::open`] from a
//!   [`Config`]); [`Hookledger::router`] is an axum `Router` with `POST /webhooks/{source}`
//!   to merge into your own server, [`Hookledger::serve`] runs it standalone, and
//!   [`Hookledger::shutdown`] commits what is queued and stops.
//! - Sources: [`SourceConfig::preset`] makes a source for one of the [`presets`] (GitHub,
//!   Shopify, Slack, the Standard Webhooks senders, …) as `preset = "…"` in a config file
//!   does; [`SourceConfig::stripe`], [`SourceConfig::hmac`], [`SourceConfig::token`] and
//!   [`SourceConfig::new`] for the rest. A source's secrets are [`Secret`]s (several during
//!   rotation: any one may match).
//! - Effects: a [`Handler`] runs inside the claim's transaction with a [`Tx`] that runs SQL
//!   (`$1` parameters, [`Value`]s in, [`Row`]s out) but cannot commit; an error rolls the
//!   event back, and the provider's retry starts clean. [`Handler::prepare`] may decode the
//!   body before the writer's transaction ([`Prepared`]). An [`EffectConfig`] is the same as
//!   SQL from a config file.
//! - Delivery after commit: [`ForwardConfig`] (every processed event, signed as Standard
//!   Webhooks, to your app's URL) and [`DeliveryConfig`] (the outbox rows of one kind, to a
//!   URL, a local command, or a message broker: [`NatsConfig`], [`AmqpConfig`],
//!   [`RedisConfig`]), each in a lane of its own ([`LaneKeys`]: concurrency, rate,
//!   circuit breaker, coalescing), retried on a schedule, dead-lettered.
//! - [`Config`] holds every setting, each with its default; [`Config::load`] reads a config
//!   file. Every public function returns an [`Error`]; [`Error::Config`] names the key as a
//!   config file writes it, before anything is opened.
//!
//! # An event
//! A handler sees the verified [`Event`]: `source` (the source's name) and `id` (the
//! provider's event id) are the ledger's key; `kind` is the event type (`invoice.paid`,
//! GitHub's `push`); `created` the provider's event time, where its scheme has one (Unix
//! seconds: guard snapshot state with it, so an older event never overwrites a newer one);
//! `body` the exact bytes that were verified, to decode as the handler wishes.
//!
//! # Your tables
//! Effects write your own tables, in the same database (that is what lets them commit with
//! the claim). Make them with migrations: a folder of `*.sql` files applied once each, in name
//! order, when hookledger opens ([`Builder::migrations`], or `[schema] migrations` in a config
//! file), recorded so each runs once, also with several instances on PostgreSQL. SQL that
//! SQLite and PostgreSQL both accept (`INSERT … ON CONFLICT … DO UPDATE`) runs on either.
//!
//! # Example
//! Count events by type, exactly once each, in an app of your own:
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use hookledger::{Event, Handler, Hookledger, Prepared, Secret, SourceConfig, StoreError, Tx};
//!
//! struct CountByType;
//!
//! impl Handler for CountByType {
//!     fn name(&self) -> &str {
//!         "count-by-type"
//!     }
//!
//!     fn handle(&self, tx: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
//!         tx.execute(
//!             "INSERT INTO events_by_type (event_type, n) VALUES ($1, 1)
//!              ON CONFLICT (event_type) DO UPDATE SET n = events_by_type.n + 1",
//!             &[&event.kind],
//!         )?;
//!         Ok(())
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // migrations/001_events_by_type.sql:
//!     //   CREATE TABLE events_by_type (event_type TEXT PRIMARY KEY, n INTEGER NOT NULL);
//!     let secret = Secret::new(std::env::var("GITHUB_WEBHOOK_SECRET")?);
//!     let hookledger = Hookledger::builder()
//!         .database("app.db")
//!         .migrations("migrations")
//!         .source(SourceConfig::preset("github", "gh", vec![secret])?)
//!         .handler("gh", CountByType)
//!         .build()?;
//!     let app = Router::new()
//!         .route("/", get(|| async { "the app's own page" }))
//!         .merge(hookledger.router()); // POST /webhooks/gh
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(async {
//!             let _ = tokio::signal::ctrl_c().await;
//!         })
//!         .await?;
//!     hookledger.shutdown().await?; // what is queued commits; nothing acknowledged is lost
//!     Ok(())
//! }
//! ```
//!
//! `examples/embed.rs` in the repository is such an app, whole, with a test that sends it
//! events (one twice) and reads its table back.

// How the modules below depend on each other (one layer each, a module importing only the
// layers below it) is drawn in CONTRIBUTING.md, "The layers".

mod alerts;
mod app;
mod cli;
mod config;
mod delivery;
mod dev;
mod error;
mod event;
mod handler;
mod heartbeat;
mod http;
mod log_budget;
mod metrics;
mod outbox;
mod payload;
mod preset;
mod recover;
mod refusals;
mod retention;
mod source;
mod sql;
mod store;
mod stripe;
mod time;
mod trace;
mod training;
mod writer;

pub use app::{Builder, Hookledger, Reloaded, Reloader, RunningServer};
pub use config::Handshake;
pub use config::{
    AlertConfig, AmqpConfig, Config, ConfigError, Database, DeliveryConfig, EffectConfig,
    ForwardConfig, HandlerSettings, HmacAlgorithm, HmacConfig, HmacEncoding, HttpConfig, LaneKeys,
    Locator, NatsConfig, ReconcileConfig, RecoverMode, RedisConfig, Refresh, RetentionConfig,
    RouteConfig, RouteValues, SchemaConfig, SchemeName, Secret, SourceConfig, StorageConfig,
    TimestampConfig, TokenConfig, WriterConfig,
};
pub use error::Error;
pub use event::{Event, JsonError, ParseError};
pub use handler::{Handler, Prepared};
pub use preset::{presets, Preset};
pub use source::VerifyError;
pub use sql::{Dialect, FromValue, Param, Row, StoreError, ToParam, Tx, Value};
pub use store::Outcome;

/// The command line, for the `hookledger` binary.
#[doc(hidden)]
pub use cli::{
    init_logging, run as run_cli, Cli, Command as CliCommand, Exit, LogFormat, LogGuard,
};

/// Not a stable API: what the project's own tests, fuzz targets and tools (bench, load
/// generator) reach inside the crate. Embedding apps use the items at the crate root.
#[doc(hidden)]
pub mod internals {
    pub use crate::dev::client::{Client, Reply, TransportError};
    pub use crate::source::standard::SigningKey;
    pub use crate::source::Envelope;
    pub use crate::stripe::samples::{invoice_event, subscription_event};
    pub use crate::time::unix_now;

    /// The preset catalog: each preset's name, keys (TOML), fixture under `tests/fixtures/`
    /// and the event type to send it as (empty where the body has it).
    pub fn presets() -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
        crate::source::catalog::PRESETS
            .iter()
            .map(|p| (p.name, p.keys, p.fixture.0, p.fixture.1))
            .collect()
    }

    /// Stripe's signature scheme: sign, parse and verify.
    pub mod stripe {
        pub use crate::config::DEFAULT_TOLERANCE_SECS;
        pub use crate::source::stripe::{
            compute, envelope, parse_header, sign, verify, SignatureHeader, HEADER,
        };
    }

    /// The writer on stripe-billing without HTTP, for the bench's ceiling.
    pub use crate::stripe::bench::{BillingWriter, Pending, Prepared as PreparedEvent};

    /// Aligned text tables, as the CLI prints them.
    pub mod table {
        pub use crate::cli::table::render;
    }

    /// The Stripe billing handler's decoding, for the fuzz targets.
    pub mod stripe_billing {
        pub use crate::stripe::billing::{decode, Change};
    }
}
