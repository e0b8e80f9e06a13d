//! The claim: one row per event id in `webhook_events`.
//!
//! `INSERT OR IGNORE` on the primary key decides whether an event is new. It runs inside the
//! writer's transaction, before the effects, so a crash or an error anywhere in the event's
//! apply rolls the claim back too and the provider's retry starts clean. There is never a
//! "check, then insert" in code: the key decides.

use rusqlite::{params, Connection};

use crate::event::Event;

/// Claims `event`; true if it is new (and its effects must now be applied), false if the id
/// was already in the ledger (a duplicate: nothing else may run).
pub(crate) fn claim(tx: &Connection, event: &Event, received_at: i64) -> rusqlite::Result<bool> {
    let inserted = tx
        .prepare_cached(
            "INSERT OR IGNORE INTO webhook_events
                 (event_id, event_type, source, created, received_at, payload)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(params![
            event.id,
            event.kind,
            event.source,
            event.created,
            received_at,
            &event.body[..]
        ])?;
    Ok(inserted == 1)
}
