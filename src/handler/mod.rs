//! Handlers: the app's effects of an event, run inside the claim's transaction.
//!
//! A handler runs only for a new event (after its claim inserted the ledger row) and in the
//! same transaction and savepoint: if it fails, the claim is rolled back with it, the sender
//! gets a 500 and its retry starts clean. A handler gets a [`Tx`], which runs statements but
//! cannot commit, roll back or touch savepoints: the writer owns the transaction.
//!
//! Work that does not need the database (decoding the body, rejecting a malformed object)
//! belongs in [`Handler::prepare`]: it runs on the request path, in parallel and before the
//! single writer, and its error is the sender's fault (400).

pub(crate) mod sql;

use std::any::Any;
use std::sync::Arc;

use crate::event::{Event, ParseError};
use crate::sql::{StoreError, Tx};

/// The app's effects of an event, run inside the claim's transaction.
pub trait Handler: Send + Sync + 'static {
    /// A short name for log lines (`stripe-billing`).
    fn name(&self) -> &str;

    /// Checks and decodes what [`Handler::handle`] needs, on the request path. An error is
    /// answered 400 and nothing is written.
    fn prepare(&self, event: &Event) -> Result<Prepared, ParseError> {
        let _ = event;
        Ok(Prepared::none())
    }

    /// Applies the event inside the claim's transaction. An error rolls back the event (its
    /// claim included): the sender gets a 500 or 503 and retries.
    fn handle(&self, tx: &Tx<'_>, event: &Event, prepared: Prepared) -> Result<(), StoreError>;

    /// Applies several new events at once, with the same result as [`Handler::handle`] on
    /// each in turn. A store where each statement is a network round trip (PostgreSQL) calls
    /// it with a batch's events; if it fails, their writes are undone and the store calls
    /// `handle` for each, so that a bad event fails alone. The default does exactly that.
    fn handle_all(&self, tx: &Tx<'_>, events: Vec<(&Event, Prepared)>) -> Result<(), StoreError> {
        events
            .into_iter()
            .try_for_each(|(event, prepared)| self.handle(tx, event, prepared))
    }
}

/// What [`Handler::prepare`] decoded for [`Handler::handle`] (one value of the handler's own
/// type, or nothing).
pub struct Prepared(Option<Box<dyn Any + Send>>);

impl Prepared {
    pub fn new<T: Any + Send>(value: T) -> Self {
        Prepared(Some(Box::new(value)))
    }

    pub fn none() -> Self {
        Prepared(None)
    }

    /// The value, if it is a `T`.
    pub fn take<T: Any>(self) -> Option<T> {
        self.0?.downcast().ok().map(|b| *b)
    }
}

/// The tables a built-in handler keeps in the ledger's database, and the migrations that make
/// them: a handler owns its tables, the core's schema does not know them. A store applies a
/// handler's migrations ([`Store::migrate_handler`](crate::store::Store::migrate_handler)) when
/// a source names the handler, each once, recorded by the handler's name and the migration's in
/// `hookledger_handler_migrations` (made with the first one); `migrate-to` asks each
/// handler for its tables and copies them.
pub(crate) struct Schema {
    /// The handler's name, as a source's `handlers` names it (`stripe-billing`).
    pub(crate) handler: &'static str,
    /// In the order they run. Append-only: never edit a released entry, add one.
    pub(crate) migrations: &'static [Migration],
    /// Every table the migrations make, in the order `migrate-to` copies them.
    pub(crate) tables: &'static [Table],
}

/// One migration of a handler's, in the SQL of each store.
pub(crate) struct Migration {
    /// Recorded once applied (`0001_billing`).
    pub(crate) name: &'static str,
    pub(crate) sqlite: &'static str,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) postgres: &'static str,
}

/// A table a handler owns.
pub(crate) struct Table {
    pub(crate) name: &'static str,
    /// Every column, as the copy reads and writes them.
    pub(crate) columns: &'static [&'static str],
    /// Its primary key: the order the copy pages in.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) key: &'static [&'static str],
}

/// An event on its way to the writer, with the handlers of its source and what each prepared.
pub(crate) struct Submission {
    pub(crate) event: Event,
    pub(crate) handlers: Vec<(Arc<dyn Handler>, Prepared)>,
    /// Queue a `forward` outbox row when the event is new.
    pub(crate) forward: bool,
    /// The rows its routes queue when it is new (none unless a route matched it).
    pub(crate) routed: Vec<crate::outbox::Routed>,
    /// The body as it is stored, made on the caller's thread (the writer's has better to
    /// do); `None`: the store compresses it without a dictionary.
    pub(crate) stored: Option<crate::payload::Stored>,
    /// The single-use token the request's signature covers, when its scheme signs one instead
    /// of the event (Mailgun's): claimed with the event, refused if another event used it.
    pub(crate) token: Option<String>,
}
