//! Retention's SQL: deletes in small batches, each a job of the writer, and on SQLite gives
//! the pages they free back to the file system.
//!
//! A batch is sized by time as well as by rows: it deletes in chunks of [`CHUNK_ROWS`] and
//! stops after [`BATCH_TIME`] (or [`BATCH_ROWS`]). The cost of a row varies a hundredfold —
//! a time-ordered id deletes from the last index page it touched, a random one (a UUID)
//! dirties a page of the key index of its own, and a page not in memory is a read from the
//! disk — and a request that arrives while a batch runs waits for it: a bound in rows alone
//! would be 1 ms on one ledger and 100 on another.
//!
//! On SQLite a row is found by its rowid (the subquery reads the age index, which holds it),
//! not by `(source, event_id)`: no second lookup in the key index per row. PostgreSQL has no
//! rowid and finds each row by its key.

use std::time::{Duration, Instant};

use crate::sql::{Dialect, Session, StoreError};

/// Most rows one batch deletes (or clears): a bound on the transaction's size whatever the
/// clock says.
pub(crate) const BATCH_ROWS: i64 = 500;

/// Rows per statement of a batch: the batch looks at the clock after each, so a batch is at
/// least one chunk. Small enough that one chunk of random-id rows (a page of the key index
/// each) stays within [`BATCH_TIME`] when the pages are in memory: with 32, batches meant to
/// stop at 0.5 ms took 1.07 ms at the median (`hookledger-bench prune`).
pub(crate) const CHUNK_ROWS: i64 = 8;

/// The writer's time per batch: the batch stops after the chunk that passes it. A request
/// arriving meanwhile waits about this much more; the retention thread rests between
/// batches (`retention::Pace`), so most requests find the writer idle. Pruning 1 M random-id
/// claims under 500 events/s (`hookledger-bench prune`, one round each, chunks of 32 rows):
/// p99 7.8 ms with 2 ms batches, 6.4 with 0.5 ms (4.7 without a prune).
pub(crate) const BATCH_TIME: Duration = Duration::from_micros(500);

/// Most free pages given back per batch on SQLite (`PRAGMA incremental_vacuum`), in chunks
/// of [`CHUNK_ROWS`] pages and within [`BATCH_TIME`] like the rows: each page given back moves
/// the file's last page into a free slot (the page, its parent and the pointer map written).
pub(crate) const RECLAIM_PAGES: i64 = 512;

/// Runs `chunk(n)` (asking for up to [`CHUNK_ROWS`] at a time) until a chunk comes back
/// short, `most` are done, or `out_of_time` says so (after each chunk); returns the total done.
fn in_chunks(
    most: i64,
    mut out_of_time: impl FnMut() -> bool,
    mut chunk: impl FnMut(i64) -> Result<u64, StoreError>,
) -> Result<u64, StoreError> {
    let mut total: u64 = 0;
    loop {
        let want = CHUNK_ROWS.min(most - total as i64);
        let n = chunk(want)?;
        total += n;
        if n < want as u64 || total >= most as u64 || out_of_time() {
            return Ok(total);
        }
    }
}

/// Out of time once [`BATCH_TIME`] has passed since it was made.
fn batch_clock() -> impl FnMut() -> bool {
    let started = Instant::now();
    move || started.elapsed() >= BATCH_TIME
}

/// How a batch names the ledger rows it picked: by the key on PostgreSQL, by `id` (the
/// rowid) on SQLite, where `(source, event_id)` alone is no index (the key index is by block
/// first) and the age index holds the rowid: no second lookup per row.
fn ledger_row(tx: &dyn Session) -> (&'static str, &'static str) {
    match tx.dialect() {
        Dialect::Postgres => ("(source, event_id)", "source, event_id"),
        Dialect::Sqlite => ("id", "id"),
    }
}

/// A ledger row whose payload an outbox row still needs: a `forward` row that refers to it
/// (`payload_ref`) and is not delivered yet (pending, leased, or dead and waiting for `outbox
/// retry`). Retention keeps such a row's payload, and so the row, until it is delivered or
/// deleted: the body must still arrive byte for byte.
const NEEDED: &str = "EXISTS (SELECT 1 FROM outbox
                        WHERE outbox.kind = 'forward' AND outbox.source = webhook_events.source
                          AND outbox.key = webhook_events.event_id AND outbox.payload_ref = 1
                          AND outbox.status IN ('pending', 'dead'))";

