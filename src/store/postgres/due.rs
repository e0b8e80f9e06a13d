//! Which outbox rows are due, on PostgreSQL, where several instances share the outbox.
//!
//! A worker takes due rows with `FOR UPDATE SKIP LOCKED` and leases them in the same
//! statement: `leased_until` (now + `[storage] outbox_lease`) and `leased_by` (the server
//! process of the worker's own connection), so two workers never take the same row. The poll
//! returns the leased rows without their payloads; the worker reads the payload of the row it
//! attempts by id, when it attempts it. The worker leases only as many rows as it has attempt
//! threads free; the read that starts an attempt renews the lease (a row may have waited for
//! its rate's turn), and so does the poller every second while the attempt runs (a command
//! may run longer than the lease), each only while this connection still holds the lease: a
//! row whose lease lapsed meanwhile and that another instance took is left to that instance.
//! The attempt's result, recorded through the writer, ends the lease. A leased row is due again for every instance when its lease lapses, or at
//! once when the connection that leased it is gone (its instance died or restarted: PostgreSQL
//! ends a connection's server process when the client's socket closes). Delivery stays at
//! least once.
//!
//! A kind's `concurrency` holds across the instances: a lane's poll takes a transaction-scoped
//! advisory lock on the kind, counts the kind's rows leased by live connections (an index of
//! the leased rows, migration 10) and leases at most what is left, in that transaction.

use std::sync::Mutex;
use std::time::Duration;

use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};

use crate::outbox::{Lease, PendingRow};
use crate::store::payload::OutboxPayload;
use crate::store::seam::{OutboxReader, Poll};

/// Rows leased at once, at most: the worker asks for as many as it has attempt threads free,
/// so a leased row starts at once; few, so a slow app does not keep many rows from the other
/// instances.
const LEASE_BATCH: usize = 8;

/// The outbox worker's connection (one: it is what holds the leases).
pub(crate) struct PgOutbox {
    config: postgres::Config,
    conn: Mutex<Option<Client>>,
    /// What names this worker's leases in SQL: `pg_backend_pid()`, or through a transaction
    /// pooler the worker's token (a negative literal).
    by: String,
    lease: Duration,
    /// Reads the payloads that forward rows refer to (`store::payload::event_payload`).
    events: super::ReadPool,
}

impl PgOutbox {
    pub(crate) fn open(
        url: &str,
        lease: Duration,
        busy_timeout: Duration,
    ) -> anyhow::Result<PgOutbox> {
        // Checked by config validation at start-up; parsed again for the synchronous client.
        let parsed = crate::config::parse_postgres(url)?;
        let by = match parsed.pooler {
            false => "pg_backend_pid()".to_string(),
            true => (-i64::from(fastrand::i32(1..i32::MAX))).to_string(),
        };
        Ok(PgOutbox {
            config: parsed.config.into(),
            conn: Mutex::new(None),
            by,
            lease,
            events: super::read_pool(url, busy_timeout, 1)?,
        })
    }

    /// Runs `f` on the connection, connecting first if there is none; a broken connection is
    /// dropped, and the next call connects again.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>,
    ) -> anyhow::Result<T> {
        let mut conn = self
            .conn
            .lock()
            .map_err(|_| anyhow::anyhow!("outbox lock poisoned"))?;
        if conn.as_ref().is_none_or(Client::is_closed) {
            *conn = Some(self.config.connect(NoTls)?);
        }
        let client = conn.as_mut().expect("connected above");
        let result = f(client);
        if client.is_closed() {
            *conn = None;
        }
        Ok(result?)
    }
}

/// A leased row is free again when its lease lapsed or its leaseholder's connection is gone.
const FREE: &str = "(leased_until IS NULL OR leased_until <= $1
      OR leased_by IS NULL OR (leased_by > 0 AND leased_by NOT IN (SELECT pid FROM pg_stat_activity)))";

