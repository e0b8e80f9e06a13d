//! The outbox's writes, the same SQL on every store: rows queued in the event's transaction,
//! updated by the writer (attempts) and the CLI (retry, replay). Which rows are due is each
//! store's own query (`due`): SQLite has one server, PostgreSQL leases rows to one of several.

use crate::event::Event;
use crate::outbox::{Attempt, Lease, Routed, FORWARD};
use crate::sql::{Dialect, Session, StoreError, Tx};
use crate::store::ledger;

/// Queues a row of `kind` for `event` inside the caller's transaction, due at `due`. The one
/// insert of an outbox row (a store's batched form aside). `(kind, source, key)` is unique,
/// so a replayed enqueue of the same row adds nothing; whether it added one.
pub(crate) fn enqueue(
    tx: &dyn Session,
    kind: &str,
    event: &Event,
    payload: &[u8],
    due: i64,
    now: i64,
) -> Result<bool, StoreError> {
    let inserted = tx.execute(
        "INSERT INTO outbox
             (kind, source, key, event_type, payload, status, next_attempt_at, created_at)
         VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7)
         ON CONFLICT (kind, source, key) DO NOTHING",
        &[
            &kind,
            &event.source,
            &event.id,
            &event.kind,
            &payload,
            &due,
            &now,
        ],
    )?;
    Ok(inserted == 1)
}

/// Queues the `forward` row of `event` inside the caller's transaction, due now. It holds no
/// copy of the body: `payload_ref = 1` says the worker reads the event's own payload when it
/// attempts the row (`store::payload::event_payload`), so a payload is stored once.
pub(crate) fn enqueue_forward(
    tx: &dyn Session,
    event: &Event,
    now: i64,
) -> Result<bool, StoreError> {
    let inserted = tx.execute(
        "INSERT INTO outbox
             (kind, source, key, event_type, payload, payload_ref, status, next_attempt_at,
              created_at)
         VALUES ($1, $2, $3, $4, $5, 1, 'pending', $6, $6)
         ON CONFLICT (kind, source, key) DO NOTHING",
        &[
            &FORWARD,
            &event.source,
            &event.id,
            &event.kind,
            &EMPTY,
            &now,
        ],
    )?;
    Ok(inserted == 1)
}

/// Queues the row a route made for `event` inside the caller's transaction, due now, keyed
/// by the event id like a `forward` row and with the route's `coalesce_key`. A `forward` row
/// refers to its event's payload (retention keeps it for that kind); a row of another kind
/// holds the body as it was verified, as an effect's `INSERT INTO outbox` does with `:body`.
pub(crate) fn enqueue_routed(
    tx: &dyn Session,
    event: &Event,
    routed: &Routed,
    now: i64,
) -> Result<bool, StoreError> {
    let refers = &*routed.kind == FORWARD;
    let sql = match refers {
        true => {
            "INSERT INTO outbox
                 (kind, source, key, event_type, payload, payload_ref, coalesce_key, status,
                  next_attempt_at, created_at)
             VALUES ($1, $2, $3, $4, $5, 1, $6, 'pending', $7, $7)
             ON CONFLICT (kind, source, key) DO NOTHING"
        }
        false => {
            "INSERT INTO outbox
                 (kind, source, key, event_type, payload, coalesce_key, status, next_attempt_at,
                  created_at)
             VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $7)
             ON CONFLICT (kind, source, key) DO NOTHING"
        }
    };
    let payload: &[u8] = if refers { EMPTY } else { &event.body };
    let inserted = tx.execute(
        sql,
        &[
            &routed.kind,
            &event.source,
            &event.id,
            &event.kind,
            &payload,
            &routed.coalesce_key,
            &now,
        ],
    )?;
    Ok(inserted == 1)
}

/// The `payload` of a row that refers to its event's (the column is NOT NULL).
const EMPTY: &[u8] = b"";

fn mark_done(tx: &dyn Session, id: i64, queued: i64, now: i64) -> Result<u64, StoreError> {
    tx.execute(
        "UPDATE outbox SET status = 'done', attempts = attempts + 1, done_at = $2,
             last_error = NULL, leased_until = NULL
         WHERE id = $1 AND status = 'pending' AND queued = $3",
        &[&id, &now, &queued],
    )
}

