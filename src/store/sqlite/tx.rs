//! [`Tx`]: what a handler gets inside the claim's transaction.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::{CachedStatement, Connection, Params, Row};

/// The writer's open transaction, as a handler sees it: it runs statements, and cannot COMMIT,
/// ROLLBACK, BEGIN or touch savepoints (the connection's authorizer refuses to prepare them
/// while a handler runs), because the transaction holds a whole batch of other events.
pub struct Tx<'c> {
    conn: &'c Connection,
}

impl<'c> Tx<'c> {
    pub(crate) fn new(conn: &'c Connection) -> Self {
        Tx { conn }
    }

    /// Runs one statement (prepared once per connection and cached) and returns the number of
    /// rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.conn.prepare_cached(sql)?.execute(params)
    }

    /// Runs a query that returns one row; no row is `Err(QueryReturnedNoRows)` (use
    /// `rusqlite::OptionalExtension::optional` for `Ok(None)`).
    pub fn query_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.conn.prepare_cached(sql)?.query_row(params, f)
    }

    /// A cached prepared statement, for queries of several rows.
    pub fn prepare_cached(&self, sql: &str) -> rusqlite::Result<CachedStatement<'c>> {
        self.conn.prepare_cached(sql)
    }
}

/// Whether a handler is running on the writer's connection: while it is, the authorizer
/// refuses to prepare transaction control. The store sets it around each handler call.
/// Shared with the authorizer callback, which SQLite calls on the same (writer) thread.
#[derive(Clone, Default)]
pub(crate) struct HandlerGuard(Arc<AtomicBool>);

impl HandlerGuard {
    pub(crate) fn running(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, running: bool) {
        self.0.store(running, Ordering::Relaxed);
    }
}
