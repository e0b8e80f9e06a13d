//! SQL effects: the app's own statements from `[[effect]]`, run for matching events inside
//! the claim's transaction, so they happen once per event and roll back with it.
//!
//! Each statement is prepared once per connection (cached) and bound by name: `:source`,
//! `:event_id`, `:event_type`, `:created` (NULL without an event time) and `:body` (the
//! verified raw body as text). A statement that raises (a CHECK, a NOT NULL, a trigger's
//! `RAISE(ABORT)`) fails the event: its savepoint rolls back, the sender gets a 500 and its
//! retry starts clean. The statements were checked against the database at start-up.

use crate::config::EffectConfig;
use crate::event::Event;
use crate::handler::{Handler, Prepared, Tx};
use crate::store::StoreError;

/// One `[[effect]]`, its SQL split into statements.
pub(crate) struct SqlEffect {
    /// Its position in the config file, from 1, for error messages.
    pub(crate) index: usize,
    pub(crate) config: EffectConfig,
    pub(crate) statements: Vec<String>,
}

/// The effects of one source, in config order.
pub(crate) struct SqlEffects(pub(crate) Vec<SqlEffect>);

impl Handler for SqlEffects {
    fn name(&self) -> &str {
        "sql-effects"
    }

    fn handle(&self, tx: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
        let body = std::str::from_utf8(&event.body);
        for effect in self.0.iter().filter(|e| e.config.matches(&event.kind)) {
            for sql in &effect.statements {
                run(tx, sql, event, body).map_err(|e| {
                    StoreError::from(e).context(&format!("effect {}", effect.index))
                })?;
            }
        }
        Ok(())
    }
}

/// Runs one statement with the event's parameters bound by name.
fn run(
    tx: &Tx<'_>,
    sql: &str,
    event: &Event,
    body: Result<&str, std::str::Utf8Error>,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(sql)?;
    if let Some(i) = stmt.parameter_index(":source")? {
        stmt.raw_bind_parameter(i, &*event.source)?;
    }
    if let Some(i) = stmt.parameter_index(":event_id")? {
        stmt.raw_bind_parameter(i, &event.id)?;
    }
    if let Some(i) = stmt.parameter_index(":event_type")? {
        stmt.raw_bind_parameter(i, &event.kind)?;
    }
    if let Some(i) = stmt.parameter_index(":created")? {
        stmt.raw_bind_parameter(i, event.created)?;
    }
    if let Some(i) = stmt.parameter_index(":body")? {
        match body {
            Ok(text) => stmt.raw_bind_parameter(i, text)?,
            // Not UTF-8 (a form post in another charset): the exact bytes, as a blob.
            Err(_) => stmt.raw_bind_parameter(i, &event.body[..])?,
        }
    }
    stmt.raw_execute()?;
    Ok(())
}