/// Records an attempt on row `id`, made on the row as it was when queued for the `queued`-th
/// time, and ends its lease. Only that row, still pending, changes: a replay or retry that
/// queued it again while the attempt was in flight wins (the row is attempted again), as does
/// a prune.
pub(crate) fn record(
    tx: &dyn Session,
    id: i64,
    queued: i64,
    attempt: &Attempt,
    now: i64,
) -> Result<u64, StoreError> {
    match attempt {
        Attempt::Delivered { follow_up } => {
            let done = mark_done(tx, id, queued, now)?;
            // Only a row still the one attempted writes what its target handed back.
            if let (1, Some(follow_up)) = (done, follow_up) {
                follow_up.apply(&Tx::new(tx))?;
            }
            Ok(done)
        }
        // A failed command's output replaces the last one; no output (a POST) keeps it.
        Attempt::Retry { at, error, output } => tx.execute(
            "UPDATE outbox SET attempts = attempts + 1, next_attempt_at = $2, last_error = $3,
                 leased_until = NULL, output = coalesce($5, output)
             WHERE id = $1 AND status = 'pending' AND queued = $4",
            &[&id, at, error, &queued, output],
        ),
        Attempt::Dead { error, output } => tx.execute(
            "UPDATE outbox SET status = 'dead', attempts = attempts + 1, last_error = $2,
                 leased_until = NULL, output = coalesce($4, output)
             WHERE id = $1 AND status = 'pending' AND queued = $3",
            &[&id, error, &queued, output],
        ),
    }
}

/// Makes every pending row of `kind` that waits on a retry delay (it failed before, and is due
/// later) due at `now`; attempts and schedules are kept. Returns how many.
pub(crate) fn recover(tx: &dyn Session, kind: &str, now: i64) -> Result<u64, StoreError> {
    tx.execute(
        "UPDATE outbox SET next_attempt_at = $2
         WHERE kind = $1 AND status = 'pending' AND attempts > 0 AND next_attempt_at > $2",
        &[&kind, &now],
    )
}

/// Marks `superseded` every queued row of `kind` (a kind with `coalesce = true`) that a newer
/// queued row of the same source and `coalesce_key` replaces: only the newest is delivered.
/// A row being attempted is left alone: one in `running` (this instance's), or leased (another
/// instance's, on PostgreSQL). Each guard is on the row itself, so a lease and this update
/// cannot both take one row: whichever commits first wins and the other skips it. Returns how
/// many.
pub(crate) fn coalesce(
    tx: &dyn Session,
    kind: &str,
    running: &[i64],
    now: i64,
) -> Result<u64, StoreError> {
    // Ids are integers: written into the statement as they are (-1: no row has it).
    let running = running
        .iter()
        .map(i64::to_string)
        .chain(["-1".to_string()])
        .collect::<Vec<_>>()
        .join(", ");
    tx.execute(
        &format!(
            "UPDATE outbox SET status = 'superseded', done_at = $2, leased_until = NULL
             WHERE kind = $1 AND status = 'pending' AND id NOT IN ({running})
               AND (leased_until IS NULL OR leased_until <= $2)
               AND EXISTS (
                   SELECT 1 FROM outbox AS newer
                   WHERE newer.kind = outbox.kind AND newer.source = outbox.source
                     AND coalesce(newer.coalesce_key, '') = coalesce(outbox.coalesce_key, '')
                     AND newer.status = 'pending' AND newer.id > outbox.id)"
        ),
        &[&kind, &now],
    )
}

/// Makes `kinds` the coalescing kinds that the outbox's trigger on a repeated key reads
/// (migration 16 on SQLite, 10 on PostgreSQL): an insert with the key of an existing row of
/// such a kind queues that row again with the newer payload; of any other kind it is ignored.
/// Returns how many kinds.
pub(crate) fn set_coalescing(tx: &dyn Session, kinds: &[String]) -> Result<u64, StoreError> {
    tx.execute("DELETE FROM hookledger_outbox_coalescing", &[])?;
    let mut n = 0;
    for kind in kinds {
        n += tx.execute(
            "INSERT INTO hookledger_outbox_coalescing (kind) VALUES ($1) ON CONFLICT DO NOTHING",
            &[kind],
        )?;
    }
    Ok(n)
}

