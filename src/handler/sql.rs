//! SQL effects: the app's own statements from `[[effect]]`, run for matching events inside
//! the claim's transaction, so they happen once per event and roll back with it.
//!
//! The named parameters `:source`, `:event_id`, `:event_type`, `:created` (NULL without an
//! event time) and `:body` (the verified raw body as text) were turned into `$1, $2, …` at
//! start-up ([`bind_parameters`](crate::config::bind_parameters)), and every statement was
//! prepared against the database then. A statement that raises (a CHECK, a NOT NULL, a
//! trigger's `RAISE(ABORT)` or `RAISE EXCEPTION`) fails the event: its savepoint rolls back,
//! the sender gets a 500 and its retry starts clean.

use crate::config::{BoundStatement, EffectConfig};
use crate::event::Event;
use crate::handler::{Handler, Prepared};
use crate::sql::Tx;
use crate::sql::{Param, StoreError, ToParam};

/// One `[[effect]]`, its SQL split into statements.
pub(crate) struct SqlEffect {
    /// Its position in the config file, from 1, for error messages.
    pub(crate) index: usize,
    pub(crate) config: EffectConfig,
    pub(crate) statements: Vec<BoundStatement>,
}

/// The effects of one source, in config order.
pub(crate) struct SqlEffects(pub(crate) Vec<SqlEffect>);

impl Handler for SqlEffects {
    fn name(&self) -> &str {
        "sql-effects"
    }

    fn handle(&self, tx: &Tx<'_>, event: &Event, _: Prepared) -> Result<(), StoreError> {
        // In the order of `config::PARAMETERS`.
        let values = [
            Param::Text(&event.source),
            Param::Text(&event.id),
            Param::Text(&event.kind),
            event.created.map_or(Param::Null, Param::Integer),
            match std::str::from_utf8(&event.body) {
                Ok(text) => Param::Text(text),
                // Not UTF-8 (a form post in another charset): the exact bytes, as a blob.
                Err(_) => Param::Blob(&event.body),
            },
        ];
        for effect in self.0.iter().filter(|e| e.config.matches(&event.kind)) {
            for statement in &effect.statements {
                let params: Vec<&dyn ToParam> = statement
                    .parameters
                    .iter()
                    .map(|&i| &values[i] as &dyn ToParam)
                    .collect();
                tx.execute(&statement.sql, &params)
                    .map_err(|e| e.context(&format!("effect {}", effect.index)))?;
            }
        }
        Ok(())
    }
}