/// Deletes a batch of ledger rows received before `cutoff` (see the module doc for its size),
/// but for those whose payload an outbox row still needs.
pub(crate) fn delete_events_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    let (row, columns) = ledger_row(tx);
    let sql = format!(
        "DELETE FROM webhook_events WHERE {row} IN
             (SELECT {columns} FROM webhook_events
              WHERE received_at < $1 AND NOT {NEEDED} LIMIT $2)"
    );
    let claims = in_chunks(BATCH_ROWS, batch_clock(), |rows| {
        tx.execute(&sql, &[&cutoff, &rows])
    })?;
    // The signatures' single-use tokens go with the claims they were used with: a token only
    // matters within its signature's tolerance, long past by then.
    let tokens = tx.execute(
        "DELETE FROM hookledger_signature_tokens WHERE (source, token) IN
             (SELECT source, token FROM hookledger_signature_tokens WHERE seen_at < $1 LIMIT $2)",
        &[&cutoff, &BATCH_ROWS],
    )?;
    Ok(claims + tokens)
}

/// Clears the payloads of a batch of ledger rows received before `cutoff`, but for those an
/// outbox row still needs; the claims stay.
pub(crate) fn clear_payloads_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    let (row, columns) = ledger_row(tx);
    let sql = format!(
        "UPDATE webhook_events SET payload = NULL, payload_codec = NULL, payload_dict = NULL
         WHERE {row} IN
             (SELECT {columns} FROM webhook_events
              WHERE received_at < $1 AND payload IS NOT NULL AND NOT {NEEDED} LIMIT $2)"
    );
    in_chunks(BATCH_ROWS, batch_clock(), |rows| {
        tx.execute(&sql, &[&cutoff, &rows])
    })
}

/// Deletes a batch of outbox rows delivered (or superseded) before `cutoff`.
pub(crate) fn delete_outbox_batch(tx: &dyn Session, cutoff: i64) -> Result<u64, StoreError> {
    in_chunks(BATCH_ROWS, batch_clock(), |rows| {
        tx.execute(
            "DELETE FROM outbox WHERE id IN
                 (SELECT id FROM outbox WHERE status IN ('done', 'superseded') AND done_at < $1
                      LIMIT $2)",
            &[&cutoff, &rows],
        )
    })
}

/// Gives a batch of free pages of a SQLite file back to the file system (at most
/// [`RECLAIM_PAGES`]); the pages given back. A file made before `auto_vacuum` was set gives
/// none back (the pragma does nothing until `hookledger vacuum` converts it). PostgreSQL's
/// own vacuum does this: nothing to do.
pub(crate) fn reclaim_batch(tx: &dyn Session) -> Result<u64, StoreError> {
    if !matches!(tx.dialect(), Dialect::Sqlite) {
        return Ok(0);
    }
    let pragma = |sql: &str| -> Result<i64, StoreError> {
        match tx.query(sql, &[])?.first() {
            Some(row) => row.get::<i64>(0),
            None => Ok(0),
        }
    };
    // A file without auto_vacuum keeps its free pages: "none given back" ends the loop.
    if pragma("PRAGMA auto_vacuum")? != 2 {
        return Ok(0);
    }
    let mut free = pragma("PRAGMA freelist_count")?;
    in_chunks(RECLAIM_PAGES, batch_clock(), |pages| {
        if free == 0 {
            return Ok(0);
        }
        // A query, stepped to its end: executed once, it gives back only the first page.
        tx.query(&format!("PRAGMA incremental_vacuum({pages})"), &[])?;
        let left = pragma("PRAGMA freelist_count")?;
        let given = free.saturating_sub(left);
        free = left;
        Ok(given as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `in_chunks` asks for, chunk by chunk, when each chunk finds `found(asked)` rows
    /// and the clock runs out after `chunks_in_time` chunks.
    fn asked(chunks_in_time: usize, found: impl Fn(i64) -> u64) -> (Vec<i64>, u64) {
        let mut asked = Vec::new();
        let mut ticks = 0;
        let total = in_chunks(
            BATCH_ROWS,
            || {
                ticks += 1;
                ticks >= chunks_in_time
            },
            |rows| {
                asked.push(rows);
                Ok(found(rows))
            },
        )
        .unwrap();
        (asked, total)
    }

    #[test]
    fn a_batch_is_chunks_until_its_rows_or_its_time_or_the_rows_run_out() {
        // Time enough: BATCH_ROWS in chunks, the last one what is left of them.
        let (chunks, total) = asked(usize::MAX, |rows| rows as u64);
        assert_eq!(total, BATCH_ROWS as u64);
        assert!(chunks[..chunks.len() - 1].iter().all(|&n| n == CHUNK_ROWS));
        assert_eq!(chunks.iter().sum::<i64>(), BATCH_ROWS);
        // The clock runs out after the second chunk.
        assert_eq!(
            asked(2, |rows| rows as u64),
            (vec![CHUNK_ROWS; 2], 2 * CHUNK_ROWS as u64)
        );
        // A short chunk is the last: nothing more to prune.
        assert_eq!(asked(usize::MAX, |_| 5), (vec![CHUNK_ROWS], 5));
        assert_eq!(asked(usize::MAX, |_| 0), (vec![CHUNK_ROWS], 0));
    }
}