/// Ends the lease of row `id`, handed out but not attempted (its kind paused): due again at
/// once for every instance. Only while the row has the `lease` the poll took: once it lapsed
/// and another instance leased the row, that instance holds it and nothing changes. SQLite
/// has no leases (one server a file): `None`. Returns whether a row changed.
pub(crate) fn release(
    tx: &dyn Session,
    id: i64,
    queued: i64,
    lease: Option<Lease>,
) -> Result<u64, StoreError> {
    match lease {
        None => tx.execute(
            "UPDATE outbox SET leased_until = NULL
             WHERE id = $1 AND status = 'pending' AND queued = $2 AND leased_until IS NULL",
            &[&id, &queued],
        ),
        // Whatever its `queued`: a row queued again while this instance held it (a repeated
        // key, migration 10) is released once the attempt that held it ended.
        Some(lease) => tx.execute(
            "UPDATE outbox SET leased_until = NULL
             WHERE id = $1 AND status = 'pending' AND queued >= $2
               AND leased_by = $3",
            &[&id, &queued, &lease.by],
        ),
    }
}

/// Puts row `id` back to pending with a fresh schedule. Returns whether a row changed.
pub(crate) fn retry(tx: &dyn Session, id: i64, now: i64) -> Result<bool, StoreError> {
    let changed = tx.execute(
        "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = $2,
             done_at = NULL, queued = queued + 1, leased_until = NULL
         WHERE id = $1 AND status = 'dead'",
        &[&id, &now],
    )?;
    Ok(changed == 1)
}

/// Puts every dead row back to pending with a fresh schedule. Returns how many.
pub(crate) fn retry_all_dead(tx: &dyn Session, now: i64) -> Result<u64, StoreError> {
    tx.execute(
        "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = $1, done_at = NULL,
             queued = queued + 1, leased_until = NULL
         WHERE status = 'dead'",
        &[&now],
    )
}

/// Puts the dead rows of `kind` back to pending with a fresh schedule. Returns how many.
///
/// `kind` as the listings show it (`listings::shown`), so that the count beside the button
/// and the rows it retries agree: on SQLite a row an effect queued with a BLOB `kind` is shown
/// as the text its bytes spell, or as `x'…'` when they are not printable.
pub(crate) fn retry_dead_of_kind(
    tx: &dyn Session,
    kind: &str,
    now: i64,
) -> Result<u64, StoreError> {
    let blob = match tx.dialect() {
        Dialect::Sqlite => " OR (typeof(kind) = 'blob' AND 'x''' || hex(kind) || '''' = $1)",
        // A TEXT column: only text.
        Dialect::Postgres => "",
    };
    tx.execute(
        &format!(
            "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = $2,
                 done_at = NULL, queued = queued + 1, leased_until = NULL
             WHERE status = 'dead' AND (CAST(kind AS TEXT) = $1{blob})"
        ),
        &[&kind, &now],
    )
}

/// Queues a new forward of a stored event of `source` (a replay), or puts its existing row
/// back to pending. Returns false if the event is not in the ledger or its payload is gone.
pub(crate) fn replay(
    tx: &dyn Session,
    source: &str,
    event_id: &str,
    now: i64,
) -> Result<bool, StoreError> {
    // The row refers to the event's payload (an old row's own copy is dropped).
    let stored = ledger::by_key(
        tx.dialect(),
        "$1, source, event_id, event_type, $5, 1, 'pending', $4, $4",
        "$2",
        "$3",
    );
    let changed = tx.execute(
        &format!(
            "INSERT INTO outbox
                 (kind, source, key, event_type, payload, payload_ref, status, next_attempt_at,
                  created_at)
             {stored} AND payload IS NOT NULL
             ON CONFLICT (kind, source, key) DO UPDATE SET
                 status = 'pending', attempts = 0, next_attempt_at = excluded.next_attempt_at,
                 done_at = NULL, payload = excluded.payload, payload_ref = 1,
                 queued = outbox.queued + 1, leased_until = NULL"
        ),
        &[&FORWARD, &source, &event_id, &now, &EMPTY],
    )?;
    Ok(changed == 1)
}
