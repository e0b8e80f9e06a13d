//! hookledger receives webhooks and makes each event change the app's data exactly once, on
//! one SQLite file, or on PostgreSQL shared by several instances.
//!
//! The crate in the order a request travels:
//! - `http/server.rs`: the accept loop, limits and graceful shutdown; `http/ingest.rs`: THE
//!   request path (source → body → verify → envelope → handlers prepare → writer → reply);
//!   `http/error.rs`: the one table from an error to its status;
//! - `source/`: who sends and how their requests are verified and read: one [`Scheme`] shape,
//!   Stripe and Standard Webhooks behind it;
//! - `event.rs`: the verified [`Event`], the same for every source;
//! - `writer.rs`: the single writer thread, its queue, group commit and the replies after
//!   COMMIT (no SQL, no provider);
//! - `store/`: what the writer and the workers need from a database, and the SQL both stores
//!   share: the claim (`INSERT … ON CONFLICT DO NOTHING`), the outbox, retention, listings,
//!   the app's migrations, and the handlers' [`Tx`]; `store/sqlite/` and `store/postgres/`:
//!   each store's transactions, migrations, due outbox rows and errors;
//! - `handler/`: the [`Handler`] trait, run inside the claim's transaction, and the
//!   `stripe-billing` handler;
//! - `outbox.rs`, `delivery.rs`: external calls queued in the transaction, delivered to the
//!   app after commit; `retention.rs`: pruning what the provider can no longer resend.
//!
//! Around it: `app.rs` ([`Hookledger`]: open, router, serve), `config.rs` ([`Config`], every
//! default with its reason), `cli/` (the subcommands) and `dev/` (the demo, signing and
//! sending events as a provider does, sample events).
//!
//! [`Scheme`]: crate::source
//! [`Event`]: crate::Event
//! [`Tx`]: crate::Tx

mod app;
mod cli;
mod config;
mod delivery;
mod dev;
mod error;
mod event;
mod handler;
mod http;
mod metrics;
mod outbox;
mod retention;
mod source;
mod sql;
mod store;
mod stripe;
mod time;
mod writer;

pub use app::{Builder, Hookledger, RunningServer};
pub use config::{
    Config, ConfigError, Database, DeliveryConfig, EffectConfig, ForwardConfig, HandlerSettings,
    HmacAlgorithm, HmacConfig, HmacEncoding, HttpConfig, Locator, ReconcileConfig, Refresh,
    RetentionConfig, SchemaConfig, SchemeName, Secret, SourceConfig, StorageConfig, WriterConfig,
};
pub use error::Error;
pub use event::{Event, JsonError, ParseError};
pub use handler::{Handler, Prepared};
pub use source::VerifyError;
pub use sql::{Dialect, FromValue, Param, Row, StoreError, ToParam, Tx, Value};
pub use store::Outcome;

/// The command line, for the `hookledger` binary.
#[doc(hidden)]
pub use cli::{run as run_cli, Cli, Command as CliCommand, Exit, LogFormat};

/// Not a stable API: what the project's own tests, fuzz targets and tools (bench, load
/// generator) reach inside the crate. Embedding apps use the items at the crate root.
#[doc(hidden)]
pub mod internals {
    pub use crate::dev::client::{Client, Reply, TransportError};
    pub use crate::source::standard::SigningKey;
    pub use crate::source::Envelope;
    pub use crate::stripe::samples::{invoice_event, subscription_event};
    pub use crate::time::unix_now;

    /// Stripe's signature scheme: sign, parse and verify.
    pub mod stripe {
        pub use crate::config::DEFAULT_TOLERANCE_SECS;
        pub use crate::source::stripe::{
            compute, envelope, parse_header, sign, verify, SignatureHeader, HEADER,
        };
    }

    pub use crate::writer::ceiling::writer_ceiling;

    /// Aligned text tables, as the CLI prints them.
    pub mod table {
        pub use crate::cli::table::render;
    }

    /// The Stripe billing handler's decoding, for the fuzz targets.
    pub mod stripe_billing {
        pub use crate::stripe::billing::{decode, Change};
    }
}
