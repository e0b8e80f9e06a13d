//! The claim: one row per `(source, event id)` in `webhook_events`.
//!
//! `INSERT … ON CONFLICT DO NOTHING` on the primary key decides whether an event is new. It
//! runs inside the writer's transaction, before the effects, so a crash or an error anywhere in
//! the event's apply rolls the claim back too and the provider's retry starts clean. There is
//! never a "check, then insert" in code: the key decides. On PostgreSQL a second instance
//! claiming the same event waits on the first one's uncommitted row, then sees it: one
//! `processed`, one `duplicate`.

use crate::event::Event;
use crate::payload::Stored;
use crate::sql::Session;
use crate::sql::StoreError;

/// Claims `event`; true if it is new (and its effects must now be applied), false if the id
/// was already in the ledger (a duplicate: nothing else may run). `stored` is its body as it
/// is stored (`crate::payload`).
pub(crate) fn claim(
    tx: &dyn Session,
    event: &Event,
    stored: &Stored,
    received_at: i64,
) -> Result<bool, StoreError> {
    let inserted = tx.execute(
        "INSERT INTO webhook_events
             (event_id, event_type, source, created, received_at, payload, payload_codec,
              payload_dict)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (source, event_id) DO NOTHING",
        &[
            &event.id,
            &event.kind,
            &event.source,
            &event.created,
            &received_at,
            &stored.bytes,
            &stored.codec,
            &stored.dict,
        ],
    )?;
    Ok(inserted == 1)
}