impl OutboxReader for PgOutbox {
    fn due(&self, poll: &Poll<'_>) -> anyhow::Result<Vec<PendingRow>> {
        let Poll {
            kinds,
            now,
            limit,
            in_flight,
            concurrency,
        } = *poll;
        let leased_until = now + self.lease.as_secs() as i64;
        let limit = limit.min(LEASE_BATCH) as i64;
        let Some(concurrency) = concurrency else {
            return self.lease_due(kinds, now, limit, in_flight, leased_until);
        };
        // The kind's concurrency across the cluster: under a lock on the lane (transaction-
        // scoped: a transaction pooler allows it), taken by every instance's poll of the kind,
        // the rows live instances hold leased are counted (this one's in flight among them)
        // and only what is left of `concurrency` is leased, in the same transaction. The count
        // is read after the lock, so it sees the leases another instance committed before.
        let mut rows = self
            .with(|c| {
                let mut tx = c.transaction()?;
                tx.execute_typed(
                    "SELECT pg_advisory_xact_lock(hashtextextended('hookledger lane ' || $1, 0))",
                    &[(&kinds, Type::TEXT)],
                )?;
                let held: i64 = tx
                    .query_typed_one(
                        &format!(
                            "SELECT count(*) FROM outbox
                         WHERE status = 'pending' AND leased_until IS NOT NULL AND NOT {FREE}
                           AND kind IN (SELECT jsonb_array_elements_text($2::text::jsonb))"
                        ),
                        &[(&now, Type::INT8), (&kinds, Type::TEXT)],
                    )?
                    .get(0);
                let room = (concurrency as i64).saturating_sub(held).clamp(0, limit);
                let rows = if room == 0 {
                    Vec::new()
                } else {
                    tx.query_typed(
                        &lease_sql(&self.by),
                        &lease_params(&now, &room, &kinds, &leased_until, &in_flight),
                    )?
                };
                tx.commit()?;
                Ok(rows)
            })?
            .iter()
            .map(pending_row)
            .collect::<Vec<_>>();
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }

    /// Read by id on the connection that holds the lease, as the attempt starts: the lease is
    /// renewed from `now` (a row may have waited for its rate's turn), on this connection,
    /// only while the row is still leased by the connection its poll ran on.
    fn payload(&self, row: &PendingRow, now: i64) -> anyhow::Result<Option<Vec<u8>>> {
        let Some(lease) = row.lease else {
            return Ok(None); // never leased: not this instance's to attempt
        };
        let renewed = now + self.lease.as_secs() as i64;
        let found = self.with(|c| {
            c.query_typed_opt(
                &format!(
                    "UPDATE outbox SET leased_until = $4, leased_by = {}
                     WHERE id = $1 AND status = 'pending' AND queued = $2 AND leased_by = $3
                     RETURNING payload, payload_ref, source, key",
                    self.by
                ),
                &[
                    (&row.id, Type::INT8),
                    (&row.queued, Type::INT8),
                    (&lease.by, Type::INT4),
                    (&renewed, Type::INT8),
                ],
            )
        })?;
        let Some(found) = found else { return Ok(None) };
        let own = OutboxPayload {
            payload: found.get(0),
            refers: found.get::<_, Option<i16>>(1) == Some(1),
            source: found.get(2),
            key: found.get(3),
        };
        if !own.refers {
            return Ok(Some(own.payload));
        }
        Ok(Some(own.payload(&*self.events.get()?)?))
    }

    /// Once a second at most (the lease is in whole seconds), on the connection that holds
    /// the leases.
    fn renew(&self, in_flight: &[i64], now: i64) -> anyhow::Result<u64> {
        let until = now + self.lease.as_secs() as i64;
        self.with(|c| {
            c.execute_typed(
                &format!(
                    "UPDATE outbox SET leased_until = $2
                     WHERE id = ANY($1) AND status = 'pending' AND leased_by = {}
                       AND leased_until < $2",
                    self.by
                ),
                &[(&in_flight, Type::INT8_ARRAY), (&until, Type::INT8)],
            )
        })
    }

