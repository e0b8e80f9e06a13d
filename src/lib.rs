//! hookledger receives webhooks and makes each event change the app's data exactly once, on
//! one SQLite file, or on PostgreSQL shared by several instances.
//!
//! A request travels: `http/server.rs` (accept loop, limits) → `http/ingest.rs` (THE request
//! path: source → body → verify → envelope → handlers prepare → writer → reply) → `source/`
//! (verify and read) → `writer.rs` (queue, group commit) → `store/` (the transaction: claim →
//! handlers → outbox row, `store/pipeline.rs`) → back in `http/error.rs` (the one table from
//! an error to its status). After commit: `delivery/` and `retention.rs`.
//!
//! The map, one layer per line, from the bottom: a module imports only modules on lines above
//! its own (leaves import nothing of the crate).
//! 1. `time.rs` (leaf): Unix seconds, RFC 3339. `log_budget.rs` (leaf): at most so many
//!    lines of one kind a second, the rest counted. `trace.rs` (leaf): OpenTelemetry spans,
//!    W3C `traceparent`, the OTLP/HTTP exporter thread.
//! 2. `event.rs` (leaf): the verified [`Event`], the same for every source. `payload.rs`
//!    (leaf): a body as it is stored (zstd, with the source's dictionary once it has one).
//! 3. `sql/` (leaf): [`Tx`], parameters, rows and [`StoreError`]: what handlers and stores share.
//! 4. `config/` (leaf): one [`Config`], every default with its reason; errors name their key;
//!    a source's `preset` filled in from a catalog it is handed.
//! 5. `outbox.rs`: an outbox row, the `Target` trait that attempts it, the retry schedule.
//! 6. `handler/`: the [`Handler`] trait, run inside the claim's transaction; SQL effects.
//! 7. `source/`: who sends and how their requests are verified and read: one scheme shape,
//!    Stripe's, Standard Webhooks and the body HMACs behind it; the preset catalog (data).
//! 8. `store/`: the seam (`Store::run_batch`: a store owns its transaction), the pipeline
//!    written once, the SQL both stores share, `sqlite/` and `postgres/`, the contract suite
//!    every store passes; the stores are opened once here.
//! 9. `metrics.rs`: what `/metrics` and `/status` count.
//! 10. `writer.rs`: the single writer thread, its queue and the replies after COMMIT (no SQL,
//!     no provider, no transaction).
//! 11. `delivery/command.rs`: the outbox target that runs a `[[delivery]]` `command` (argv, payload on
//!     stdin, its process group killed past its timeout).
//! 12. `delivery/mod.rs`: the outbox worker and its POST target.
//! 13. `alerts.rs`: `[[alert]]`, one message per incident (rows going dead, a source
//!     refused too often, an old backlog) and one when it clears, through the outbox.
//!     `retention.rs`: pruning what the provider can no longer resend. `training.rs`: each
//!     source's payload dictionary, trained once on its first payloads. `refusals.rs`: refused
//!     requests counted in memory, kept in the database once a second for `/status`.
//! 14. `stripe/`: the Stripe wing: billing (and its batch form), the refresh on ties, the API
//!     client, reconcile, its settings, sample events; `stripe/mod.rs` is what the composition
//!     root calls.
//! 15. `error.rs`: [`Error`], what the library's public functions return; `Config::load`
//!     (the file, with the catalog's presets).
//! 16. `http/`: the webhook routes (`ingest.rs`) and the operators' (`ops/`).
//! 17. `app.rs`: [`Hookledger`], the one composition root (serve, router, reconcile).
//! 18. `dev/`: a client that signs and sends as a provider does.
//! 19. `cli/`: the subcommands, each a call into the above.
//!
//! [`Event`]: crate::Event
//! [`Tx`]: crate::Tx
//! [`Error`]: crate::Error

mod alerts;
mod app;
mod cli;
#[path = "delivery/command.rs"]
mod command;
mod config;
mod delivery;
mod dev;
mod error;
mod event;
mod handler;
mod http;
mod log_budget;
mod metrics;
mod outbox;
mod payload;
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

pub use app::{Builder, Hookledger, RunningServer};
pub use config::Handshake;
pub use config::{
    AlertConfig, Config, ConfigError, Database, DeliveryConfig, EffectConfig, ForwardConfig,
    HandlerSettings, HmacAlgorithm, HmacConfig, HmacEncoding, HttpConfig, Locator, ReconcileConfig,
    Refresh, RetentionConfig, SchemaConfig, SchemeName, Secret, SourceConfig, StorageConfig,
    TimestampConfig, TokenConfig, WriterConfig,
};
pub use error::Error;
pub use event::{Event, JsonError, ParseError};
pub use handler::{Handler, Prepared};
pub use source::VerifyError;
pub use sql::{Dialect, FromValue, Param, Row, StoreError, ToParam, Tx, Value};
pub use store::Outcome;

/// The command line, for the `hookledger` binary.
#[doc(hidden)]
pub use cli::{init_logging, run as run_cli, Cli, Command as CliCommand, Exit, LogFormat};

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
