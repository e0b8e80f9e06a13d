//! Which outbox rows are due, on PostgreSQL, where several instances share the outbox: a
//! worker takes due rows with `FOR UPDATE SKIP LOCKED` and leases them (`leased_until`) in one
//! statement, so two workers never take the same row; the attempt's result (recorded through
//! the writer) ends the lease. If the instance dies mid-attempt, the row is due again for
//! every instance once its lease lapses: delivery stays at least once.

use std::time::Duration;

use anyhow::Context;
use postgres::NoTls;
use r2d2_postgres::PostgresConnectionManager;

use crate::outbox::PendingRow;
use crate::store::OutboxReader;

/// Rows leased at once: few, so that one lease covers their attempts (each bounded by the
/// forward timeout) and a slow app does not keep many rows from the other instances.
const LEASE_BATCH: usize = 8;

/// The outbox worker's connections.
pub(crate) struct PgOutbox {
    pool: r2d2::Pool<PostgresConnectionManager<NoTls>>,
    lease: Duration,
}

impl PgOutbox {
    pub(crate) fn open(url: &str, lease: Duration) -> anyhow::Result<PgOutbox> {
        let config = super::parse(url)?;
        let pool = r2d2::Pool::builder()
            .max_size(2)
            .build(PostgresConnectionManager::new(config, NoTls))
            .context("cannot open the outbox worker's PostgreSQL connections")?;
        Ok(PgOutbox { pool, lease })
    }
}

impl OutboxReader for PgOutbox {
    fn due(&self, kinds: &str, now: i64, limit: usize) -> anyhow::Result<Vec<PendingRow>> {
        let leased_until = now + self.lease.as_secs() as i64;
        let mut rows: Vec<PendingRow> = self
            .pool
            .get()?
            .query(
                "UPDATE outbox SET leased_until = $4
                 WHERE id IN (
                     SELECT id FROM outbox
                     WHERE status = 'pending' AND next_attempt_at <= $1
                       AND (leased_until IS NULL OR leased_until <= $1)
                       AND kind IN (SELECT jsonb_array_elements_text($3::text::jsonb))
                     ORDER BY id LIMIT $2
                     FOR UPDATE SKIP LOCKED)
                 RETURNING id, kind, source, key, event_type, payload, attempts, queued",
                &[
                    &now,
                    &(limit.min(LEASE_BATCH) as i64),
                    &kinds,
                    &leased_until,
                ],
            )?
            .iter()
            .map(|r| PendingRow {
                id: r.get(0),
                kind: r.get(1),
                source: r.get(2),
                key: r.get(3),
                event_type: r.get(4),
                payload: r.get(5),
                attempts: r.get(6),
                queued: r.get(7),
            })
            .collect();
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }

    fn next_due_at(&self, kinds: &str) -> anyhow::Result<Option<i64>> {
        // A row leased by another instance is due again when its lease lapses.
        Ok(self
            .pool
            .get()?
            .query_one(
                "SELECT min(greatest(next_attempt_at, coalesce(leased_until, 0))) FROM outbox
             WHERE status = 'pending'
               AND kind IN (SELECT jsonb_array_elements_text($1::text::jsonb))",
                &[&kinds],
            )?
            .get(0))
    }
}