    fn turn(&self, kind: &str, spacing: Duration) -> anyhow::Result<Option<Duration>> {
        // The database server's clock, so that the instances' clocks play no part.
        let wait: f64 = self.with(|c| {
            c.query_typed_one(
                "INSERT INTO hookledger_lane_turns AS t (kind, next_at)
                 VALUES ($1, date_part('epoch', clock_timestamp()) + $2)
                 ON CONFLICT (kind) DO UPDATE
                   SET next_at = greatest(t.next_at, date_part('epoch', clock_timestamp())) + $2
                 RETURNING next_at - $2 - date_part('epoch', clock_timestamp())",
                &[(&kind, Type::TEXT), (&spacing.as_secs_f64(), Type::FLOAT8)],
            )
            .map(|r| r.get(0))
        })?;
        Ok(Some(Duration::from_secs_f64(wait.max(0.0))))
    }

    fn next_due_at(&self, kinds: &str) -> anyhow::Result<Option<i64>> {
        // A row leased by a live instance is due again when its lease lapses.
        let now = crate::time::unix_now();
        let sql = format!(
            "SELECT min(CASE WHEN {FREE} THEN next_attempt_at
                             ELSE greatest(next_attempt_at, leased_until) END)
             FROM outbox
             WHERE status = 'pending'
               AND kind IN (SELECT jsonb_array_elements_text($2::text::jsonb))"
        );
        self.with(|c| {
            c.query_typed_one(&sql, &[(&now, Type::INT8), (&kinds, Type::TEXT)])
                .map(|r| r.get(0))
        })
    }
}

impl PgOutbox {
    /// Leases up to `limit` due rows of `kinds`, without a bound across instances.
    fn lease_due(
        &self,
        kinds: &str,
        now: i64,
        limit: i64,
        in_flight: &[i64],
        leased_until: i64,
    ) -> anyhow::Result<Vec<PendingRow>> {
        let mut rows: Vec<PendingRow> = self
            .with(|c| {
                c.query_typed(
                    &lease_sql(&self.by),
                    &lease_params(&now, &limit, &kinds, &leased_until, &in_flight),
                )
            })?
            .iter()
            .map(pending_row)
            .collect();
        rows.sort_by_key(|r| r.id);
        Ok(rows)
    }
}

/// Leases rows for `by` (see [`PgOutbox::by`]): `$1` now, `$2` at most so many, `$3` the kinds
/// (a JSON array), `$4` the lease's end, `$5` the ids in flight here.
fn lease_sql(by: &str) -> String {
    // A row in flight here whose lease lapsed is not taken again by its own instance.
    format!(
        "UPDATE outbox SET leased_until = $4, leased_by = {by}
             WHERE id IN (
                 SELECT id FROM outbox
                 WHERE status = 'pending' AND next_attempt_at <= $1 AND {FREE}
                   AND kind IN (SELECT jsonb_array_elements_text($3::text::jsonb))
                   AND id <> ALL($5)
                 ORDER BY id LIMIT $2
                 FOR UPDATE SKIP LOCKED)
             RETURNING id, kind, source, key, event_type, attempts, queued, leased_by"
    )
}

/// `lease_sql`'s parameters with their types.
fn lease_params<'p>(
    now: &'p i64,
    limit: &'p i64,
    kinds: &'p &str,
    leased_until: &'p i64,
    in_flight: &'p &[i64],
) -> [(&'p (dyn ToSql + Sync), Type); 5] {
    [
        (now, Type::INT8),
        (limit, Type::INT8),
        (kinds, Type::TEXT),
        (leased_until, Type::INT8),
        (in_flight, Type::INT8_ARRAY),
    ]
}

/// A row `lease_sql` returned.
fn pending_row(r: &postgres::Row) -> PendingRow {
    PendingRow {
        id: r.get(0),
        kind: r.get(1),
        source: r.get(2),
        key: r.get(3),
        event_type: r.get(4),
        attempts: r.get(5),
        queued: r.get(6),
        lease: Some(Lease { by: r.get(7) }),
    }
}
